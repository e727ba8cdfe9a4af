#!/usr/bin/env bash
# Everything run.sh does, then the whole test suite through ctest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
"$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=ON "$@"
echo "== running the seed example"
"$build_dir/examples/seed_example"
echo "== running the tests"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)"
