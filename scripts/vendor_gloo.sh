#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Regenerates third_party/gloo: the gloo headers that c10d's ProcessGroupGloo.hpp includes
# (and nothing else), from Debian's libgloo-dev, with gloo's licence. PyTorch's wheels
# link gloo into libtorch_cpu but ship none of its headers, and lucid_amp::distributed
# needs them only to call ProcessGroupGloo's constructor and device factories, which are
# compiled into libtorch_cpu. The copy is committed, so that no build looks for a system
# gloo (a second copy of gloo on a search path is how two gloos end up in one program).
# Usage: scripts/vendor_gloo.sh (needs the project's .venv with torch, and apt-get).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dest=$root/third_party/gloo
python=${LUCID_AMP_PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
apt-get download libgloo-dev >/dev/null
deb=$(ls libgloo-dev_*.deb)
dpkg -x "$deb" pkg
version=$(dpkg-deb -f "$deb" Version)
torch_include=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
printf '#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>\n' >probe.cpp
# The include closure, as the compiler itself resolves it.
mapfile -t headers < <(g++ -std=c++20 -DUSE_C10D_GLOO -M -I"$torch_include" \
    -I"$torch_include/torch/csrc/api/include" -Ipkg/usr/include probe.cpp |
  tr ' \\' '\n\n' | sed -n 's|^pkg/usr/include/||p' | sort -u)
rm -rf "$dest/include"
for h in "${headers[@]}" gloo/config.h; do
  mkdir -p "$dest/include/$(dirname "$h")"
  cp "pkg/usr/include/$h" "$dest/include/$h"
done
sed -n '/^License: BSD-3-Clause$/,$p' pkg/usr/share/doc/libgloo-dev/copyright |
  tail -n +2 | sed 's/^ \.$//; s/^ //' >"$dest/LICENSE"
echo "$version" >"$dest/VERSION"
echo "third_party/gloo: ${#headers[@]} headers and config.h of Debian's libgloo-dev $version"
