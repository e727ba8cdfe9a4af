// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// The options of a GradScaler and the vocabulary its core shares with every front (C++
/// optimizers, the Python package): nothing here knows an optimizer class.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <limits>

namespace lucid {
namespace amp {

/// What a backoff below GradScalerOptions::min_scale does.
enum class MinScalePolicy {
  /// Throw c10::Error ("the loss is diverging") and apply nothing: DeepSpeed's
  /// `raise_error_at_min_scale=True`.
  kThrow,
  /// Hold the scale at min_scale and keep skipping the overflowing steps, counted in
  /// ScalerCounters::min_scale_holds: Megatron-LM's DynamicGradScaler, metaseq, and
  /// DeepSpeed's `raise_error_at_min_scale=False`.
  kClamp,
};

/// When the hysteresis count (GradScalerOptions::hysteresis) is refilled.
enum class HysteresisRefill {
  /// Only when the scale grows: Megatron-LM's DynamicGradScaler and DeepSpeed's
  /// DynamicLossScaler with its default `consecutive_hysteresis=False`. Overflows separated
  /// by clean updates still use up the count.
  kOnGrowth,
  /// On every clean update: DeepSpeed's `consecutive_hysteresis=True`. Only an unbroken run
  /// of `hysteresis` overflowing updates backs off.
  kOnCleanUpdate,
};

/// Options of a GradScaler; validated once, by the GradScaler constructor. Each option is
/// a LibTorch TORCH_ARG: a call of its name sets it and returns the options, so calls
/// chain (`GradScalerOptions().init_scale(1024.0).growth_interval(500)`); the call without
/// an argument reads it (`options.init_scale()`).
struct GradScalerOptions {
  /// Initial loss scale: finite and > 0.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Multiplier after `growth_interval` overflow-free updates: finite and > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplier after an overflow: in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Overflow-free updates needed before the scale grows: >= 1.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// When false the scaler is a transparent pass-through.
  TORCH_ARG(bool, enabled) = true;
  /// Opt-in: step() never reads the overflow flag back; skipping happens on the device
  /// inside a scaler-aware optimizer (lucid::optim's fused optimizers; any other is
  /// refused), and step() returns the optimizer's value even when the update was skipped.
  /// Lets a whole training step be captured in a CUDA graph. Off: PyTorch's behaviour.
  TORCH_ARG(bool, graph_safe) = false;
  /// Guard (0 = off): the smallest scale allowed. What a backoff below it does is
  /// `min_scale_policy`. Finite, >= 0, <= init_scale. With the guard off, a backoff still
  /// never takes the scale below float32's smallest normal value (about 1.18e-38): past
  /// that, 0 times the loss and then 1/0 in the unscale would skip every later step.
  TORCH_ARG(double, min_scale) = 0.0;
  /// What a backoff below min_scale does: throw and apply nothing (default), or hold the
  /// scale at min_scale.
  TORCH_ARG(MinScalePolicy, min_scale_policy) = MinScalePolicy::kThrow;
  /// Guard (+inf = off): growth stops at this scale (clamped on the device). > 0, at most
  /// float32's largest value (or +inf), >= init_scale and >= min_scale.
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Guard (1 = off): back off only after this many consecutive overflowing updates
  /// (Megatron-LM's and DeepSpeed's hysteresis); the overflowing steps are still skipped.
  /// In [1, 2147483647].
  TORCH_ARG(int64_t, hysteresis) = 1;
  /// When the hysteresis count is refilled (only matters with hysteresis > 1).
  TORCH_ARG(HysteresisRefill, hysteresis_refill) = HysteresisRefill::kOnGrowth;
  /// After this many consecutive overflowing updates (each skipped its steps), one
  /// warning through LibTorch's warning handler (TORCH_WARN) with the overflow report;
  /// once per streak. 0 = never. >= 0.
  TORCH_ARG(int64_t, overflow_warning_streak) = 100;
  /// Guard (0 = off): the update that would make this many consecutive overflowing
  /// updates throws c10::Error with the overflow report and applies nothing. >= 0.
  TORCH_ARG(int64_t, max_overflow_streak) = 0;
  /// Opt-in: raise PyTorch's errors instead of counting: step() of an optimizer whose
  /// gradients were never checked (none defined) throws "No inf checks were recorded for
  /// this optimizer.", update() with no check since the last one throws "No inf checks
  /// were recorded prior to update."; both c10::Error, changing nothing. Off: such a step
  /// runs and an update leaves the scale and its growth tracker as they are, both counted
  /// (ScalerCounters::steps_without_gradients, updates_without_checks).
  TORCH_ARG(bool, strict_inf_checks) = false;
};

/// Where one optimizer is in the current iteration: ready -> unscaled -> stepped, and
/// update() returns every optimizer to ready.
enum class OptimizerStage {
  /// Neither unscaled nor stepped since the last update(): unscale_ and step are allowed.
  kReady,
  /// unscale_ ran (gradients unscaled and checked): step is allowed, unscale_ throws.
  kUnscaled,
  /// step ran, whether it stepped or skipped the optimizer: unscale_ and step throw
  /// until update().
  kStepped
};

/// The scaler's one extension point for combining each optimizer's overflow flag, and a
/// clip's gradient norm, with other parties before anything reads them: a distributed
/// binding (lucid::distributed::OverflowAgreement) all-reduces them so that every rank
/// skips, backs off and clips alike. Installed with GradScaler::set_found_inf_hook; the
/// scaler calls it on the thread that called the scaler, in call order.
class FoundInfHook {
 public:
  /// Frees the hook.
  virtual ~FoundInfHook() = default;

  /// Called with an optimizer's overflow flag (float32, 0-dim, on the scale's device; 0
  /// means clean) each time unscale_, step or (unless combines_norm()) clip_grad_norm_
  /// computes it, before anything reads it. May change the flag in place: a binding
  /// all-reduces it (MAX). Any non-zero value it leaves is an overflow, and the scaler
  /// then makes the flag exactly 1 (PyTorch's fused optimizers skip only on 1).
  virtual void agree_(at::Tensor& found_inf) = 0;

  /// Whether clip_grad_norm_ calls agree_with_norm_ instead of agree_: true for a binding
  /// whose parties each hold a shard of the parameters, so that each clips by the norm
  /// over all of them. False (the default) keeps clip_grad_norm_'s faster path, which
  /// checks and clips in one pass by this process's own norm.
  virtual bool combines_norm() const { return false; }

  /// Called by clip_grad_norm_, when combines_norm(), with the optimizer's overflow flag
  /// (as for agree_) and the partial of its gradients' total norm, before the norm and
  /// the clip coefficient are computed from it. `norm_partial` is float32, 0-dim, beside
  /// the flag: the sum of |g|^p over the unscaled gradients for a finite `norm_type` p
  /// (the sum of squares for 2), their largest |g| for inf; the norm is then
  /// partial^(1/p), or the partial itself for inf. Partials of disjoint sets of gradients
  /// combine by a sum (finite p) or a maximum (inf), in place. A flag left non-zero, or a
  /// partial left non-finite, skips the step (the returned norm is then inf or NaN). The
  /// default agrees the flag alone and leaves the partial as it is.
  virtual void agree_with_norm_(at::Tensor& found_inf, at::Tensor& norm_partial, double norm_type) {
    (void)norm_partial;
    (void)norm_type;
    agree_(found_inf);
  }
};

}  // namespace amp
}  // namespace lucid
