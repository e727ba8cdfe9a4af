#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# On the GPU machine (device tool), in one call: build the trainer, the fortunes LM and
# their tests against the machine's PyTorch LibTorch (CUDA), run those tests (EndToEnd
# and the LM's short runs included, on the carried data), then on the GPU:
#   1. the CNN's --compare over whole epochs of all 60000 Fashion-MNIST images;
#   2. the LM's --compare (ordinary mean token loss) at 16384 tokens a step;
#   3. a sweep of one-epoch CNN runs that finds where unscaled float16 stops learning
#      (the ordinary batch-mean loss, loss weights below 1, a small head);
#   4. the LM at 65536 tokens a step (all four) and at 2048 (fp32 against unscaled fp16).
# Everything goes to $OUT (8 files at most come back): gpu_trainer.log (all output),
# configure.log, build.log, ctest.log, cnn_train_log.csv, lm_log.csv and the two plots:
# cnn_train_curves.png and lm_curves.png where the machine has gnuplot, else the gnuplot
# scripts the programs leave (.gp; run them where gnuplot is, paths changed). Run scripts/vendor_gpu_deps.sh on a Debian machine first
# and carry .vendor (GoogleTest, zlib, CLI11, Fashion-MNIST, fortunes).
# GPU_TRAINER_EPOCHS (2), GPU_TRAINER_LM_STEPS (1000) size the runs.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# shellcheck source=lib/gpu_configure.sh
source scripts/lib/gpu_configure.sh
epochs=${GPU_TRAINER_EPOCHS:-2}
lm_steps=${GPU_TRAINER_LM_STEPS:-1000}
build=build-gpu-trainer
log=$OUT/gpu_trainer.log
export LUCID_AMP_FASHION_MNIST_DIR=$PWD/.vendor/fashion-mnist
export LUCID_AMP_FORTUNES_DIR=$PWD/.vendor/fortunes

say() { echo "== $*" | tee -a "$log"; }
# Runs a command with a time limit, its output into the main log; the limit keeps one
# stuck stage from costing the whole call, and what ran before it still comes back.
# Every stage also ends by the call's deadline (GPU_TRAINER_DEADLINE seconds after the
# start, 500 by default, under the device tool's 540-second calls), so the logs come back.
deadline=${GPU_TRAINER_DEADLINE:-500}
stage() {
  local limit=$1 start=$SECONDS rc left=$((deadline - SECONDS))
  shift
  if ((left < 10)); then
    echo "   (not run: the call's deadline is near)" | tee -a "$log"
    return 124
  fi
  ((limit > left)) && limit=$left
  timeout "$limit" "$@" >>"$log" 2>&1
  rc=$?
  echo "   (exit $rc, $((SECONDS - start)) s)" | tee -a "$log"
  return $rc
}

: >"$log"
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv,noheader
  python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nproc; } 2>&1 | tee -a "$log"

say "configure (Release, tests on, one ctest entry per test executable except the trainer's)"
configure_gpu_build "$build" "$OUT/configure.log" -DLUCID_AMP_BUILD_TESTS=ON \
  -DLUCID_AMP_DISCOVER_TESTS=OFF -DLUCID_AMP_BUILD_BENCHMARKS=OFF || exit 1
grep "lucid_amp:" "$OUT/configure.log" | tee -a "$log"

say "build: lucid_amp_trainer test_trainer lucid_amp_lm test_lm"
start=$SECONDS
if ! cmake --build "$build" -j 16 --target lucid_amp_trainer test_trainer lucid_amp_lm test_lm \
    >"$OUT/build.log" 2>&1; then
  grep -E "error|FAILED" -A3 "$OUT/build.log" | head -60 | tee -a "$log"
  exit 1
fi
echo "   built in $((SECONDS - start)) s" | tee -a "$log"

say "tests: the trainer's and the LM's (EndToEnd and LmShortRun on the carried data)"
# -V: every test's own output goes to ctest.log, so that a CUDA case that skipped shows.
start=$SECONDS
timeout $((deadline - SECONDS)) ctest --test-dir "$build" -V -j 4 --timeout 150 \
  -R '^(trainer_|lm_|test_lm$|IdxFiles|Fp16Range|Resume|EndToEnd)' >"$OUT/ctest.log" 2>&1
echo "   (exit $?, $((SECONDS - start)) s)" | tee -a "$log"
grep -E "tests passed|tests failed|Total Test time|\*\*\*Failed|^[0-9]+: \[ *(OK|FAILED|SKIPPED) \]|measured" \
  "$OUT/ctest.log" | grep -v -E "IdxFiles|Fp16Range|Resume" | tee -a "$log"

trainer=$build/apps/trainer/lucid_amp_trainer
lm=$build/apps/lm/lucid_amp_lm
have_gnuplot=$(command -v gnuplot >/dev/null && echo yes || echo no)
plot_flag=(); [ "$have_gnuplot" = yes ] || plot_flag=(--no-plot)
echo "gnuplot here: $have_gnuplot" | tee -a "$log"

say "CNN --compare on CUDA: $epochs epochs of all 60000 images, batch 64 (defaults)"
stage 240 "$trainer" --device cuda --compare --epochs "$epochs" --no-progress \
  --out /tmp/cnn "${plot_flag[@]}"
cp /tmp/cnn/train_log.csv "$OUT/cnn_train_log.csv" 2>/dev/null
cp /tmp/cnn/train_curves.png "$OUT/cnn_train_curves.png" 2>/dev/null ||
  cp /tmp/cnn/train_curves.gp "$OUT/cnn_train_curves.gp" 2>/dev/null

# The LM (ordinary mean token loss; GPT d=256, 6 layers, 8 heads, context 256) at three
# token batches: 16384 tokens a step (all four precisions, the CSV and plot), 65536 (all
# four; GPT recipes average over far more, through accumulation) and 2048 (fp32 against
# unscaled fp16).
lm_shape=(--context 256 --d-model 256 --layers 6 --heads 8 --no-progress)
say "LM --compare on CUDA: batch 64 x 256 = 16384 tokens a step, $lm_steps steps"
stage 150 "$lm" --device cuda --compare --steps "$lm_steps" --batch-size 64 --eval-batches 16 \
  "${lm_shape[@]}" --out /tmp/lm "${plot_flag[@]}"
cp /tmp/lm/lm_log.csv "$OUT/lm_log.csv" 2>/dev/null
cp /tmp/lm/lm_curves.png "$OUT/lm_curves.png" 2>/dev/null ||
  cp /tmp/lm/lm_curves.gp "$OUT/lm_curves.gp" 2>/dev/null

# One epoch each. The first is the ordinary batch-mean loss; the others are the
# default data-set-normalised loss with gradients made smaller still (loss weight, head).
say "CNN sweep on CUDA: where does unscaled float16 stop learning? (1 epoch each)"
sweep() {
  echo "-- sweep: $*" | tee -a "$log"
  stage 60 "$trainer" --device cuda --compare --epochs 1 --no-progress --no-plot \
    --out /tmp/sweep "$@"
}
sweep --modes fp32,fp16 --loss-norm batch
sweep --modes fp32,fp16 --loss-norm batch --loss-weight 0.001
sweep --modes fp32,fp16,fp16-scaled --loss-weight 0.125
sweep --modes fp32,fp16,fp16-scaled --loss-weight 0.015625
sweep --modes fp32,fp16,fp16-scaled --head-gain 0.01

say "LM --compare on CUDA: batch 256 x 256 = 65536 tokens a step, $((lm_steps / 3)) steps"
stage 150 "$lm" --device cuda --compare --steps "$((lm_steps / 3))" --batch-size 256 \
  --eval-batches 4 "${lm_shape[@]}" --no-plot --out /tmp/lm_large

say "LM on CUDA: batch 8 x 256 = 2048 tokens a step, fp32 against unscaled fp16"
stage 90 "$lm" --device cuda --compare --modes fp32,fp16 --steps "$lm_steps" --batch-size 8 \
  --eval-batches 128 "${lm_shape[@]}" --no-plot --out /tmp/lm_small
say "done in $SECONDS s"
