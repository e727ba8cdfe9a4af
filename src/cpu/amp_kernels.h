#pragma once

// CPU kernels for loss scaling. Unchecked on purpose: src/amp/kernel_routing.cpp owns
// every precondition stated below.

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
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

// The scale and trackers after one update; shared by the CPU kernels below, by the
// host-side update a scaler does before its tensors exist, and by the host mirror that
// counts backoffs and growths (NOTE: [Diagnostics without host synchronisation]).
struct ScaleState {
  float scale;
  int32_t growth_tracker;
  // Consecutive overflowing updates absorbed by hysteresis, in [0, hysteresis).
  int32_t overflow_tracker = 0;
};

// The guards that change the update itself (min_scale is a check, in src/amp/guards.cpp).
// The defaults are off: next_scale_state is then the seed's rule exactly.
struct ScaleGuards {
  // Back off only on the hysteresis-th consecutive overflowing update (and on each one
  // after it, until a clean update); 1 backs off on every overflow.
  int64_t hysteresis = 1;
  // Growth is capped here (float32; +inf is no cap).
  float max_scale = std::numeric_limits<float>::infinity();
};

// What one update did.
enum class ScaleEvent {
  kNone,      // clean update, growth interval not reached
  kGrowth,    // growth interval reached: grown by growth_factor (capped), tracker reset
  kAbsorbed,  // overflow absorbed by hysteresis: scale kept
  kBackoff,   // overflow: multiplied by backoff_factor
};

ScaleState next_scale_state(ScaleState state, bool found_inf, double growth_factor,
                            double backoff_factor, int64_t growth_interval,
                            const ScaleGuards& guards = {}, ScaleEvent* event = nullptr);

// CPU twin of the device update: scale (float32, 0-dim), growth_tracker (int32, 0-dim)
// and found_inf (float32, 0-dim) all on the CPU.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval);

// The same with guards; overflow_tracker: int32, 0-dim, on the CPU.
void update_scale_guarded_(at::Tensor& scale, at::Tensor& growth_tracker,
                           at::Tensor& overflow_tracker, const at::Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval,
                           const ScaleGuards& guards);

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
