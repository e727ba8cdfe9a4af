#pragma once

// The options of a GradScaler and the vocabulary its core shares with every front (C++
// optimizers, the Python package): nothing here knows an optimizer class.

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <limits>

namespace lucid {
namespace amp {

/// Options of a GradScaler; validated once, by the GradScaler constructor.
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
  /// Guard (0 = off): the smallest scale allowed. A backoff that would take the scale
  /// below it throws c10::Error ("the loss is diverging") and changes nothing, instead of
  /// skipping every step while the scale collapses. Finite, >= 0, <= init_scale.
  TORCH_ARG(double, min_scale) = 0.0;
  /// Guard (+inf = off): growth stops at this scale (clamped on the device). > 0, at most
  /// float32's largest value (or +inf), >= init_scale and >= min_scale.
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Guard (1 = off): back off only after this many consecutive overflowing updates
  /// (Megatron-LM's and DeepSpeed's hysteresis); the overflowing steps are still skipped.
  /// In [1, 2147483647].
  TORCH_ARG(int64_t, hysteresis) = 1;
};

/// Where one optimizer is in the current iteration: ready -> unscaled -> stepped, and
/// update() returns every optimizer to ready.
enum class OptimizerStage { kReady, kUnscaled, kStepped };

/// Called with an optimizer's overflow flag (float32, 0-dim, on the scale's device; 0
/// means clean) each time unscale_ or step computes it, before anything reads it. The
/// hook may change the flag in place: a distributed binding all-reduces it (MAX) so that
/// every rank skips and backs off together.
using FoundInfHook = std::function<void(at::Tensor& found_inf)>;

}  // namespace amp
}  // namespace lucid
