// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Base of lucid-amp's fused, scaler-aware optimizers. NOTE: [Scaler-aware optimizers]
/// in src/optim/fused_optimizer.cpp says how they cooperate with GradScaler.

#include <torch/optim/optimizer.h>

namespace lucid {
namespace optim {

/// Implemented by optimizers that unscale the gradients and skip the update on the
/// device inside their own step(), so that a GradScaler needs no separate unscale pass
/// and no host read.
class ScalerAware {
 public:
  /// Destroys the optimizer through its ScalerAware base.
  virtual ~ScalerAware() = default;
  /// For the next step() only: gradients are multiplied by 1/`scale` (undefined: they
  /// are unscaled already), and nothing changes where `found_inf` (float32, 0-dim;
  /// undefined: never skip) is non-zero, step counters included.
  virtual void set_grad_scaling(torch::Tensor scale, torch::Tensor found_inf) = 0;
};

/// A torch::optim::Optimizer whose step is one multi-tensor kernel per parameter group,
/// device and dtype (CPU and CUDA; float32 and float64 parameters).
class FusedOptimizer : public torch::optim::Optimizer, public ScalerAware {
 public:
  void set_grad_scaling(torch::Tensor scale, torch::Tensor found_inf) override;

 protected:
  using torch::optim::Optimizer::Optimizer;

  /// The scaling set for this step (then cleared).
  struct Scaling {
    /// The scale the gradients are divided by (undefined: they are unscaled already).
    torch::Tensor scale;
    /// The overflow flag (float32, 0-dim; non-zero: skip; undefined: never skip).
    torch::Tensor found_inf;
  };
  /// Returns the scaling set for this step and clears it (the next step has none).
  Scaling take_scaling_();

 private:
  Scaling pending_;
};

}  // namespace optim
}  // namespace lucid
