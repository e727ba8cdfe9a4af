# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Sourced by scripts/*.sh: ensure_venv makes the project's virtual environment .venv (or
# $LUCID_AMP_VENV) with the machine's python3 if it is missing, installs
# requirements-dev.txt into it (a no-op when satisfied), and sets
#   LUCID_AMP_PY         the environment's python
#   LUCID_AMP_TORCH_DIR  its LibTorch's CMake package folder (for -DTorch_DIR)
# One toolchain: CMake and the Python package both build against this torch, so no other
# copy of LibTorch can be picked up from a search path. Sourcing this file only defines
# the functions below.

# The environment's folder: $LUCID_AMP_VENV, else .venv at the repository's root.
venv_dir() {
  echo "${LUCID_AMP_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.venv}"
}

# pip_quietly PYTHON COMMAND ARGS...: `PYTHON -m pip COMMAND` without its progress, its
# version check and the warning that an index path configured on the machine but absent
# gives.
pip_quietly() {
  local py=$1 command=$2
  shift 2
  "$py" -m pip "$command" --quiet --disable-pip-version-check "$@" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

ensure_venv() {
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  venv=$(venv_dir)
  if [ ! -x "$venv/bin/python" ]; then
    echo "== making the virtual environment $venv ($(python3 --version))"
    python3 -m venv "$venv"
  fi
  # The pip cache is off: the one large wheel (torch) lies on local disk.
  pip_quietly "$venv/bin/python" install --no-cache-dir -r "$root/requirements-dev.txt"
  LUCID_AMP_PY=$venv/bin/python
  LUCID_AMP_TORCH_DIR=$("$LUCID_AMP_PY" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)/Torch
  export LUCID_AMP_PY LUCID_AMP_TORCH_DIR
}
