# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Sourced by scripts/*.sh: ensure_venv makes the project's virtual environment .venv (or
# $LUCID_AMP_VENV) with the machine's python3 if it is missing, installs
# requirements-dev.txt into it (a no-op when satisfied), and sets
#   LUCID_AMP_PY         the environment's python
#   LUCID_AMP_TORCH_DIR  its LibTorch's CMake package folder (for -DTorch_DIR)
# One toolchain: CMake and the Python package both build against this torch, so no other
# copy of LibTorch can be picked up from a search path.
ensure_venv() {
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  venv=${LUCID_AMP_VENV:-$root/.venv}
  if [ ! -x "$venv/bin/python" ]; then
    echo "== making the virtual environment $venv ($(python3 --version))"
    python3 -m venv "$venv"
  fi
  # The pip cache and version check are off: the one large wheel (torch) lies on local disk.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    -r "$root/requirements-dev.txt" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
  LUCID_AMP_PY=$venv/bin/python
  LUCID_AMP_TORCH_DIR=$("$LUCID_AMP_PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)/Torch
  export LUCID_AMP_PY LUCID_AMP_TORCH_DIR
}
