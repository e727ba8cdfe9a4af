// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Base of lucid-amp's fused, scaler-aware optimizers. NOTE: [Scaler-aware optimizers]
/// in src/optim/fused_optimizer.cpp says how they cooperate with GradScaler.

#include <torch/optim/optimizer.h>

#include <memory>

namespace lucid {
namespace optim {

/// Implementation details of lucid::optim; not part of the API.
namespace detail {
class DeviceHyperCopies;
class KeptGroups;

/// Internal. The hyper-parameters of one parameter group that schedules change (learning
/// rate, weight decay, momentum), copied onto each CUDA device the group steps on, where
/// the fused kernels read them. So a step captured in a CUDA graph uses the values of each
/// replay, not those of the capture: setting one through its options' setter (or set_lr,
/// which torch::optim's LR schedulers call) writes the device copies at once, on the
/// current stream, ordered after the work already queued and without a host wait. Every
/// eager step also rewrites a copy that differs from the options. A copy of the options
/// starts without device copies, so groups never share them.
class LiveHyperParameters {
 public:
  /// No device copies yet.
  LiveHyperParameters();
  /// Destroys the device copies.
  ~LiveHyperParameters();
  /// Starts without device copies (each group's options get their own).
  LiveHyperParameters(const LiveHyperParameters& other);
  /// Keeps this object's device copies.
  LiveHyperParameters& operator=(const LiveHyperParameters& other);

  /// Writes `value` into slot `slot` (0: learning rate, 1: weight decay, 2: momentum) of
  /// every device copy, on each device's current stream.
  void write(int slot, double value);
  /// The float64 copy on `device` (CUDA) of `lr`, `weight_decay` and `momentum`, in slot
  /// order: made on first use (which must not be inside a CUDA graph capture: run one step
  /// before capturing) and rewritten where it differs from these values.
  const torch::Tensor& on(const c10::Device& device, double lr, double weight_decay,
                          double momentum);

 private:
  std::unique_ptr<detail::DeviceHyperCopies> copies_;
};

}  // namespace detail

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
  /// Destroys the optimizer and the launch lists it kept.
  ~FusedOptimizer() override;
  /// Moves the optimizer, its state and its kept launch lists (not copyable, as
  /// torch::optim::Optimizer).
  FusedOptimizer(FusedOptimizer&& other) noexcept;
  /// Move-assigns, as the move constructor.
  FusedOptimizer& operator=(FusedOptimizer&& other) noexcept;

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
  Scaling take_scaling();
  /// The launch lists kept between steps (made on first use; internal).
  detail::KeptGroups& kept_groups();

 private:
  Scaling pending_;
  std::unique_ptr<detail::KeptGroups> kept_;
};

}  // namespace optim
}  // namespace lucid
