#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Run here (Debian 12), before a GPU-machine script: copies into .vendor/ (git-ignored; or
# into $LUCID_AMP_VENDOR_DIR) the build inputs and data the GPU machine lacks and cannot
# install, for the device tool to carry (name .vendor in `carry`).
# scripts/lib/gpu_configure.sh points CMake at them, scripts/gpu_trainer.sh the programs:
#   .vendor/googletest       GoogleTest's source tree (libgtest-dev), built with the tests
#   .vendor/zlib/include     zlib.h and zconf.h (zlib1g-dev): lucid_amp links zlib
#   .vendor/zlib/lib         libz.so.1 (zlib1g), linked only where the machine has none
#   .vendor/cli11/include    CLI11's header tree, CLI/*.hpp (libcli11-dev): the trainer
#   .vendor/fashion-mnist    the four gzipped IDX files (dataset-fashion-mnist, 30 MB)
#   .vendor/fortunes         the quotation files and their strfile indexes (fortunes,
#                            fortunes-min; 2.6 MB): the language model's corpus
# Replaces only these folders; anything else under the destination stays.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
vendor=${LUCID_AMP_VENDOR_DIR:-$root/.vendor}

# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages libgtest-dev zlib1g-dev libcli11-dev dataset-fashion-mnist fortunes

# Paths from the packages' own file lists, so that a moved file fails here, not there.
pkg_file() {  # pkg_file PACKAGE REGEX: the one path of PACKAGE that matches REGEX
  local found
  found=$(dpkg -L "$1" | grep -E "$2" | head -1)
  [ -n "$found" ] || { echo "vendor_gpu_deps: $1 has no file matching $2" >&2; return 1; }
  echo "$found"
}
zlib_h=$(pkg_file zlib1g-dev '/zlib\.h$')
zconf_h=$(pkg_file zlib1g-dev '/zconf\.h$')
libz=$(pkg_file zlib1g '/libz\.so\.1$')
cli_hpp=$(pkg_file libcli11-dev '/CLI/CLI\.hpp$')
# (each in an assignment of its own: set -e sees a failed lookup there, not inside dirname)
mnist_file=$(pkg_file dataset-fashion-mnist '/train-images-idx3-ubyte\.gz$')
fortune_file=$(pkg_file fortunes '/games/fortunes/art$')
mnist_dir=$(dirname "$mnist_file")
fortunes_dir=$(dirname "$fortune_file")
gtest_src=/usr/src/googletest
[ -f "$gtest_src/CMakeLists.txt" ] || { echo "vendor_gpu_deps: no $gtest_src/CMakeLists.txt" >&2; exit 1; }

rm -rf "$vendor/googletest" "$vendor/zlib" "$vendor/cli11" "$vendor/fashion-mnist" "$vendor/fortunes"
mkdir -p "$vendor/zlib/include" "$vendor/zlib/lib" "$vendor/cli11/include" \
         "$vendor/fashion-mnist" "$vendor/fortunes"
cp -r "$gtest_src" "$vendor/googletest"
cp "$zlib_h" "$zconf_h" "$vendor/zlib/include/"
# -L: libz.so.1 is a link to the versioned file, and the device tool carries a link as a
# link, without what it points to.
cp -L "$libz" "$vendor/zlib/lib/libz.so.1"
cp -r "$(dirname "$cli_hpp")" "$vendor/cli11/include/CLI"
cp "$mnist_dir"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$vendor/fashion-mnist/"
# Plain files only: the .u8 links repeat the text, and a link would travel without it.
find "$fortunes_dir" -maxdepth 1 -type f -exec cp {} "$vendor/fortunes/" \;

echo "== .vendor for the GPU machine (carry: [\".vendor\"]):"
echo "   googletest $(sed -n 's/.*GOOGLETEST_VERSION \([0-9.]*\).*/\1/p' "$vendor/googletest/CMakeLists.txt" | head -1)," \
  "zlib $(sed -n 's/^#define ZLIB_VERSION "\(.*\)"/\1/p' "$vendor/zlib/include/zlib.h")," \
  "CLI11 $(sed -n 's/^#define CLI11_VERSION "\(.*\)"/\1/p' "$vendor/cli11/include/CLI/Version.hpp")"
echo "   Fashion-MNIST $(ls "$vendor/fashion-mnist" | wc -l) files," \
  "fortunes $(find "$vendor/fortunes" -name '*.dat' | wc -l) quotation files"
du -sh "$vendor/googletest" "$vendor/zlib" "$vendor/cli11" "$vendor/fashion-mnist" "$vendor/fortunes"
