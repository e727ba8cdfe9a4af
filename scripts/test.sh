#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The fast tier of every suite, C++ and Python (CI runs it first, then the long tiers of
# .ci/run). Everything run.sh does (install, the .venv with torch 2.13, build, the main
# job), then the whole build, the reference example and ctest without the `packaging`
# label (each test executable is one ctest entry: starting LibTorch once per case would add
# minutes on 2 cores; configure with -DLUCID_AMP_DISCOVER_TESTS=ON for one entry per case),
# then the Python package (scripts/python_test.sh: built in place against .venv's torch,
# linking the library just built, and its pytest suite without the tests marked slow),
# then every .cu file compiled with the machine's nvcc for sm_90 and the CUDA backends'
# host C++ checked by g++ (scripts/compile_cuda.sh).
# Extra arguments go to CMake. Each stage prints how long it took.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
start=$SECONDS
stage_start=$SECONDS
stage_done() {  # stage_done NAME: prints the stage's wall time
  echo "== $1 took $((SECONDS - stage_start)) s"
  stage_start=$SECONDS
}
"$root/scripts/run.sh"
stage_done "the main job (run.sh)"
"$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=ON -DLUCID_AMP_DISCOVER_TESTS=OFF "$@"
stage_done "configure and build"
echo "== running the reference example"
"$build_dir/examples/reference_example"
echo "== running the tests (ctest, all but the label packaging)"
ctest --test-dir "$build_dir" --output-on-failure -j "$(nproc)" -LE packaging
stage_done "the tests (ctest)"
echo "== the Python package: build in place and pytest"
if [ -f "$build_dir/liblucid_amp.a" ]; then
  LUCID_AMP_PREBUILT_LIBRARY="$build_dir/liblucid_amp.a" "$root/scripts/python_test.sh" -m "not slow"
else
  "$root/scripts/python_test.sh" -m "not slow"  # a shared build: the package compiles the sources itself
fi
stage_done "the Python package"
echo "== the CUDA sources, compile only (scripts/compile_cuda.sh)"
"$root/scripts/compile_cuda.sh"
stage_done "nvcc"
echo "== scripts/test.sh passed in $((SECONDS - start)) s"
