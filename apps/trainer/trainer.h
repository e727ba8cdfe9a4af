// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// One training run of the small CNN in one precision: the loop, per-epoch evaluation,
// the step log that the CSV and plot are made from, and checkpoints.

#include <lucid/amp/grad_scaler.h>
#include <torch/optim/adam.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "idx_reader.h"
#include "model.h"
#include "precision.h"
#include "run_record.h"

namespace lucid {
namespace trainer {

/// How the per-step loss is normalised (NOTE: [Loss normalisation] in trainer.cpp).
enum class LossNorm {
  kBatchMean,   ///< mean over the batch
  kDatasetSum,  ///< sum over the batch divided by the training-set size
};

/// What a run does. Everything that decides the trajectory is here, so a run is a
/// function of its config and data (seeded init, seeded data order, no dropout).
struct TrainConfig {
  apps::Precision precision = apps::Precision::kFp16Scaled;
  std::string device = "cpu";     ///< "cpu" or "cuda"
  int64_t epochs = 1;
  int64_t batch_size = 64;
  double lr = 1e-3;               ///< Adam's learning rate
  double head_init_gain = 1.0;    ///< NOTE: [Small head] in model.cpp
  LossNorm loss_norm = LossNorm::kDatasetSum;
  /// Factor on the per-step loss, 1 by default. Adam divides each gradient by its running
  /// magnitude, so in float32 a factor changes little (up to Adam's epsilon); in float16
  /// it moves every gradient towards (< 1) or away from (> 1) underflow: the knob that
  /// finds where unscaled float16 stops learning (docs/TRAINING.md).
  double loss_weight = 1.0;
  /// CPU float16 emulation: flush results below 2^-14 to 0 (Metal, the reference API's device) or
  /// keep IEEE subnormals (CUDA). NOTE: [float16 range emulation] in fp16_range.cpp.
  bool flush_subnormals = true;
  uint64_t seed = 0;              ///< model init and the data order of every epoch
  int64_t max_steps = 0;          ///< stop after this many steps in all (0: no limit)
  double init_scale = 65536.0;    ///< GradScaler (fp16-scaled only)
  int64_t growth_interval = 20;   ///< GradScaler (fp16-scaled only); short: a demo run
};

/// Outcome of a run (also available part-way through, via Trainer::result()): the totals
/// and step log of every program's run, and the CNN's test accuracies.
struct RunResult : apps::RunRecord {
  std::vector<double> epoch_accuracy;  ///< test accuracy (%) after each finished epoch
  double test_accuracy = 0;            ///< test accuracy (%) at the end of the run
};

/// Trains a SmallCnn with Adam on `train` and evaluates it on `test`. The datasets must
/// outlive the Trainer.
class Trainer {
 public:
  using OnStep = std::function<void(const apps::StepEvent&)>;
  using OnEpoch = std::function<void(int64_t epoch, double test_accuracy)>;

  /// Seeds LibTorch's global generator with config.seed and builds model, optimizer and
  /// scaler. Throws c10::ValueError for a bad config, c10::Error if the device is absent.
  Trainer(TrainConfig config, const Dataset& train, const Dataset& test);

  /// Trains from where the trainer stands (the start, or a loaded checkpoint) until
  /// config.epochs are done or config.max_steps steps have run; evaluates after each
  /// epoch and at the end.
  RunResult run(const OnStep& on_step = {}, const OnEpoch& on_epoch = {});

  /// Test accuracy (%) in the run's precision.
  double evaluate();

  /// Writes model, optimizer, scaler and loop state (epoch, step, log) to `path`.
  void save(const std::string& path);
  /// Loads what save() wrote; the checkpoint's precision, batch size, seed, learning
  /// rate, head gain and training-set size must match this trainer's (c10::ValueError
  /// otherwise), since they decide the trajectory. The file first passes the archive
  /// check of lucid::amp::load_scaler (zip structure, every record's CRC-32, the scaler
  /// entry's checksum): a corrupt or truncated checkpoint, or one in the earlier trainer
  /// format, throws c10::Error and leaves the trainer as it was.
  void load(const std::string& path);

  /// The run so far.
  const RunResult& result() const { return result_; }
  /// Steps per epoch (the last batch may be smaller).
  int64_t steps_per_epoch() const;
  SmallCnn& model() { return model_; }
  lucid::amp::GradScaler& scaler() { return *scaler_; }
  const TrainConfig& config() const { return config_; }

 private:
  at::Tensor epoch_order_(int64_t epoch) const;
  void train_step_(const at::Tensor& index);
  at::Tensor forward_(const at::Tensor& x);

  TrainConfig config_;
  at::Device device_;
  const Dataset& train_;
  const Dataset& test_;
  at::Tensor train_images_, train_labels_, test_images_, test_labels_;  // on device_
  SmallCnn model_{nullptr};
  std::unique_ptr<torch::optim::Adam> optimizer_;
  std::unique_ptr<lucid::amp::GradScaler> scaler_;

  // Loop state: where the next step starts; all of it goes into a checkpoint.
  int64_t epoch_ = 0;
  int64_t batch_ = 0;
  RunResult result_;
};

}  // namespace trainer
}  // namespace lucid
