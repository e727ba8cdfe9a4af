#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Compiles every CUDA source of the library (git ls-files '*.cu') with the machine's nvcc
# for sm_90 (the H100/H200), compile only: CUDA code cannot rot between GPU sessions. The
# kernels include no LibTorch header, so nvcc needs nothing beyond the CUDA toolkit.
# The host-side C++ of the CUDA backends (src/*/cuda/*.cpp, src/cuda_common/*.cpp) is not
# compiled here: it includes ATen's CUDA headers, which need cuBLAS, cuSPARSE and cuSOLVER
# headers that a toolkit with nvcc alone lacks; the GPU machine builds it.
# Objects go to $LUCID_AMP_BUILD_DIR/cuda-compile (default build/cuda-compile).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${LUCID_AMP_BUILD_DIR:-$root/build}/cuda-compile
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "compile_cuda.sh: no nvcc (set NVCC or put it on PATH)" >&2; exit 1; }
cd "$root"
mapfile -t sources < <(git ls-files '*.cu')
mkdir -p "$out"
echo "== nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'): ${#sources[@]} files for sm_90"
compile() {  # compile SOURCE: one object, warnings as errors
  "$nvcc" -std=c++20 -O3 -arch=sm_90 --Werror all-warnings -Iinclude -Isrc -c "$1" \
    -o "$out/$(echo "$1" | tr / _).o"
}
export -f compile
export nvcc out
printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} bash -c 'compile {} && echo "   ok {}"'
