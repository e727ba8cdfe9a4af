// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// lucid::optim::FusedAdam and FusedAdamW: torch::optim::Adam / AdamW in one kernel per
/// parameter group, device and dtype, scaler-aware (see fused_optimizer.h).

#include <lucid/optim/fused_optimizer.h>

#include <torch/arg.h>
#include <torch/optim/serialize.h>

#include <tuple>
#include <vector>

namespace lucid {
namespace optim {

/// Options of FusedAdam, as torch::optim::AdamOptions.
struct FusedAdamOptions : public torch::optim::OptimizerCloneableOptions<FusedAdamOptions> {
  /// Learning rate `lr`, every other option at torch::optim::AdamOptions' default.
  FusedAdamOptions(double lr = 1e-3);

 public:
  /// Sets the learning rate (>= 0), its device copies included (detail::LiveHyperParameters).
  FusedAdamOptions& lr(double value);
  /// The learning rate.
  double lr() const noexcept { return lr_; }
  /// The type of `betas`: (beta1, beta2).
  typedef std::tuple<double, double> betas_t;
  /// Coefficients of the running averages (each in [0, 1)).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator (>= 0).
  TORCH_ARG(double, eps) = 1e-8;

 public:
  /// Sets the weight decay: L2 penalty for FusedAdam, decoupled decay for FusedAdamW
  /// (>= 0), its device copies included.
  FusedAdamOptions& weight_decay(double value);
  /// The weight decay.
  double weight_decay() const noexcept { return weight_decay_; }
  /// Use the maximum of past squared-gradient averages (AMSGrad).
  TORCH_ARG(bool, amsgrad) = false;

 public:
  /// Reads the options from a checkpoint (keys lr, betas, eps, weight_decay,
  /// amsgrad).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options into a checkpoint (keys lr, betas, eps, weight_decay,
  /// amsgrad).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override;
  /// Sets the learning rate (what LR schedulers call), its device copies included.
  void set_lr(const double lr) override;
  /// The device copies of the values schedules change, read by the CUDA kernels.
  detail::LiveHyperParameters& live() const noexcept { return live_; }

 private:
  double lr_ = 1e-3;
  double weight_decay_ = 0;
  mutable detail::LiveHyperParameters live_;
};

/// FusedAdamW's options: FusedAdamOptions with torch::optim::AdamWOptions' default decay.
struct FusedAdamWOptions : public FusedAdamOptions {
  /// Learning rate `lr`, weight decay 1e-2, every other option as FusedAdamOptions.
  FusedAdamWOptions(double lr = 1e-3) : FusedAdamOptions(lr) { weight_decay(1e-2); }
};

/// Per-parameter state; `step` is a float32 0-dim tensor on the parameter's device so
/// that a skipped step can leave it unchanged without the host knowing.
struct FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  /// Updates applied so far (float32, 0-dim, on the parameter's device).
  TORCH_ARG(torch::Tensor, step);
  /// Running average of the gradient (first moment).
  TORCH_ARG(torch::Tensor, exp_avg);
  /// Running average of the squared gradient (second moment).
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  /// Largest `exp_avg_sq` so far, element-wise (AMSGrad only; undefined otherwise).
  TORCH_ARG(torch::Tensor, max_exp_avg_sq) = {};

 public:
  /// Reads the state from a checkpoint (keys step, exp_avg, exp_avg_sq,
  /// max_exp_avg_sq).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the state into a checkpoint (keys step, exp_avg, exp_avg_sq,
  /// max_exp_avg_sq).
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adam with L2 weight decay (torch::optim::Adam's update), fused.
class FusedAdam : public FusedOptimizer {
 public:
  /// Optimizes `param_groups`; options a group does not set come from `defaults`.
  explicit FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                     FusedAdamOptions defaults = {});
  /// Optimizes `params` as one group with the options `defaults`.
  explicit FusedAdam(std::vector<torch::Tensor> params, FusedAdamOptions defaults = {});

  /// One update of every parameter with a gradient; a closure is evaluated first.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Saves options and state through torch::serialize.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Loads what save() wrote.
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  /// For FusedAdamW: `decoupled_weight_decay` selects AdamW's update.
  FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
            FusedAdamOptions defaults, bool decoupled_weight_decay);

 private:
  bool decoupled_weight_decay_;
};

/// AdamW (decoupled weight decay, torch::optim::AdamW's update), fused.
class FusedAdamW : public FusedAdam {
 public:
  /// Optimizes `param_groups`; options a group does not set come from `defaults`.
  explicit FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                      FusedAdamOptions defaults = FusedAdamWOptions());
  /// Optimizes `params` as one group with the options `defaults`.
  explicit FusedAdamW(std::vector<torch::Tensor> params,
                      FusedAdamOptions defaults = FusedAdamWOptions());
};

}  // namespace optim
}  // namespace lucid
