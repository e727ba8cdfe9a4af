#!/usr/bin/env bash
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer: a separate
# build of lucid-amp, its tests and examples (gcc, -O1 -g -fsanitize=address,undefined),
# then all of ctest. LibTorch itself is Debian's build and is not instrumented; ASan
# still checks every access our code makes and every allocation LibTorch makes through
# malloc/new. CI runs this after scripts/test.sh (.ci/run).
#
# Runtime options (docs/RELIABILITY.md says why each is needed):
#   ASAN_OPTIONS  detect_leaks=0: LibTorch keeps process-lifetime allocations (operator
#                 registries, the JIT's type tables, thread pools) that LeakSanitizer
#                 reports at exit; leaks are checked by the valgrind run instead.
#   UBSAN_OPTIONS halt_on_error=1, and -fno-sanitize-recover: any UB report fails the test.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_SANITIZE_BUILD_DIR:-$root/build-sanitize}

# The same packages as scripts/setup.sh (gcc's libasan/libubsan come with g++).
packages=(cmake g++ make libtorch-dev libgtest-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
echo "== configuring the sanitizer build in $build_dir"
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="$flags" \
  -DLUCID_AMP_BUILD_TESTS=ON -DLUCID_AMP_BUILD_EXAMPLES=ON -DLUCID_AMP_DISCOVER_TESTS=OFF "$@"
echo "== building (ASan + UBSan)"
cmake --build "$build_dir" -j "$(nproc)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
echo "== running the tests under ASan + UBSan (ASAN_OPTIONS=$ASAN_OPTIONS)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 1200
