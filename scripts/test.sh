#!/usr/bin/env bash
# Everything run.sh does (install, build, the main job), then the whole build and the
# whole test suite through ctest. Each test executable is one ctest entry here (its
# GoogleTest cases run inside it): starting LibTorch once per case would add minutes on
# 2 cores. Configure with -DLUCID_AMP_DISCOVER_TESTS=ON for one ctest entry per case.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
"$root/scripts/run.sh"
"$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=ON -DLUCID_AMP_DISCOVER_TESTS=OFF "$@"
echo "== running the seed example"
"$build_dir/examples/seed_example"
echo "== running the tests"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
