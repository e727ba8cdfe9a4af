# Sourced by the GPU-machine scripts (gpu_check.sh, gpu_distributed.sh, gpu_sanitize.sh),
# run from the repository root: configure_gpu_build DIR LOG [CMAKE_ARG...] configures DIR
# with Ninja against the machine's PyTorch LibTorch (CUDA for the H200, sm_90), with
# GoogleTest built from the carried .vendor/googletest, and writes CMake's output to
# LOG; on failure it prints the log's tail and returns 1.
configure_gpu_build() {
  local dir=$1 log=$2 prefix
  shift 2
  prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)') || return 1
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DLUCID_AMP_GTEST_SOURCE_DIR="$PWD/.vendor/googletest" -DCMAKE_CUDA_ARCHITECTURES=90 "$@" \
    >"$log" 2>&1 || { tail -40 "$log"; return 1; }
}
