#!/usr/bin/env bash
# Shared by run.sh and test.sh: install what a fresh Debian 12 machine lacks, then
# configure and build lucid-amp in ./build (or $LUCID_AMP_BUILD_DIR).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
# libgloo-dev: c10d's Gloo headers (lucid_amp::distributed). The trainer (apps/trainer)
# adds its data set, its plotting tool, its argument parser and zlib for the gzipped IDX
# files; the language model (apps/lm) its corpus, the quotations of fortunes.
packages=(cmake g++ make libtorch-dev libgtest-dev libgloo-dev
          dataset-fashion-mnist gnuplot-nox libcli11-dev zlib1g-dev fortunes)

# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages "${packages[@]}"

echo "== configuring in $build_dir"
cmake -S "$root" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@"
echo "== building"
cmake --build "$build_dir" -j "$(nproc)" ${LUCID_AMP_BUILD_TARGETS:+--target $LUCID_AMP_BUILD_TARGETS}
