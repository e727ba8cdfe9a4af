// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [The LM's loss]
// The loss is the mean token cross-entropy over the batch's B x T tokens, the loss of
// every GPT recipe. Its gradient with respect to a logit is (p - onehot) / (B x T): with
// 256 byte classes and 8192 tokens a step, a logit whose probability is 1e-3 gets a
// gradient near 1e-7, below float16's smallest normal (2^-14, about 6.1e-5) and close to
// its smallest subnormal (2^-24, about 6e-8). Under float16 autocast the head's backward
// receives these gradients as float16 and the whole network learns from what survives
// the rounding; loss scaling lifts them back into float16's range.

#include "lm_trainer.h"

#include <lucid/amp/autocast.h>
#include <lucid/amp/diagnostics.h>
#include <c10/util/Exception.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <random>

namespace lucid {
namespace lm {

using apps::Precision;

LmTrainer::LmTrainer(LmConfig config, const ByteCorpus& corpus)
    : config_(std::move(config)), device_(apps::parse_training_device(config_.device)) {
  const GptShape& s = config_.shape;
  TORCH_CHECK_VALUE(config_.batch_size >= 1, "batch size must be >= 1, got ",
                    config_.batch_size, ".");
  TORCH_CHECK_VALUE(config_.steps >= 1, "steps must be >= 1, got ", config_.steps, ".");
  TORCH_CHECK_VALUE(config_.lr > 0, "learning rate must be > 0, got ", config_.lr, ".");
  TORCH_CHECK_VALUE(config_.eval_batches >= 1, "evaluation batches must be >= 1.");
  TORCH_CHECK_VALUE(corpus.train.numel() > s.context + 1 && corpus.val.numel() > s.context + 1,
                    "the corpus (", corpus.train.numel(), " training and ", corpus.val.numel(),
                    " validation bytes) is shorter than one ", s.context + 1, "-byte window.");
  if (device_.is_cuda()) apps::use_exact_cuda_float32();
  train_ = corpus.train.to(device_);
  val_ = corpus.val.to(device_);

  torch::manual_seed(config_.seed);
  model_ = TinyGpt(s);  // built on the CPU: the same weights on every device
  model_->to(device_);
  model_->set_fp16_range(apps::is_fp16(config_.precision) && device_.is_cpu(),
                         config_.flush_subnormals);
  optimizer_ = std::make_unique<lucid::optim::FusedAdamW>(
      model_->parameters(),
      lucid::optim::FusedAdamWOptions(config_.lr).weight_decay(config_.weight_decay));
  scaler_ = std::make_unique<lucid::amp::GradScaler>(
      lucid::amp::GradScalerOptions()
          .init_scale(config_.init_scale)
          .growth_interval(config_.growth_interval)
          .enabled(apps::uses_scaler(config_.precision)));
  result_.precision = config_.precision;
  result_.final_scale = scaler_->get_scale();
}

at::Tensor LmTrainer::batch_starts_(int64_t step) const {
  // A generator per step, seeded from (seed, step): every precision sees the same windows
  // in the same order.
  std::mt19937_64 gen(config_.seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(step));
  const auto span = static_cast<uint64_t>(train_.numel() - config_.shape.context - 1);
  std::vector<int64_t> starts(static_cast<size_t>(config_.batch_size));
  for (auto& s : starts) s = static_cast<int64_t>(gen() % (span + 1));
  return at::tensor(starts, at::kLong);
}

at::Tensor LmTrainer::loss_(const at::Tensor& windows) {
  // windows [B, T + 1]: inputs are the first T bytes, targets the last T.
  const int64_t t = windows.size(1) - 1;
  at::Tensor logits;
  {
    std::optional<lucid::amp::autocast> guard;
    if (config_.precision == apps::Precision::kBf16) {
      guard.emplace(device_.type(), at::kBFloat16);
    } else if (apps::is_fp16(config_.precision) && device_.is_cuda()) {
      guard.emplace(device_.type(), at::kHalf);
    }
    logits = model_->forward(windows.narrow(1, 0, t));
  }
  // In float32, as autocast runs cross_entropy; its gradient is cast back to the logits'
  // dtype on the way down (NOTE: [The LM's loss]).
  return torch::nn::functional::cross_entropy(
      logits.to(at::kFloat).reshape({-1, config_.shape.vocab}),
      windows.narrow(1, 1, t).reshape({-1}));
}

// Windows of context + 1 bytes starting at `starts` of `text`, as [B, T + 1].
static at::Tensor windows_at(const at::Tensor& text, const at::Tensor& starts, int64_t context) {
  const auto offsets = at::arange(context + 1, starts.options());
  return text.index_select(0, (starts.unsqueeze(1) + offsets).reshape({-1}))
      .view({starts.size(0), context + 1});
}

void LmTrainer::train_step_(int64_t step) {
  const auto windows = windows_at(train_, batch_starts_(step).to(device_), config_.shape.context);
  model_->train();
  optimizer_->zero_grad();
  const auto loss = loss_(windows);
  scaler_->scale(loss).backward();
  scaler_->step(*optimizer_);
  scaler_->update();
  result_.steps += 1;
  // FusedAdamW skips an overflowing step on the device, so step() cannot say whether it
  // did; the scaler's count of updates that saw an overflow can.
  result_.skipped = scaler_->counters().overflow_updates;
  result_.final_scale = scaler_->get_scale();
  result_.log.push_back(
      apps::StepRecord{result_.steps, loss.item<double>(), result_.final_scale, result_.skipped});
}

double LmTrainer::evaluate() {
  torch::NoGradGuard no_grad;
  model_->eval();
  // Evenly spaced windows over the validation bytes: the same ones in every run.
  const int64_t n = config_.eval_batches * config_.batch_size;
  const int64_t last = val_.numel() - config_.shape.context - 1;
  const auto starts = at::linspace(0, static_cast<double>(last), n, at::kDouble)
                          .to(at::kLong).to(device_);
  double total = 0;
  for (int64_t b = 0; b < config_.eval_batches; ++b) {
    const auto w = windows_at(val_, starts.narrow(0, b * config_.batch_size, config_.batch_size),
                              config_.shape.context);
    total += loss_(w).item<double>();
  }
  return total / static_cast<double>(config_.eval_batches);
}

LmResult LmTrainer::run(const OnStep& on_step) {
  using clock = std::chrono::steady_clock;
  LmResult out;
  out.val_loss_start = evaluate();
  auto t0 = clock::now();
  for (int64_t step = 0; step < config_.steps; ++step) {
    train_step_(step);
    const auto t1 = clock::now();
    result_.train_seconds += std::chrono::duration<double>(t1 - t0).count();
    t0 = t1;
    if (on_step) {
      const auto& last = result_.log.back();
      on_step(apps::StepEvent{0, 1, step + 1, config_.steps, last.step, config_.steps,
                                 last.loss, last.scale, last.skipped, result_.train_seconds});
    }
  }
  out.val_loss = evaluate();
  result_.zero_grad_fraction = model_->grad_zeros().fraction();
  const size_t tail = std::min<size_t>(20, result_.log.size());
  for (size_t i = result_.log.size() - tail; i < result_.log.size(); ++i) {
    out.train_loss_last += result_.log[i].loss / static_cast<double>(tail);
  }
  out.run = result_;
  return out;
}

}  // namespace lm
}  // namespace lucid
