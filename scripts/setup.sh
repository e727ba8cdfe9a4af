#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Shared by run.sh and test.sh: install what a fresh Debian machine (12 or 13) lacks, make
# the virtual environment .venv (scripts/lib/venv.sh: torch 2.13 and the Python tools from
# pip), then configure and build lucid-amp in ./build (or $LUCID_AMP_BUILD_DIR) against
# that environment's LibTorch, with Ninja, the compile commands exported for clang-tidy
# (scripts/lint.sh) and ccache as the compiler launcher (unless the arguments name another).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
# From Debian only what pip does not give: the build tools, GoogleTest, and for the
# trainer (apps/trainer) its data set, plotting tool, argument parser and zlib (the gzipped
# IDX files; the library's archive check links it too). The language model (apps/lm)
# reads the quotations of fortunes. python3-venv: Debian's own python3 needs it for
# `python3 -m venv`; the machine's pyenv python3 has venv built in, so it is asked for only
# where that python3 lacks it.
packages=(cmake g++ make ninja-build ccache libgtest-dev dataset-fashion-mnist gnuplot-nox
          libcli11-dev zlib1g-dev fortunes)
python3 -c 'import venv, ensurepip' 2>/dev/null || packages+=(python3-venv)

# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages "${packages[@]}"
# shellcheck source=lib/venv.sh
source "$root/scripts/lib/venv.sh"
ensure_venv

echo "== configuring in $build_dir (LibTorch $("$LUCID_AMP_PY" -c 'import torch; print(torch.__version__)'))"
# A build folder made by another generator cannot be reconfigured with Ninja: start it afresh.
if [ -f "$build_dir/CMakeCache.txt" ] && ! grep -qx 'CMAKE_GENERATOR:INTERNAL=Ninja' "$build_dir/CMakeCache.txt"; then
  echo "== $build_dir was configured with another generator: configuring it afresh"
  rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
fi
launcher=()
case " $* " in
  *" -DCMAKE_CXX_COMPILER_LAUNCHER="*) ;;
  *) launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) ;;
esac
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DTorch_DIR="$LUCID_AMP_TORCH_DIR" \
  -DPython3_EXECUTABLE="$LUCID_AMP_PY" "${launcher[@]}" "$@"
echo "== building"
cmake --build "$build_dir" -j "$(nproc)" ${LUCID_AMP_BUILD_TARGETS:+--target $LUCID_AMP_BUILD_TARGETS}
