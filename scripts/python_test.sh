#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The Python package: builds lucid_amp in place (python/lucid_amp/_C*.so) against the
# PyTorch of Debian's /usr/bin/python3 (python3-torch) and runs its tests (tests/python)
# with pytest. scripts/test.sh runs it after the C++ suite with
# LUCID_AMP_PREBUILT_LIBRARY=<build>/liblucid_amp.a, so that only the bindings are
# compiled here; without it setup.py compiles the library's sources too (several minutes
# on 2 cores). LUCID_AMP_PYTHON picks another interpreter (one that has torch); extra
# arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${LUCID_AMP_PYTHON:-/usr/bin/python3}
cd "$root"
if ! "$python" -c "import torch" 2>/dev/null; then
  echo "python_test.sh: $python cannot import torch (Debian: apt-get install python3-torch)" >&2
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
