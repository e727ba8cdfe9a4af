// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// One training run of the byte-level GPT in one precision, with FusedAdamW and a
// GradScaler (enabled for fp16-scaled only), the step log the CNN's CSV and plot take,
// and the validation loss.

#include <lucid/amp/grad_scaler.h>
#include <lucid/optim/fused_adam.h>

#include <memory>
#include <string>

#include "corpus.h"
#include "gpt.h"
#include "precision.h"
#include "run_record.h"

namespace lucid {
namespace lm {

/// What a run does; a run is a function of its config and corpus (seeded init, batches
/// drawn from a generator seeded per step, no dropout).
struct LmConfig {
  apps::Precision precision = apps::Precision::kFp16Scaled;
  std::string device = "cpu";
  GptShape shape;
  int64_t batch_size = 32;        ///< sequences per step; the loss is the mean over B x T
  int64_t steps = 200;
  double lr = 1e-3;               ///< FusedAdamW's
  double weight_decay = 0.01;     ///< FusedAdamW's decoupled decay
  /// CPU float16 emulation: keep IEEE subnormals (CUDA) or flush them (Metal). The LM's
  /// default is CUDA's: the case this model exists to show is real hardware.
  bool flush_subnormals = false;
  uint64_t seed = 0;
  int64_t eval_batches = 8;       ///< validation batches (of batch_size windows each)
  double init_scale = 65536.0;
  int64_t growth_interval = 100;
};

/// Outcome of a run: its totals and step log (time, skipped steps, final scale,
/// zero-gradient share) and the validation loss.
struct LmResult {
  apps::RunRecord run;
  double val_loss_start = 0;   ///< mean token cross-entropy (nats) before training
  double val_loss = 0;         ///< after training
  double train_loss_last = 0;  ///< mean of the last 20 steps' training losses
};

class LmTrainer {
 public:
  using OnStep = std::function<void(const apps::StepEvent&)>;

  /// Seeds LibTorch with config.seed and builds model, FusedAdamW and scaler; the corpus
  /// must outlive the trainer. c10::ValueError for a bad config or a corpus shorter than
  /// one window, c10::Error if the device is absent.
  LmTrainer(LmConfig config, const ByteCorpus& corpus);

  /// Runs config.steps steps and evaluates before and after.
  LmResult run(const OnStep& on_step = {});
  /// Mean token cross-entropy (nats) on the validation windows, in the run's precision.
  double evaluate();

  TinyGpt& model() { return model_; }
  lucid::amp::GradScaler& scaler() { return *scaler_; }

 private:
  at::Tensor batch_starts_(int64_t step) const;
  at::Tensor loss_(const at::Tensor& windows);
  void train_step_(int64_t step);

  LmConfig config_;
  at::Device device_;
  at::Tensor train_, val_;  // on device_
  TinyGpt model_{nullptr};
  std::unique_ptr<lucid::optim::FusedAdamW> optimizer_;
  std::unique_ptr<lucid::amp::GradScaler> scaler_;
  apps::RunRecord result_;
};

}  // namespace lm
}  // namespace lucid
