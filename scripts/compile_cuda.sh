#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Compiles every CUDA source of the library (git ls-files '*.cu') with the machine's nvcc
# for sm_90 (the H100/H200), compile only: CUDA code cannot rot between GPU sessions. The
# kernels include no LibTorch header, so nvcc needs nothing beyond the CUDA toolkit.
# Then the host-side C++ of the CUDA backends (src/*/cuda/*.cpp, src/cuda_common/*.cpp),
# syntax and warnings only (g++ -fsyntax-only -Wall -Wextra -Werror), against .venv's
# LibTorch headers, which hold ATen's and c10's CUDA headers even in a CPU build. Those
# include cuBLAS, cuSPARSE and cuSOLVER headers, which a toolkit with nvcc alone lacks:
# they are taken from NVIDIA's wheels (pinned below, headers only, kept between runs), and
# c10's CUDA build macros header, which only a CUDA build of PyTorch generates, is written
# as that build writes it for a shared library. Linking needs a CUDA LibTorch: the GPU
# machine builds it.
# Objects and headers go to $LUCID_AMP_BUILD_DIR/cuda-compile (default build/cuda-compile).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/venv.sh
source "$root/scripts/lib/venv.sh"
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

# The host-side C++ of the CUDA backends.
cuda_library_wheels=(nvidia-cublas==13.1.1.3 nvidia-cusparse==12.6.3.3 nvidia-cusolver==12.0.4.66)
py=${LUCID_AMP_PY:-$(venv_dir)/bin/python}
[ -x "$py" ] || { echo "compile_cuda.sh: no $py (run scripts/run.sh first, or set LUCID_AMP_PY)" >&2; exit 1; }
torch_include=$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
headers=$out/library-headers
if [ ! -f "$headers/.wheels" ] || [ "$(cat "$headers/.wheels")" != "${cuda_library_wheels[*]}" ]; then
  rm -rf "$headers" "$out/wheels"
  mkdir -p "$headers/include/c10/cuda/impl"
  pip_quietly "$py" download --no-deps --only-binary=:all: -d "$out/wheels" \
    "${cuda_library_wheels[@]}"
  "$py" - "$headers/include" "$out"/wheels/*.whl <<'PY'
import pathlib, sys, zipfile
# Each wheel's nvidia/<package>/include/ tree, merged into one folder.
dest = pathlib.Path(sys.argv[1])
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            parts = pathlib.PurePosixPath(name).parts
            if len(parts) > 3 and parts[0] == "nvidia" and parts[2] == "include":
                target = dest.joinpath(*parts[3:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
PY
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' \
    >"$headers/include/c10/cuda/impl/cuda_cmake_macros.h"
  rm -rf "$out/wheels"
  echo "${cuda_library_wheels[*]}" >"$headers/.wheels"
fi
# The toolkit's own include folder, as nvcc reports it (nvcc may be a wrapper script).
cuda_include=$("$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ INCLUDES="-I\([^"]*\)".*/\1/p')
mapfile -t host_sources < <(git ls-files 'src/*/cuda/*.cpp' 'src/cuda_common/*.cpp')
echo "== g++ -fsyntax-only: ${#host_sources[@]} host-side files of the CUDA backends"
check_host() {  # check_host SOURCE: syntax and warnings, as errors
  g++ -std=c++20 -fsyntax-only -Wall -Wextra -Werror -Iinclude -Isrc \
    -isystem "$torch_include" -isystem "$torch_include/torch/csrc/api/include" \
    -isystem "$cuda_include" -isystem "$headers/include" "$1"
}
export -f check_host
export torch_include cuda_include headers
printf '%s\n' "${host_sources[@]}" | xargs -P "$(nproc)" -I{} bash -c 'check_host {} && echo "   ok {}"'
