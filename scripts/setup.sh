#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Shared by run.sh and test.sh: install what a fresh Debian 12 machine lacks, then
# configure and build lucid-amp in ./build (or $LUCID_AMP_BUILD_DIR), with the compile
# commands exported for clang-tidy (scripts/lint.sh) and ccache as the compiler launcher
# (unless the arguments name another): the packaging tests build the library again in
# outside projects, and reuse these objects through it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
# libgloo-dev: c10d's Gloo headers (lucid_amp::distributed). The trainer (apps/trainer)
# adds its data set, its plotting tool, its argument parser and zlib for the gzipped IDX
# files. The Python package (setup.py, tests/python) builds against Debian's PyTorch with
# pybind11's headers and the Python headers, and is tested with pytest. doxygen: the API
# reference and its check (scripts/test.sh). The language model (apps/lm) reads its
# corpus, the quotations of fortunes.
packages=(cmake g++ make libtorch-dev libgtest-dev libgloo-dev
          dataset-fashion-mnist gnuplot-nox libcli11-dev zlib1g-dev
          python3-torch python3-dev python3-setuptools pybind11-dev python3-pytest
          ccache doxygen python3 fortunes)

# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages "${packages[@]}"

echo "== configuring in $build_dir"
launcher=()
case " $* " in
  *" -DCMAKE_CXX_COMPILER_LAUNCHER="*) ;;
  *) launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) ;;
esac
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  "${launcher[@]}" "$@"
echo "== building"
cmake --build "$build_dir" -j "$(nproc)" ${LUCID_AMP_BUILD_TARGETS:+--target $LUCID_AMP_BUILD_TARGETS}
