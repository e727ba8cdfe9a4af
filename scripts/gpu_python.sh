#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# On the GPU machine (device tool), after scripts/gpu_check.sh has built build-gpu: the
# Python package against the machine's PyTorch (CUDA), linked to build-gpu's library, its
# tests, and the Python training loops beside PyTorch's own (benchmarks/python). Logs go
# to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
[ -f build-gpu/liblucid_amp.a ] || { echo "gpu_python.sh: run scripts/gpu_check.sh first"; exit 1; }
echo "== building the Python package (prebuilt build-gpu/liblucid_amp.a)"
LUCID_AMP_PREBUILT_LIBRARY=build-gpu/liblucid_amp.a python3 setup.py --quiet build_ext --inplace \
  >"$OUT/python_build.log" 2>&1 || { tail -40 "$OUT/python_build.log"; exit 1; }
echo "== pytest tests/python"
# -v and faulthandler: a crash in an extension names the test and the Python stack.
python3 -X faulthandler -m pytest -v -p no:cacheprovider tests/python >"$OUT/pytest.log" 2>&1
echo "pytest exit status $?"
grep -E "passed|failed|Fatal Python error|Segmentation" "$OUT/pytest.log" | tail -5
echo "== benchmarks/python/bench_loops.py"
PYTHONPATH=python python3 benchmarks/python/bench_loops.py 2>&1 | tee "$OUT/bench_loops.log"
