// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// What a GradScaler needs of an optimizer, whoever implements it: a C++
/// torch::optim::Optimizer (GradScaler's overloads build the view themselves), a Python
/// torch.optim optimizer (the Python package builds one per call), or a user's own
/// optimizer class.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <functional>
#include <vector>

namespace lucid {
namespace amp {

/// A non-owning view of one optimizer for one GradScaler call. Build it right before the
/// call; everything it refers to must outlive the call.
struct OptimizerView {
  /// Identifies the optimizer from one call to the next (a C++ optimizer's address):
  /// the scaler keeps the optimizer's stage and overflow flag under this key until
  /// update(). Must not be null.
  const void* key = nullptr;
  /// The optimizer's parameters, one list per param group, in the optimizer's order.
  /// Gradients are read from them (`param.grad()`); undefined gradients are passed over.
  std::vector<c10::ArrayRef<at::Tensor>> param_groups;
  /// Runs the optimizer's step once. Needed by GradScaler::step only.
  std::function<void()> step;
  /// Set only for a scaler-aware optimizer, which unscales the gradients and skips its
  /// update on the device inside its own step: called right before `step` with the scale
  /// (undefined when the gradients are unscaled already) and the overflow flag (float32,
  /// 0-dim; non-zero means skip). Empty for every other optimizer.
  std::function<void(at::Tensor scale, at::Tensor found_inf)> set_grad_scaling;
  /// For a scaler-aware optimizer only: true lets step() return (true) without reading the
  /// overflow flag back, so that the host does not wait for the device at all (without it,
  /// step() waits for the gradients' check, though not for the optimizer's kernel);
  /// whether the step was skipped (step_skipped, the counters, the overflow report) is then
  /// read at update(), after its kernel is queued, or as soon as one of those is asked
  /// for. The gradients are kept referenced until then, for the report.
  bool defer_outcome = false;
};

}  // namespace amp
}  // namespace lucid
