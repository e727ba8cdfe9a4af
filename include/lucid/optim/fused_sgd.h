#pragma once

// lucid::optim::FusedSGD: torch::optim::SGD in one kernel per parameter group, device
// and dtype, scaler-aware (see fused_optimizer.h).

#include <lucid/optim/fused_optimizer.h>

#include <torch/arg.h>
#include <torch/optim/serialize.h>

#include <vector>

namespace lucid {
namespace optim {

/// Options of FusedSGD, as torch::optim::SGDOptions.
struct FusedSGDOptions : public torch::optim::OptimizerCloneableOptions<FusedSGDOptions> {
  FusedSGDOptions(double lr);
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr);
  /// Momentum factor (>= 0).
  TORCH_ARG(double, momentum) = 0;
  /// Dampening of the momentum.
  TORCH_ARG(double, dampening) = 0;
  /// L2 penalty (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Nesterov momentum (needs momentum > 0 and dampening 0).
  TORCH_ARG(bool, nesterov) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// Per-parameter state: the step counter (float32 0-dim, on the parameter's device;
/// 0 means the momentum buffer takes the first gradient) and the momentum buffer.
struct FusedSGDParamState
    : public torch::optim::OptimizerCloneableParamState<FusedSGDParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, momentum_buffer) = {};

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// SGD with momentum, dampening, Nesterov and weight decay, fused.
class FusedSGD : public FusedOptimizer {
 public:
  explicit FusedSGD(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                    FusedSGDOptions defaults);
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
