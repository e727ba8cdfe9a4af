#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# On the GPU machine (device tool): build against the machine's PyTorch LibTorch (CUDA),
# run the whole suite, the reference example and the CUDA unscale benchmark. Logs go to
# $OUT. GoogleTest, zlib's headers and CLI11 are not installed there: run
# scripts/vendor_gpu_deps.sh on a Debian machine first and carry .vendor.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# shellcheck source=lib/gpu_configure.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/gpu_configure.sh"
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"
configure_gpu_build build-gpu "$OUT/configure.log" -DLUCID_AMP_BUILD_BENCHMARKS=ON || exit 1
grep "lucid_amp:" "$OUT/configure.log"
cmake --build build-gpu -j 16 -- -k 0 >"$OUT/build.log" 2>&1 || grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60
ctest --test-dir build-gpu --output-on-failure -j 8 >"$OUT/ctest.log" 2>&1
tail -15 "$OUT/ctest.log"
build-gpu/tests/test_cuda 2>&1 | tee "$OUT/test_cuda.log" | grep -E "^\[ *(OK|FAILED|SKIPPED|PASSED) "
build-gpu/examples/reference_example 2>&1 | tee "$OUT/reference_example.log"
build-gpu/benchmarks/bench_scaler_step 2>&1 | tee "$OUT/bench_scaler_step.log"
build-gpu/benchmarks/bench_gpt_step 2>&1 | tee "$OUT/bench_gpt_step.log"
[ -f .vendor/anchors/torch_scaler_baseline.py ] && python3 .vendor/anchors/torch_scaler_baseline.py > "$OUT/anchor.log" 2>&1; grep -E "copy_GBps|unscale_GBps|overhead_ratio|bare_ms|fp16_scaler" "$OUT/anchor.log"
