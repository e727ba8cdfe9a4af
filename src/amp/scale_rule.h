#pragma once

// The loss-scale schedule as a pure function: one update of the scale and its trackers.
// Every backend follows it (the CPU kernel calls it, the generic and CUDA paths compute
// the same decisions on the device), and so do the host-side update a scaler does before
// its tensors exist and the host mirror that counts backoffs and growths (NOTE:
// [Diagnostics without host synchronisation]).

#include <cstdint>
#include <limits>

namespace lucid {
namespace amp {
namespace detail {

// The scale and trackers after one update.
struct ScaleState {
  float scale;
  int32_t growth_tracker;
  // Consecutive overflowing updates absorbed by hysteresis, in [0, hysteresis).
  int32_t overflow_tracker = 0;
};

// The guards that change the update itself (min_scale is a check, in src/amp/guards.cpp).
// The defaults are off: next_scale_state is then PyTorch's GradScaler rule exactly.
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

// One update, mirroring ATen's _amp_update_scale_ line by line (in float32, with the
// products formed in float64 and rounded once) so that a schedule is identical on every
// device; the guards are the only additions. Writes what happened to *event when given.
ScaleState next_scale_state(ScaleState state, bool found_inf, double growth_factor,
                            double backoff_factor, int64_t growth_interval,
                            const ScaleGuards& guards = {}, ScaleEvent* event = nullptr);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
