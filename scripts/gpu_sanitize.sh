#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# On the GPU machine (device tool): builds the CUDA test binary against the machine's
# PyTorch LibTorch and runs its kernel tests under compute-sanitizer: memcheck (out of
# bounds, misaligned access), racecheck (shared memory hazards: the staged offsets of
# the unscale/check kernels) and synccheck (barriers). Logs go to $OUT. Carry .vendor
# (scripts/vendor_gpu_deps.sh), as for gpu_check.sh.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$sanitizer" ] || { echo "compute-sanitizer not found"; exit 1; }
# shellcheck source=lib/gpu_configure.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/gpu_configure.sh"
configure_gpu_build build-gpu "$OUT/sanitize_configure.log" || exit 1
cmake --build build-gpu -j 16 --target test_cuda >"$OUT/sanitize_build.log" 2>&1 ||
  { grep -E "error|FAILED" -A3 "$OUT/sanitize_build.log" | head -40; exit 1; }
# Without the caching allocator every tensor is its own allocation, so an access past a
# tensor's end is outside any allocation and memcheck sees it.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
kernels='Cuda.OwnUnscale*:Cuda.UnscaleAndCheck*:Cuda.ReadOnlyCheck*:Cuda.Fused*:Cuda.Float32*:Cuda.BFloat16*:Cuda.Float64*'
status=0
for tool in memcheck racecheck synccheck; do
  filter=$kernels
  # racecheck and synccheck are slow; the unscale/check kernels are the ones with
  # shared memory and barriers.
  [ "$tool" = memcheck ] || filter='Cuda.OwnUnscale*:Cuda.UnscaleAndCheck*:Cuda.ReadOnlyCheck*'
  timeout "${LUCID_AMP_SANITIZE_TIMEOUT:-150}" "$sanitizer" --tool "$tool" --error-exitcode 99 \
    build-gpu/tests/test_cuda --gtest_filter="$filter" >"$OUT/sanitize_$tool.log" 2>&1
  rc=$?
  echo "$tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -1);" \
    "$(grep -cE '^\[       OK \]' "$OUT/sanitize_$tool.log") tests OK"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
