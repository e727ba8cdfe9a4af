#!/usr/bin/env bash
# Test executables under valgrind's memcheck (invalid reads and writes, uninitialised
# values, definite leaks), on the normal build in ./build (scripts/test.sh makes it).
# Any error fails the run; scripts/valgrind.supp holds the one known report from a
# library below LibTorch. docs/RELIABILITY.md records the last run.
#
#   scripts/valgrind.sh [test_executable ...]   # default: the core API, checkpoint and
#                                               # kernel tests
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages valgrind
tests=("$@")
((${#tests[@]})) || tests=(test_grad_scaler_api test_serialize test_unscale_kernels)
status=0
for t in "${tests[@]}"; do
  echo "== valgrind: $t"
  valgrind --tool=memcheck --error-exitcode=1 --leak-check=full --show-leak-kinds=definite \
    --errors-for-leak-kinds=definite --num-callers=30 --suppressions="$root/scripts/valgrind.supp" \
    "$build_dir/tests/$t" >"$build_dir/valgrind_$t.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED)|ERROR SUMMARY|definitely lost" "$build_dir/valgrind_$t.log"
done
exit "$status"
