#pragma once

// Generic backend built from ATen operations: runs on any LibTorch device (Apple MPS,
// XPU, ...), one tensor at a time, with no host synchronisation. Its table
// (generic::amp_backend(), amp/backend.h) is the fallback for every device without one
// and for tensors a device table does not take. Unchecked on purpose:
// src/amp/kernel_routing.cpp owns the preconditions (see kernel_routing.h).

#include "amp/scale_rule.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace lucid {
namespace amp {
namespace generic {

// Unscales each gradient and raises `found_inf` to 1 when a value is non-finite.
// Args:
//   grads:     dense (not sparse) tensors, float32, float64 or bfloat16, any device and
//              any strides.
//   scale:     float32, 0-dim, any device.
//   found_inf: float32, 0-dim, any device; only ever raised.
// All preconditions are the caller's (routing).
void unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf);

// Read-only: raises `found_inf` when any gradient times 1/scale (1 if `scale` is
// undefined) is non-finite. Args as unscale_and_check_; `scale` may be undefined.
void check_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                   at::Tensor& found_inf);

// The scale update as tensor ops on the scale's own device.
// Args:
//   scale:          float32, 0-dim.
//   growth_tracker: int32, 0-dim, on `scale`'s device.
//   found_inf:      float32, 0-dim, on `scale`'s device.
// All preconditions are the caller's (routing, and the scaler's own checks).
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

// The same with guards (detail::next_scale_state's rule as selects, in float32).
// Args: as update_scale_, and
//   overflow_tracker: int32, 0-dim, on `scale`'s device: overflows absorbed by hysteresis.
//   guards:           hysteresis, its refill mode and the growth cap.
void update_scale_guarded_(at::Tensor& scale, at::Tensor& growth_tracker,
                           at::Tensor& overflow_tracker, const at::Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval,
                           const detail::ScaleGuards& guards);

}  // namespace generic
}  // namespace amp
}  // namespace lucid
