#pragma once

// CPU kernels for loss scaling, and the CPU table of the backend interface
// (amp/backend.h; defined in backend.cpp beside this file). Unchecked on purpose:
// src/amp/kernel_routing.cpp owns every precondition stated below.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "amp/scale_rule.h"

namespace lucid {
namespace amp {
namespace cpu {

// Multi-tensor unscale-and-check: one parallel pass over all of `grads`.
// Args:
//   grads:     CPU tensors, each non-overlapping and dense, float32, float64 or
//              bfloat16 (mixed dtypes allowed). The caller's (routing) check.
//   inv_scale: 1/scale in float64; float32 and bfloat16 use it rounded to float32.
// Returns whether any unscaled value is non-finite.
bool unscale_and_check_(const std::vector<at::Tensor>& grads, double inv_scale);

// The read-only twin: whether any gradient times inv_scale is non-finite; writes nothing.
// Args as above.
bool check_finite(const std::vector<at::Tensor>& grads, double inv_scale);

// CPU twin of the device update (detail::next_scale_state with guards off).
// Args:
//   scale:          float32, 0-dim, on the CPU.
//   growth_tracker: int32, 0-dim, on the CPU.
//   found_inf:      float32, 0-dim, on the CPU.
// All three are the caller's (routing, and the scaler's own checks) to ensure.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

// The same with guards.
// Args: as above, and overflow_tracker: int32, 0-dim, on the CPU.
void update_scale_guarded_(at::Tensor& scale, at::Tensor& growth_tracker,
                           at::Tensor& overflow_tracker, const at::Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval,
                           const detail::ScaleGuards& guards);

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
