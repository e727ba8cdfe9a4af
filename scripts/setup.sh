#!/usr/bin/env bash
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
# files. doxygen and python3: the API reference and its check (scripts/test.sh).
packages=(cmake g++ make libtorch-dev libgtest-dev libgloo-dev
          dataset-fashion-mnist gnuplot-nox libcli11-dev zlib1g-dev
          ccache doxygen python3)

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
