#pragma once

// CUDA backend, for now through ATen's own CUDA AMP kernels (a later issue replaces
// them with lucid-amp's). Unchecked on purpose: src/amp/kernel_routing.cpp owns the
// preconditions. Plain C++: it compiles against CPU-only LibTorch too and is only
// ever called with CUDA tensors.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace lucid {
namespace amp {
namespace cuda {

// Args:
//   grads:     dense CUDA tensors on one device, float32 or bfloat16 (mixed allowed).
//   scale:     float32, 0-dim, any device.
//   found_inf: float32, 0-dim, on the gradients' device; only ever raised.
// ATen's kernel rejects bfloat16, so bfloat16 gradients are widened to float32 copies,
// unscaled and checked there, and rounded back once.
void unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf);

// ATen's _amp_update_scale_: all three tensors on one CUDA device.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
