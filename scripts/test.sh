#!/usr/bin/env bash
# Everything run.sh does (install, build, the main job), then the whole build and the
# whole test suite through ctest. Each test executable is one ctest entry here (its
# GoogleTest cases run inside it): starting LibTorch once per case would add minutes on
# 2 cores. Configure with -DLUCID_AMP_DISCOVER_TESTS=ON for one ctest entry per case.
# Then the style checks (scripts/lint.sh: clang-format, clang-tidy) and the API reference
# (Doxygen, a warning fails it; scripts/check_docs.py). Last, the same suite again under
# AddressSanitizer and UndefinedBehaviorSanitizer (scripts/sanitize.sh, its own build in
# build-sanitize: about 9 minutes on the 2-core CI machine). LUCID_AMP_SANITIZE=0 leaves
# that stage out (a quick local run). Each stage prints how long it took.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
stage_start=$SECONDS
stage_done() {  # stage_done NAME: prints the stage's wall time
  echo "== $1 took $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}
"$root/scripts/run.sh"
stage_done "the main job (run.sh)"
"$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=ON -DLUCID_AMP_DISCOVER_TESTS=OFF "$@"
stage_done "configure and build"
echo "== running the reference example"
"$build_dir/examples/seed_example"
echo "== running the tests"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
stage_done "the tests (ctest)"
echo "== style checks (scripts/lint.sh)"
"$root/scripts/lint.sh"
stage_done "style checks"
echo "== API reference (Doxygen; a warning fails it)"
cmake --build "$build_dir" --target docs
python3 "$root/scripts/check_docs.py" "$build_dir/docs/xml"
stage_done "API reference"
if [ "${LUCID_AMP_SANITIZE:-1}" != 0 ]; then
  echo "== the whole suite again under ASan + UBSan"
  "$root/scripts/sanitize.sh"
  stage_done "ASan + UBSan"
fi
