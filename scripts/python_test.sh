#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Python package: builds lucid_amp in place (python/lucid_amp/_C*.so and
# _build_info.py, with `setup.py build_ext --inplace`) against the PyTorch of the
# project's virtual environment ($root/.venv/bin/python; LUCID_AMP_PYTHON picks another
# interpreter that has torch), then runs its tests (tests/python) with pytest; extra
# arguments go to pytest. scripts/test.sh runs it after the C++ suite with
# LUCID_AMP_PREBUILT_LIBRARY=<build>/liblucid_amp.a, so that only the bindings are
# compiled here; without it setup.py compiles the library's sources too (several minutes
# on 2 cores). LUCID_AMP_SLOW_TESTS=1 adds the slow tests (a wheel built, installed into
# a new virtual environment and imported; an editable install).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${LUCID_AMP_PYTHON:-$root/.venv/bin/python}
cd "$root"
if [ ! -x "$python" ]; then
  echo "python_test.sh: no interpreter $python (create the virtual environment .venv with torch, or set LUCID_AMP_PYTHON)" >&2
  exit 1
fi
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "python_test.sh: $python cannot import torch (pip install torch==<version> \"setuptools>=77\" wheel pytest hypothesis)" >&2
  exit 1
fi
# ccache, when installed, through its compiler links (PyTorch's build wants a plain
# compiler name in CXX).
if [ -d /usr/lib/ccache ]; then
  export PATH=/usr/lib/ccache:$PATH
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
echo "== building the Python package in place ($("$python" -c 'import torch; print("torch", torch.__version__)'))"
"$python" setup.py --quiet build_ext --inplace
echo "== pytest tests/python"
"$python" -m pytest -q tests/python "$@"
