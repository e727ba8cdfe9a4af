#!/usr/bin/env bash
# Everything run.sh does (install, build, the main job), then the whole build and the
# whole test suite through ctest. Each test executable is one ctest entry here (its
# GoogleTest cases run inside it): starting LibTorch once per case would add minutes on
# 2 cores. Configure with -DLUCID_AMP_DISCOVER_TESTS=ON for one ctest entry per case.
# Then the Python package (scripts/python_test.sh): built in place against Debian's
# python3-torch, linking the library just built, and its pytest suite (tests/python).
# Last, the same suite again under AddressSanitizer and UndefinedBehaviorSanitizer
# (scripts/sanitize.sh, its own build in build-sanitize: about 9 minutes on the 2-core CI
# machine). LUCID_AMP_SANITIZE=0 leaves that stage out (a quick local run).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
"$root/scripts/run.sh"
"$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=ON -DLUCID_AMP_DISCOVER_TESTS=OFF "$@"
echo "== running the reference example"
"$build_dir/examples/reference_example"
echo "== running the tests"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
echo "== the Python package: build in place and pytest"
if [ -f "$build_dir/liblucid_amp.a" ]; then
  LUCID_AMP_PREBUILT_LIBRARY="$build_dir/liblucid_amp.a" "$root/scripts/python_test.sh"
else
  "$root/scripts/python_test.sh"  # a shared build: the package compiles the sources itself
fi
if [ "${LUCID_AMP_SANITIZE:-1}" != 0 ]; then
  echo "== the whole suite again under ASan + UBSan"
  "$root/scripts/sanitize.sh"
fi
