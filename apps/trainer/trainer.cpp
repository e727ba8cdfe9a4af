// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [Loss normalisation]
// The objective is the training set's mean loss, (1/N) sum_i loss_i. A step can estimate
// it as the batch mean, (1/B) sum_batch loss_i, or as the batch's share of it,
// (1/N) sum_batch loss_i (kDatasetSum, the default: the normalisation of objectives that
// are written per data set, such as ELBOs, and of losses normalised by a global count,
// such as tokens over accumulated micro-batches). Adam divides each gradient by its own
// running magnitude, so in float32 both train the same way (up to Adam's epsilon). But
// the second makes every gradient N/B times smaller (938 for 60000 images, batch 64):
// every gradient of this small CNN then sits below float16's smallest normal value,
// 2^-14, and most below its smallest subnormal, 2^-24. That is the situation loss
// scaling was made for, and the trainer's default. Measured (README): with the batch
// mean, unscaled float16 loses many more gradient entries than float32 but hardly any
// accuracy on this small model; with kDatasetSum it learns nothing (Metal's flushing)
// or a little less (IEEE subnormals kept), and the GradScaler restores float32's result.
// On the H200 (docs/TRAINING.md), real float16 keeps subnormals and ends 2 epochs 0.11 pp
// behind float32; it fails (-21 pp) once the loss is also multiplied by 1/64.

#include "trainer.h"

#include <lucid/amp/autocast.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

namespace lucid {
namespace trainer {

Trainer::Trainer(TrainConfig config, const Dataset& train, const Dataset& test)
    : config_(std::move(config)), device_(apps::parse_training_device(config_.device)),
      train_(train), test_(test) {
  TORCH_CHECK_VALUE(config_.epochs >= 1, "epochs must be >= 1, got ", config_.epochs, ".");
  TORCH_CHECK_VALUE(config_.batch_size >= 1, "batch size must be >= 1, got ",
                    config_.batch_size, ".");
  TORCH_CHECK_VALUE(config_.lr > 0, "learning rate must be > 0, got ", config_.lr, ".");
  TORCH_CHECK_VALUE(config_.loss_weight > 0, "loss weight must be > 0, got ",
                    config_.loss_weight, ".");
  TORCH_CHECK_VALUE(config_.max_steps >= 0, "max steps must be >= 0, got ",
                    config_.max_steps, ".");
  TORCH_CHECK_VALUE(train.size() > 0 && test.size() > 0,
                    "the training and test sets must not be empty.");
  if (device_.is_cuda()) apps::use_exact_cuda_float32();
  train_images_ = train.images.to(device_);
  train_labels_ = train.labels.to(device_);
  test_images_ = test.images.to(device_);
  test_labels_ = test.labels.to(device_);

  torch::manual_seed(config_.seed);
  model_ = SmallCnn(config_.head_init_gain);
  model_->to(device_);
  // Real float16 autocast exists on CUDA; on the CPU, float16 is emulated.
  model_->set_fp16_range(apps::is_fp16(config_.precision) && device_.is_cpu(),
                         config_.flush_subnormals);
  optimizer_ = std::make_unique<torch::optim::Adam>(model_->parameters(),
                                                    torch::optim::AdamOptions(config_.lr));
  // Every run goes through a GradScaler; only fp16-scaled's is enabled, the others are
  // the reference API's pass-through (scale returns its input, step calls the optimizer).
  scaler_ = std::make_unique<lucid::amp::GradScaler>(
      lucid::amp::GradScalerOptions()
          .init_scale(config_.init_scale)
          .growth_interval(config_.growth_interval)
          .enabled(apps::uses_scaler(config_.precision)));
  result_.precision = config_.precision;
  result_.final_scale = scaler_->get_scale();
}

int64_t Trainer::steps_per_epoch() const {
  return (train_.size() + config_.batch_size - 1) / config_.batch_size;
}

at::Tensor Trainer::epoch_order_(int64_t epoch) const {
  // A fresh generator per epoch, seeded from (seed, epoch): the order of any epoch can be
  // rebuilt from the checkpoint's epoch number alone. Fisher-Yates by hand, since
  // std::shuffle's algorithm is the library's choice.
  std::mt19937_64 gen(config_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(epoch));
  std::vector<int64_t> order(static_cast<size_t>(train_.size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  for (size_t i = order.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(gen() % i);
    std::swap(order[i - 1], order[j]);
  }
  return at::tensor(order, at::kLong);
}

at::Tensor Trainer::forward_(const at::Tensor& x) {
  std::optional<lucid::amp::autocast> guard;
  if (config_.precision == apps::Precision::kBf16) {
    guard.emplace(device_.type(), at::kBFloat16);
  } else if (apps::is_fp16(config_.precision) && device_.is_cuda()) {
    guard.emplace(device_.type(), at::kHalf);
  }
  // The loss is computed in float32, as autocast would do for cross_entropy anyway.
  return model_->forward(x).to(at::kFloat);
}

void Trainer::train_step_(const at::Tensor& index) {
  const auto x = train_images_.index_select(0, index);
  const auto y = train_labels_.index_select(0, index);
  model_->train();
  optimizer_->zero_grad();
  const auto per_example = torch::nn::functional::cross_entropy(
      forward_(x), y,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  const auto loss = (config_.loss_norm == LossNorm::kBatchMean
                         ? per_example.mean()
                         : per_example.sum() / static_cast<double>(train_.size())) *
                    config_.loss_weight;
  scaler_->scale(loss).backward();
  scaler_->step(*optimizer_);
  scaler_->update();

  result_.steps += 1;
  if (scaler_->step_skipped(*optimizer_)) result_.skipped += 1;
  result_.final_scale = scaler_->get_scale();
  result_.log.push_back(
      apps::StepRecord{result_.steps, per_example.mean().item<double>(), result_.final_scale,
                 result_.skipped});
}

double Trainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  int64_t correct = 0;
  const int64_t n = test_images_.size(0);
  for (int64_t start = 0; start < n; start += 1000) {
    const int64_t len = std::min<int64_t>(1000, n - start);
    const auto pred = forward_(test_images_.narrow(0, start, len)).argmax(1);
    correct += pred.eq(test_labels_.narrow(0, start, len)).sum().item<int64_t>();
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

RunResult Trainer::run(const OnStep& on_step, const OnEpoch& on_epoch) {
  using clock = std::chrono::steady_clock;
  const int64_t per_epoch = steps_per_epoch();
  int64_t total = config_.epochs * per_epoch;
  if (config_.max_steps > 0) total = std::min(total, config_.max_steps);

  bool evaluated_last = false;
  while (epoch_ < config_.epochs && (config_.max_steps == 0 || result_.steps < config_.max_steps)) {
    // On the device once per epoch: no host-to-device copy per step.
    const auto order = epoch_order_(epoch_).to(device_);
    auto t0 = clock::now();
    while (batch_ < per_epoch && (config_.max_steps == 0 || result_.steps < config_.max_steps)) {
      const int64_t start = batch_ * config_.batch_size;
      train_step_(order.narrow(0, start, std::min(config_.batch_size, train_.size() - start)));
      ++batch_;
      const auto t1 = clock::now();
      result_.train_seconds += std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
      evaluated_last = false;
      if (on_step) {
        const auto& last = result_.log.back();
        on_step(apps::StepEvent{epoch_, config_.epochs, batch_, per_epoch, last.step, total,
                          last.loss, last.scale, last.skipped, result_.train_seconds});
      }
    }
    if (batch_ == per_epoch) {
      const double acc = evaluate();
      result_.epoch_accuracy.push_back(acc);
      result_.test_accuracy = acc;
      evaluated_last = true;
      ++epoch_;
      batch_ = 0;
      if (on_epoch) on_epoch(epoch_ - 1, acc);
    }
  }
  if (!evaluated_last) result_.test_accuracy = evaluate();
  result_.zero_grad_fraction = model_->grad_zeros().fraction();
  return result_;
}

}  // namespace trainer
}  // namespace lucid
