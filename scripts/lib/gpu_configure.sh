# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Sourced by the GPU-machine scripts (gpu_check.sh, gpu_distributed.sh, gpu_sanitize.sh),
# run from the repository root: configure_gpu_build DIR LOG [CMAKE_ARG...] configures DIR
# with Ninja against the machine's PyTorch LibTorch (CUDA for the H200, sm_90) and writes
# CMake's output to LOG; on failure it prints the log's tail and returns 1.
# The machine has no GoogleTest, no zlib headers and no CLI11, and nothing can be
# installed there: scripts/vendor_gpu_deps.sh copies them into .vendor/ on a Debian
# machine, the device tool carries .vendor, and CMake is pointed at the copies here.

# The machine's own libz.so.1 (the loader's cache, else beside the python that has torch),
# else the carried Debian copy: lucid_amp links zlib, and only headers are missing there.
gpu_zlib_library() {
  local lib
  lib=$(ldconfig -p 2>/dev/null | awk '$1 == "libz.so.1" && /x86-64/ {print $NF; exit}')
  if [ -z "$lib" ] || [ ! -e "$lib" ]; then
    lib=$(python3 -c 'import os, sysconfig
p = os.path.join(sysconfig.get_config_var("LIBDIR") or "", "libz.so.1")
print(p if os.path.exists(p) else "")' 2>/dev/null)
  fi
  [ -n "$lib" ] || lib=$PWD/.vendor/zlib/lib/libz.so.1
  echo "$lib"
}

configure_gpu_build() {
  local dir=$1 log=$2 prefix vendor=$PWD/.vendor zlib_lib f
  shift 2
  for f in googletest/CMakeLists.txt zlib/include/zlib.h zlib/include/zconf.h \
           zlib/lib/libz.so.1 cli11/include/CLI/CLI.hpp; do
    [ -e "$vendor/$f" ] || {
      echo "configure_gpu_build: .vendor/$f is missing: run scripts/vendor_gpu_deps.sh on" \
           "a Debian machine and carry .vendor"
      return 1
    }
  done
  zlib_lib=$(gpu_zlib_library)
  echo "configure_gpu_build: zlib headers from .vendor/zlib/include, library $zlib_lib"
  prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)') || return 1
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
    -DLUCID_AMP_GTEST_SOURCE_DIR="$vendor/googletest" -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DZLIB_INCLUDE_DIR="$vendor/zlib/include" -DZLIB_LIBRARY="$zlib_lib" \
    -DLUCID_AMP_CLI11_INCLUDE_DIR="$vendor/cli11/include" "$@" \
    >"$log" 2>&1 || { tail -40 "$log"; return 1; }
}
