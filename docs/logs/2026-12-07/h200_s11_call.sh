#!/usr/bin/env bash
# The flags vector: tests of the new tree, then bench_host_step (C++ and Python) of the
# base tree ($BASE) and the new one alternating, then bench_scaler_step of both.
set -uo pipefail
OUT=${OUT:-/tmp/out}; L=/tmp/l; mkdir -p $L
BASE=${BASE:?}
export PYTHONUNBUFFERED=1
pack() { tar -C $L -cf $OUT/logs.tar . ; }
stamp() { echo "== $(date -u +%T) $*" | tee -a $L/stages.txt; }
source scripts/lib/gpu_configure.sh
root=$PWD
{ nvidia-smi -L; python3 -c 'import torch; print(torch.__version__)'; git log --oneline -1; git status --short | head; } > $L/gpu.txt 2>&1; cat $L/gpu.txt
git worktree add -q /tmp/base $BASE && ln -s $root/.vendor /tmp/base/.vendor
stamp configure
configure_gpu_build build-gpu $L/configure.log -DLUCID_AMP_BUILD_BENCHMARKS=ON || { pack; exit 1; }
(cd /tmp/base && configure_gpu_build build-base $L/configure_base.log -DLUCID_AMP_BUILD_BENCHMARKS=ON) || { pack; exit 1; }
stamp build
T="test_cuda test_unscale_kernels test_graph_mode test_guards test_diagnostics test_found_inf_hook test_fused_optimizers test_clip_grad"
cmake --build build-gpu -j 16 --target lucid_amp $T bench_host_step bench_scaler_step -- -k 0 > $L/build.log 2>&1 || { grep -E "error|FAILED" -A3 $L/build.log | head -40; }
stamp built; pack
(LUCID_AMP_PREBUILT_LIBRARY=build-gpu/liblucid_amp.a MAX_JOBS=8 timeout 300 python3 setup.py --quiet build_ext --inplace > $L/python_build.log 2>&1; echo "python build status $?" >> $L/python_build.log) &
pyb=$!
cmake --build /tmp/base/build-base -j 8 --target lucid_amp bench_host_step bench_scaler_step > $L/build_base.log 2>&1 || tail -20 $L/build_base.log
(cd /tmp/base && LUCID_AMP_PREBUILT_LIBRARY=build-base/liblucid_amp.a MAX_JOBS=8 timeout 300 python3 setup.py --quiet build_ext --inplace > $L/python_build_base.log 2>&1; echo "python build status $?" >> $L/python_build_base.log) &
pybb=$!
for t in $T; do
  timeout 150 build-gpu/tests/$t > $L/$t.log 2>&1; echo "$t status $?: $(grep -E '^\[  (PASSED|FAILED) ' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' $L/$t.log | head -10
done
stamp tests; pack
for r in 1 2; do
  for v in base new; do
    b=build-gpu/benchmarks/bench_host_step; [ $v = base ] && b=/tmp/base/build-base/benchmarks/bench_host_step
    echo "-- $v (run $r)" | tee -a $L/bench_host_step_cuda_ab.log
    timeout 60 $b cuda 288 200 2>&1 | tee -a $L/bench_host_step_cuda_ab.log | grep -E "FusedAdamW|graph_safe|stage"
  done
done
stamp cpp-bench; pack
wait $pyb; tail -1 $L/python_build.log
wait $pybb; tail -1 $L/python_build_base.log
if grep -q "status 0" $L/python_build.log; then
  timeout 300 python3 -m pytest -p no:cacheprovider -q tests/python/test_step_log.py tests/python/test_torch_scaler_suite.py tests/python/test_grad_scaler.py > $L/pytest.log 2>&1; echo "pytest status $?"; tail -3 $L/pytest.log
  stamp pytest; pack
  for r in 1 2; do
    for v in base new; do
      p=python; [ $v = base ] && p=/tmp/base/python
      echo "-- $v (run $r)" | tee -a $L/bench_host_step_py_cuda_ab.log
      PYTHONPATH=$p timeout 90 python3 benchmarks/python/bench_host_step.py --device cuda --tensors 288 --iters 1000 2>&1 | tee -a $L/bench_host_step_py_cuda_ab.log | grep -iE "step \+ update|fused"
    done
  done
fi
stamp py-bench; pack
for v in base new; do
  b=build-gpu/benchmarks/bench_scaler_step; [ $v = base ] && b=/tmp/base/build-base/benchmarks/bench_scaler_step
  echo "-- $v" | tee -a $L/bench_scaler_step_ab.log
  timeout 150 $b 2>&1 | tee -a $L/bench_scaler_step_ab.log | tail -30
  stamp "scaler-step $v"; pack
done
stamp done; pack
