#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# On the GPU machine (device tool): build lucid_amp::distributed against the machine's
# PyTorch LibTorch (CUDA, NCCL), run its tests (ctest label "distributed": Gloo on
# loopback with 2 and 4 processes where the wheel ships the gloo headers, NCCL with one
# process) and the agreement benchmark (NCCL, one process; Gloo, two). Logs go to $OUT.
# Carry .vendor (scripts/vendor_gpu_deps.sh), as for gpu_check.sh.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# shellcheck source=lib/gpu_configure.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/gpu_configure.sh"
python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version())' \
  | tee "$OUT/versions.txt"
configure_gpu_build build-dist "$OUT/configure.log" -DLUCID_AMP_BUILD_BENCHMARKS=ON || exit 1
grep -E "lucid_amp:|NCCL|gloo" "$OUT/configure.log"
# Only this issue's targets (those configured: Gloo/NCCL parts depend on what was found).
targets=$(ninja -C build-dist -t targets all | sed -n 's/^\([a-z_]*\): phony$/\1/p' | grep -xE \
  'lucid_amp_distributed|lucid_distributed_worker|test_overflow_agreement|test_nccl_agreement|data_parallel|bench_agreement')
echo "building:" $targets
timeout 480 cmake --build build-dist -j 16 --target $targets -- -k 0 >"$OUT/build.log" 2>&1 \
  || grep -E "error|FAILED" -A3 "$OUT/build.log" | head -80
timeout 300 ctest --test-dir build-dist -L distributed --output-on-failure -j 4 >"$OUT/ctest_distributed.log" 2>&1
tail -25 "$OUT/ctest_distributed.log"
timeout 120 build-dist/benchmarks/bench_agreement nccl 5000 2>&1 | tee "$OUT/bench_agreement_nccl.log"
timeout 120 build-dist/benchmarks/bench_agreement gloo 2 2000 2>&1 | tee "$OUT/bench_agreement_gloo.log"
