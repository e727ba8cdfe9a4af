#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Test executables under valgrind's memcheck (invalid reads and writes, uninitialised
# values, definite leaks), on the normal build in ./build (scripts/test.sh makes it).
# Any error fails the run; scripts/valgrind.supp holds the one known report from a
# library below LibTorch. docs/RELIABILITY.md records the last run.
#
#   scripts/valgrind.sh [test_executable ...]   # default: the core API, checkpoint and
#                                               # kernel tests
#   scripts/valgrind.sh --all                   # every test executable and the reference
#                                               # example (children too), one by one
# Under --all the property test runs LUCID_PROPERTY_SEQUENCES=300 (default 3000): valgrind
# makes it about 50 times slower.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages valgrind
programs=()
if [ "${1:-}" = --all ]; then
  export LUCID_PROPERTY_SEQUENCES=${LUCID_PROPERTY_SEQUENCES:-300}
  mapfile -t programs < <(find "$build_dir/tests" -type f -perm -u+x -name 'test_*' | sort)
  programs+=("$build_dir/examples/reference_example")
else
  tests=("$@")
  ((${#tests[@]})) || tests=(test_grad_scaler_api test_serialize test_unscale_kernels)
  for t in "${tests[@]}"; do programs+=("$build_dir/tests/$t"); done
fi
status=0
for program in "${programs[@]}"; do
  name=$(basename "$program")
  echo "== valgrind: $name"
  # Children too: the distributed tests start their ranks with fork + exec.
  valgrind --tool=memcheck --trace-children=yes --error-exitcode=1 --leak-check=full \
    --show-leak-kinds=definite --errors-for-leak-kinds=definite --num-callers=30 \
    --suppressions="$root/scripts/valgrind.supp" "$program" >"$build_dir/valgrind_$name.log" 2>&1 ||
    status=1
  grep -E "^\[  (PASSED|FAILED)|ERROR SUMMARY|definitely lost" "$build_dir/valgrind_$name.log" | sort | uniq -c
done
exit "$status"
