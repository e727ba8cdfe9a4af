// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// lucid::optim::FusedSGD: torch::optim::SGD in one kernel per parameter group, device
/// and dtype, scaler-aware (see fused_optimizer.h).

#include <lucid/optim/fused_optimizer.h>

#include <torch/arg.h>
#include <torch/optim/serialize.h>

#include <vector>

namespace lucid {
namespace optim {

/// Options of FusedSGD, as torch::optim::SGDOptions.
struct FusedSGDOptions : public torch::optim::OptimizerCloneableOptions<FusedSGDOptions> {
  /// Learning rate `lr` (required, as in torch::optim::SGDOptions), no momentum,
  /// dampening or weight decay.
  FusedSGDOptions(double lr);

 public:
  /// Sets the learning rate (>= 0), its device copies included (detail::LiveHyperParameters).
  FusedSGDOptions& lr(double value);
  /// The learning rate.
  double lr() const noexcept { return lr_; }

 public:
  /// Sets the momentum factor (>= 0), its device copies included. Between replays of a
  /// captured step it may change, but not to or from 0 (the graph has momentum buffers
  /// or has none).
  FusedSGDOptions& momentum(double value);
  /// The momentum factor.
  double momentum() const noexcept { return momentum_; }
  /// Dampening of the momentum.
  TORCH_ARG(double, dampening) = 0;

 public:
  /// Sets the L2 penalty (>= 0), its device copies included.
  FusedSGDOptions& weight_decay(double value);
  /// The L2 penalty.
  double weight_decay() const noexcept { return weight_decay_; }
  /// Nesterov momentum (needs momentum > 0 and dampening 0).
  TORCH_ARG(bool, nesterov) = false;

 public:
  /// Reads the options from a checkpoint (keys lr, momentum, dampening,
  /// weight_decay, nesterov).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options into a checkpoint (keys lr, momentum, dampening,
  /// weight_decay, nesterov).
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// The learning rate (what LR schedulers read).
  double get_lr() const override;
  /// Sets the learning rate (what LR schedulers call), its device copies included.
  void set_lr(const double lr) override;
  /// The device copies of the values schedules change, read by the CUDA kernels.
  detail::LiveHyperParameters& live() const noexcept { return live_; }

 private:
  double lr_;
  double momentum_ = 0;
  double weight_decay_ = 0;
  mutable detail::LiveHyperParameters live_;
};

/// Per-parameter state: the step counter (float32 0-dim, on the parameter's device;
/// 0 means the momentum buffer takes the first gradient) and the momentum buffer.
struct FusedSGDParamState : public torch::optim::OptimizerCloneableParamState<FusedSGDParamState> {
  /// Updates applied so far (float32, 0-dim, on the parameter's device).
  TORCH_ARG(torch::Tensor, step);
  /// The momentum buffer (undefined until the first update with momentum).
  TORCH_ARG(torch::Tensor, momentum_buffer) = {};

 public:
  /// Reads the state from a checkpoint (keys step, momentum_buffer).
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the state into a checkpoint (keys step, momentum_buffer).
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// SGD with momentum, dampening, Nesterov and weight decay, fused.
class FusedSGD : public FusedOptimizer {
 public:
  /// Optimizes `param_groups`; options a group does not set come from `defaults`.
  explicit FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                    FusedSGDOptions defaults);
  /// Optimizes `params` as one group with the options `defaults`.
  explicit FusedSGD(std::vector<torch::Tensor> params, FusedSGDOptions defaults);

  /// One update of every parameter with a gradient; a closure is evaluated first.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Saves options and state through torch::serialize.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Loads what save() wrote.
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace optim
}  // namespace lucid
