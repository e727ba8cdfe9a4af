#include "amp/scale_rule.h"

#include <algorithm>
#include <cmath>

namespace lucid {
namespace amp {
namespace detail {

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

}  // namespace detail
}  // namespace amp
}  // namespace lucid
