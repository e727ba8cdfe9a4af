#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Builds the libFuzzer target fuzz/fuzz_state_load.cpp with clang (-fsanitize=fuzzer,
# address,undefined, on lucid-amp's own code; LibTorch is the .venv's wheel, not
# instrumented) and runs it for a bounded time, starting from the committed corpus
# fuzz/corpus. New interesting inputs go to $build_dir/corpus-new (not committed).
#
#   scripts/fuzz.sh [seconds]        # default 60 (LUCID_FUZZ_SECONDS)
#   scripts/fuzz.sh --merge          # fold corpus-new into fuzz/corpus, minimised
#
# Exit status: 0 when the run ended by time with no crash, property violation or
# sanitizer report; otherwise libFuzzer's (the crashing input is saved in $build_dir).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${LUCID_FUZZ_SECONDS:-60}
merge=0
case "${1:-}" in
  --merge) merge=1 ;;
  "") ;;
  *) seconds=$1 ;;
esac

# Debian's default clang with its runtime libraries (libFuzzer, ASan, UBSan live in
# libclang-rt-dev, which pulls the versioned package of that clang: 14 on Debian 12),
# zlib for the inflate differential check.
packages=(cmake make ninja-build clang libclang-rt-dev zlib1g-dev)
# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages "${packages[@]}"
# shellcheck source=lib/venv.sh
source "$root/scripts/lib/venv.sh"
ensure_venv

flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
# vptr checks compare type info across the uninstrumented LibTorch; off to avoid noise.
flags+=" -fno-sanitize=vptr -fno-omit-frame-pointer -g"
echo "== configuring the fuzz build in $build_dir (clang++)"
# The log stays inside the (git-ignored) build folder.
mkdir -p "$build_dir"
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DTorch_DIR="$LUCID_AMP_TORCH_DIR" \
  -DCMAKE_CXX_FLAGS="$flags" -DLUCID_AMP_BUILD_TESTS=OFF -DLUCID_AMP_BUILD_EXAMPLES=OFF \
  -DLUCID_AMP_BUILD_FUZZERS=ON >"$build_dir/configure.log" 2>&1 || { cat "$build_dir/configure.log"; exit 1; }
echo "== building fuzz_state_load"
cmake --build "$build_dir" -j "$(nproc)" --target fuzz_state_load
fuzzer=$build_dir/fuzz/fuzz_state_load

# LibTorch keeps process-lifetime allocations (type registries, the JIT's caches) that
# LeakSanitizer would report; leaks are checked by the valgrind run (docs/RELIABILITY.md).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$build_dir/corpus-new" "$root/fuzz/corpus"
if [ -z "$(ls -A "$root/fuzz/corpus")" ]; then
  echo "== writing the starting corpus into fuzz/corpus"
  LUCID_FUZZ_WRITE_CORPUS="$root/fuzz/corpus" "$fuzzer" || true
fi

if ((merge)); then
  echo "== merging corpus-new into fuzz/corpus (minimised)"
  "$fuzzer" -merge=1 -detect_leaks=0 "$root/fuzz/corpus" "$build_dir/corpus-new"
  exit 0
fi

echo "== fuzzing for ${seconds}s"
cd "$build_dir"
set +e
"$fuzzer" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -detect_leaks=0 \
  -print_final_stats=1 "$build_dir/corpus-new" "$root/fuzz/corpus" >"$build_dir/fuzz.log" 2>&1
rc=$?
set -e
grep -vE "NEW_FUNC|^#[0-9]+ +(NEW|REDUCE)" "$build_dir/fuzz.log" | tail -40
echo "== fuzz_state_load exit status $rc: $(grep -E 'stat::number_of_executed_units' "$build_dir/fuzz.log" || echo 'no stats')"
exit "$rc"
