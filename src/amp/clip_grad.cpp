// SPDX-License-Identifier: BSD-3-Clause
// clip_grad_norm_ without a scaler (include/lucid/amp/clip_grad.h), on the routed check
// with the norm in its read pass (kernel_routing.h).

#include <lucid/amp/clip_grad.h>

#include "amp/clip_grad.h"
#include "amp/kernel_routing.h"
#include "common/plain_tensor.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace lucid {
namespace amp {
namespace detail {

void check_clip_arguments(double max_norm, double norm_type, const char* who) {
  TORCH_CHECK_VALUE(std::isfinite(max_norm) && max_norm > 0.0, who,
                    ": max_norm must be finite and > 0, got ", max_norm, ". Nothing was clipped.");
  TORCH_CHECK_VALUE(norm_type > 0.0, who,
                    ": norm_type must be > 0 (2 and inf are the fused ones), got ", norm_type,
                    ". Nothing was clipped.");
}

}  // namespace detail

at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           double norm_type, bool error_if_nonfinite) {
  detail::check_clip_arguments(max_norm, norm_type, "lucid::amp::clip_grad_norm_");
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& grad = parameters[i].grad();
    if (!grad.defined()) {
      continue;
    }
    common::check_plain_tensor(grad, "lucid::amp::clip_grad_norm_", "the gradient of parameter ",
                               i);
    const at::ScalarType dtype = grad.scalar_type();
    TORCH_CHECK_NOT_IMPLEMENTED(
        dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16,
        "lucid::amp::clip_grad_norm_: parameter ", i, " has a ", dtype,
        " gradient; supported: Float, Double, BFloat16 (torch::nn::utils::clip_grad_norm_ "
        "takes the others).");
    grads.push_back(grad);
  }
  if (grads.empty()) {
    return at::zeros({}, at::TensorOptions().dtype(at::kFloat));
  }
  at::Tensor found_inf = at::zeros({}, grads.front().options().dtype(at::kFloat));
  at::Tensor norm = detail::check_grads_and_norm_(grads, at::Tensor(), found_inf, norm_type);
  TORCH_CHECK(!error_if_nonfinite || norm.isfinite().item<bool>(), "The total norm of order ",
              norm_type,
              " for gradients from `parameters` is non-finite, so it cannot be "
              "clipped. Nothing was changed. To clip by the non-finite norm anyway (the "
              "gradients then become NaN), set error_if_nonfinite to false.");
  const at::Tensor coefficient = detail::clip_coefficient(norm, max_norm);
  // One write pass: the unscale kernel with 1/coefficient as the scale.
  detail::unscale_grads_(grads, coefficient.reciprocal(), found_inf);
  return norm;
}

}  // namespace amp
}  // namespace lucid
