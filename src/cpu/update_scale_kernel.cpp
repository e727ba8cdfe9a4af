// CPU twin of the device-side scale update (ATen's CUDA _amp_update_scale_ does the
// same in one thread): mirror it line by line so a schedule is identical on any device.
// With guards off (hysteresis 1, no max_scale) next_scale_state is exactly that rule;
// the guards are the only additions (src/amp/guards.cpp says when they are on).

#include "cpu/amp_kernels.h"

#include <algorithm>
#include <cmath>

namespace lucid {
namespace amp {
namespace cpu {

ScaleState next_scale_state(ScaleState state, bool found_inf, double growth_factor,
                            double backoff_factor, int64_t growth_interval,
                            const ScaleGuards& guards, ScaleEvent* event) {
  ScaleEvent what = ScaleEvent::kNone;
  ScaleState next = state;
  if (found_inf) {
    next.growth_tracker = 0;
    if (state.overflow_tracker + 1 < guards.hysteresis) {
      // Hysteresis absorbs this overflow: the step was skipped, the scale stays.
      next.overflow_tracker = state.overflow_tracker + 1;
      what = ScaleEvent::kAbsorbed;
    } else {
      // The tracker stays at hysteresis - 1: each further consecutive overflow backs off.
      next.scale = static_cast<float>(state.scale * backoff_factor);
      what = ScaleEvent::kBackoff;
    }
  } else {
    next.overflow_tracker = 0;
    const int32_t successful = state.growth_tracker + 1;
    if (successful == growth_interval) {
      const float grown = static_cast<float>(state.scale * growth_factor);
      // Never grow past float32's largest finite value: keep the old scale instead.
      next.scale = std::isfinite(grown) ? grown : state.scale;
      // max_scale caps growth (never lowers a scale that is below it).
      if (next.scale > guards.max_scale) {
        next.scale = std::max(guards.max_scale, state.scale);
      }
      next.growth_tracker = 0;
      what = ScaleEvent::kGrowth;
    } else {
      next.growth_tracker = successful;
    }
  }
  if (event != nullptr) {
    *event = what;
  }
  return next;
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  float* scale_ptr = scale.data_ptr<float>();
  int32_t* tracker_ptr = growth_tracker.data_ptr<int32_t>();
  const ScaleState next =
      next_scale_state({*scale_ptr, *tracker_ptr}, *found_inf.data_ptr<float>() != 0.0f,
                       growth_factor, backoff_factor, growth_interval);
  *scale_ptr = next.scale;
  *tracker_ptr = next.growth_tracker;
}

void update_scale_guarded_(at::Tensor& scale, at::Tensor& growth_tracker,
                           at::Tensor& overflow_tracker, const at::Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval,
                           const ScaleGuards& guards) {
  float* scale_ptr = scale.data_ptr<float>();
  int32_t* tracker_ptr = growth_tracker.data_ptr<int32_t>();
  int32_t* overflow_ptr = overflow_tracker.data_ptr<int32_t>();
  const ScaleState next = next_scale_state(
      {*scale_ptr, *tracker_ptr, *overflow_ptr}, *found_inf.data_ptr<float>() != 0.0f,
      growth_factor, backoff_factor, growth_interval, guards);
  *scale_ptr = next.scale;
  *tracker_ptr = next.growth_tracker;
  *overflow_ptr = next.overflow_tracker;
}

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
