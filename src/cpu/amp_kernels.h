#pragma once

// CPU kernels for loss scaling. Unchecked on purpose: src/amp/kernel_routing.cpp owns
// every precondition stated below.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace lucid {
namespace amp {
namespace cpu {

// Multi-tensor unscale-and-check: one parallel pass over all of `grads`.
// Args:
//   grads:     CPU tensors, each non-overlapping and dense, float32, float64 or
//              bfloat16 (mixed dtypes allowed).
//   inv_scale: 1/scale in float64; float32 and bfloat16 use it rounded to float32.
// Returns whether any unscaled value is non-finite.
bool unscale_and_check_(const std::vector<at::Tensor>& grads, double inv_scale);

// The read-only twin: whether any gradient times inv_scale is non-finite; writes nothing.
bool check_finite(const std::vector<at::Tensor>& grads, double inv_scale);

// The scale and tracker after one update; shared by the CPU kernel below and by the
// host-side update a scaler does before its tensors exist.
struct ScaleState {
  float scale;
  int32_t growth_tracker;
};
ScaleState next_scale_state(ScaleState state, bool found_inf, double growth_factor,
                            double backoff_factor, int64_t growth_interval);

// CPU twin of the device update: scale (float32, 0-dim), growth_tracker (int32, 0-dim)
// and found_inf (float32, 0-dim) all on the CPU.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
