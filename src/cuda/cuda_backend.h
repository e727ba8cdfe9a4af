#pragma once

// CUDA backend: turns tensor lists into TensorTables and launches lucid-amp's own
// kernels (kernels.h) on the current stream. Compiled only against a CUDA LibTorch.
// Unchecked on purpose: the front code (src/amp, src/optim) owns the preconditions.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "cuda/kernels.h"

namespace lucid {
namespace amp {
namespace cuda {

// Args:
//   grads:     dense CUDA tensors on one device, float32, float64 or bfloat16 (mixed).
//   scale:     float32, 0-dim, any device (copied to the gradients' device if elsewhere).
//   found_inf: float32, 0-dim, on the gradients' device; only ever raised.
void unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf);

// As above but reads only: raises found_inf if any gradient times 1/scale is non-finite.
// `scale` may be undefined (gradients already unscaled).
void check_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                   at::Tensor& found_inf);

// ATen's _amp_update_scale_ (a one-thread kernel): all three tensors on one device.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

// One fused optimizer launch over tensors of one device and one dtype (float32 or
// float64); `lists` in the order kernels.h gives for the kernel, the step counters
// (float32 0-dim tensors) last. `scale` and `found_inf` may be undefined.
void fused_adam_(const std::vector<std::vector<at::Tensor>>& lists, const AdamHyper& hyper,
                 const at::Tensor& scale, const at::Tensor& found_inf);
void fused_sgd_(const std::vector<std::vector<at::Tensor>>& lists, const SgdHyper& hyper,
                const at::Tensor& scale, const at::Tensor& found_inf);

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
