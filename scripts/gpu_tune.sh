#!/usr/bin/env bash
# GPU machine: build the scaler benchmark only and time every launch-shape variant of
# the unscale kernel (LUCID_AMP_UNSCALE_VARIANT), against a copy of the same bytes.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
cmake -S . -B build-tune -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  -DLUCID_AMP_BUILD_TESTS=OFF -DLUCID_AMP_BUILD_EXAMPLES=OFF -DLUCID_AMP_BUILD_BENCHMARKS=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-tune -j 16 --target bench_scaler_step >"$OUT/build.log" 2>&1 || { grep -E "error" -A3 "$OUT/build.log" | head -40; exit 1; }
for v in 0 1 2 3 4 5 6 7; do
  echo "== variant $v"
  LUCID_BENCH_UNSCALE_ONLY=1 LUCID_AMP_UNSCALE_VARIANT=$v build-tune/benchmarks/bench_scaler_step 116 12 1285 24 2>&1 | grep -E "unscale lucid|read-only"
done | tee "$OUT/tune.log"
