#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The main job: install what is missing, build the trainer, and run one short epoch of
# --compare on the CPU: fp32, fp16 without loss scaling, fp16 with the GradScaler and
# bf16, on the first 12800 Fashion-MNIST training images (200 steps of 64; the whole
# 10000-image test set), writing out/train_log.csv and out/train_curves.png.
# Extra arguments go to the trainer (e.g. --train-limit 0 for all 60000 images).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build_dir=${LUCID_AMP_BUILD_DIR:-$root/build}
LUCID_AMP_BUILD_TARGETS=lucid_amp_trainer "$root/scripts/setup.sh" -DLUCID_AMP_BUILD_TESTS=OFF \
  -DLUCID_AMP_BUILD_TRAINER=ON
echo "== running the trainer: one short epoch of --compare on the CPU"
cd "$root"
"$build_dir/apps/trainer/lucid_amp_trainer" --compare --train-limit 12800 --threads "$(nproc)" --out out "$@"
