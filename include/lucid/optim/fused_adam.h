#pragma once

// lucid::optim::FusedAdam and FusedAdamW: torch::optim::Adam / AdamW in one kernel per
// parameter group, device and dtype, scaler-aware (see fused_optimizer.h).

#include <lucid/optim/fused_optimizer.h>

#include <torch/arg.h>
#include <torch/optim/serialize.h>

#include <tuple>
#include <vector>

namespace lucid {
namespace optim {

/// Options of FusedAdam, as torch::optim::AdamOptions.
struct FusedAdamOptions : public torch::optim::OptimizerCloneableOptions<FusedAdamOptions> {
  FusedAdamOptions(double lr = 1e-3);
  /// Learning rate (>= 0).
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  /// Coefficients of the running averages (each in [0, 1)).
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  /// Added to the denominator (>= 0).
  TORCH_ARG(double, eps) = 1e-8;
  /// L2 penalty for FusedAdam, decoupled decay for FusedAdamW (>= 0).
  TORCH_ARG(double, weight_decay) = 0;
  /// Use the maximum of past squared-gradient averages (AMSGrad).
  TORCH_ARG(bool, amsgrad) = false;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

/// FusedAdamW's options: FusedAdamOptions with torch::optim::AdamWOptions' default decay.
struct FusedAdamWOptions : public FusedAdamOptions {
  FusedAdamWOptions(double lr = 1e-3) : FusedAdamOptions(lr) { weight_decay(1e-2); }
};

/// Per-parameter state; `step` is a float32 0-dim tensor on the parameter's device so
/// that a skipped step can leave it unchanged without the host knowing.
struct FusedAdamParamState
    : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  TORCH_ARG(torch::Tensor, step);
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  TORCH_ARG(torch::Tensor, max_exp_avg_sq) = {};

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// Adam with L2 weight decay (torch::optim::Adam's update), fused.
class FusedAdam : public FusedOptimizer {
 public:
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                     FusedAdamOptions defaults = {});
  explicit FusedAdam(std::vector<torch::Tensor> params, FusedAdamOptions defaults = {});

  /// One update of every parameter with a gradient; a closure is evaluated first.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Saves options and state through torch::serialize.
  void save(torch::serialize::OutputArchive& archive) const override;
  /// Loads what save() wrote.
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups,
            FusedAdamOptions defaults, bool decoupled_weight_decay);

 private:
  bool decoupled_weight_decay_;
};

/// AdamW (decoupled weight decay, torch::optim::AdamW's update), fused.
class FusedAdamW : public FusedAdam {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      FusedAdamOptions defaults = FusedAdamWOptions());
  explicit FusedAdamW(std::vector<torch::Tensor> params,
                      FusedAdamOptions defaults = FusedAdamWOptions());
};

}  // namespace optim
}  // namespace lucid
