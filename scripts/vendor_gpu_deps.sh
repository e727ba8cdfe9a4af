#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Run here (Debian 12), before a GPU-machine script: copies into .vendor/ (git-ignored)
# the build inputs the GPU machine lacks and cannot install, for the device tool to carry
# (name .vendor in `carry`). scripts/lib/gpu_configure.sh points CMake at them:
#   .vendor/googletest       GoogleTest's source tree (libgtest-dev), built with the tests
#   .vendor/zlib/include     zlib.h and zconf.h (zlib1g-dev): lucid_amp links zlib
#   .vendor/zlib/lib         libz.so.1 (zlib1g), linked only where the machine has none
#   .vendor/cli11/include    CLI11's header tree, CLI/*.hpp (libcli11-dev): the trainer
# Replaces only these folders; anything else under .vendor/ stays.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
vendor=$root/.vendor

# shellcheck source=lib/install_packages.sh
source "$root/scripts/lib/install_packages.sh"
install_packages libgtest-dev zlib1g-dev libcli11-dev

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
gtest_src=/usr/src/googletest
[ -f "$gtest_src/CMakeLists.txt" ] || { echo "vendor_gpu_deps: no $gtest_src/CMakeLists.txt" >&2; exit 1; }

rm -rf "$vendor/googletest" "$vendor/zlib" "$vendor/cli11"
mkdir -p "$vendor/zlib/include" "$vendor/zlib/lib" "$vendor/cli11/include"
cp -r "$gtest_src" "$vendor/googletest"
cp "$zlib_h" "$zconf_h" "$vendor/zlib/include/"
# -L: libz.so.1 is a link to the versioned file, and the device tool carries a link as a
# link, without what it points to.
cp -L "$libz" "$vendor/zlib/lib/libz.so.1"
cp -r "$(dirname "$cli_hpp")" "$vendor/cli11/include/CLI"

echo "== .vendor for the GPU machine (carry: [\".vendor\"]):"
echo "   googletest $(sed -n 's/.*GOOGLETEST_VERSION \([0-9.]*\).*/\1/p' "$vendor/googletest/CMakeLists.txt" | head -1)," \
  "zlib $(sed -n 's/^#define ZLIB_VERSION "\(.*\)"/\1/p' "$vendor/zlib/include/zlib.h")," \
  "CLI11 $(sed -n 's/^#define CLI11_VERSION "\(.*\)"/\1/p' "$vendor/cli11/include/CLI/Version.hpp")"
du -sh "$vendor/googletest" "$vendor/zlib" "$vendor/cli11"
