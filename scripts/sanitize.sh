#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer: a separate
# build of lucid-amp, its tests and examples (gcc, -O0 -g1 -fsanitize=address,undefined),
# then all of ctest but the packaging tests (label `packaging`: they build the library
# again in outside projects, to test CMake, not code). LibTorch itself is the .venv's wheel
# and is not instrumented; ASan still checks every access our code makes and every
# allocation LibTorch makes through malloc/new. scripts/test.sh (CI's test command) runs
# this as its last stage.
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
packages=(cmake g++ make ninja-build libgtest-dev)
# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages "${packages[@]}"
# shellcheck source=lib/venv.sh
source "$root/scripts/lib/venv.sh"
ensure_venv

# -O0 -g1 (line tables only): a third of the compile time of -O1 -g on the 2-core CI
# machine, where every source includes LibTorch; reports still name file and line.
flags="-O0 -g1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
# The trainer and the language model (apps/) are left to the plain stage: trained for real
# under -O0 and the sanitizers they would take most of CI's time.
echo "== configuring the sanitizer build in $build_dir"
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS="$flags" \
  -DTorch_DIR="$LUCID_AMP_TORCH_DIR" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
  -DLUCID_AMP_BUILD_TESTS=ON -DLUCID_AMP_BUILD_EXAMPLES=ON -DLUCID_AMP_DISCOVER_TESTS=OFF \
  -DLUCID_AMP_BUILD_TRAINER=OFF "$@"
echo "== building (ASan + UBSan)"
cmake --build "$build_dir" -j "$(nproc)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The schedule's comparison with Megatron-LM's and DeepSpeed's rules runs its full 10,000
# sequences per backend in the plain stage; here, where the code is unoptimised and
# instrumented, 500 exercise the same paths.
export LUCID_TRUST_SEQUENCES=${LUCID_TRUST_SEQUENCES:-500}
echo "== running the tests under ASan + UBSan (ASAN_OPTIONS=$ASAN_OPTIONS)"
# The packaging tests (an installed package, add_subdirectory, FetchContent, a library-only
# configure, the core's includes) build or read consumer projects, not our code under the
# sanitizers; the plain stage runs them.
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" --timeout 1200 \
  -E '^(install_and_find_package|subproject_.*|configure_library_only|core_knows_no_optimizer)$' -LE packaging
