#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# On the GPU machine (device tool): the Python package against the machine's PyTorch
# (CUDA), linked to build-gpu's library where scripts/gpu_check.sh built it (else compiling
# the library's sources itself), its tests but those marked slow (they install wheels, and
# nothing can be installed there), and the Python training loops beside PyTorch's own
# (benchmarks/python). Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1
python3 -c 'import torch, setuptools; print("torch", torch.__version__, "cuda", torch.version.cuda, "setuptools", setuptools.__version__)'
if [ -f build-gpu/liblucid_amp.a ]; then
  echo "== building the Python package (prebuilt build-gpu/liblucid_amp.a)"
  export LUCID_AMP_PREBUILT_LIBRARY=build-gpu/liblucid_amp.a
else
  echo "== building the Python package (its own compile of the library's sources)"
fi
python3 setup.py --quiet build_ext --inplace >"$OUT/python_build.log" 2>&1 ||
  { tail -40 "$OUT/python_build.log"; exit 1; }
python3 -c 'import sys; sys.path.insert(0, "python"); import lucid_amp; print("lucid_amp", lucid_amp.__version__, "with_cuda", lucid_amp.with_cuda)' 
echo "== pytest tests/python"
# -v and faulthandler: a crash of the interpreter names its test and the Python stack.
# Such a test is then deselected and the suite run again (at most 4 times), so that one
# crash does not hide the results of the tests after it; the crashed tests are listed.
deselect=()
for attempt in 1 2 3 4; do
  python3 -X faulthandler -m pytest -v -p no:cacheprovider -m "not slow" tests/python "${deselect[@]}" \
    >"$OUT/pytest_$attempt.log" 2>&1
  status=$?
  crashed=$(grep -m1 "Fatal Python error" "$OUT/pytest_$attempt.log" |
            grep -oE "tests/python/[^ ]+::[^ ]+" | head -1)
  [ -n "$crashed" ] || break
  echo "pytest: the interpreter crashed in $crashed"
  deselect+=(--deselect "$crashed")
done
echo "pytest exit status $status (run $attempt)"
grep -E "passed|failed" "$OUT/pytest_$attempt.log" | tail -2
echo "== benchmarks/python/bench_loops.py"
PYTHONPATH=python python3 benchmarks/python/bench_loops.py 2>&1 | tee "$OUT/bench_loops.log"
