// CPU twin of the device-side scale update (ATen's CUDA _amp_update_scale_ does the
// same in one thread): mirror it line by line so a schedule is identical on any device.

#include "cpu/amp_kernels.h"

#include <cmath>

namespace lucid {
namespace amp {
namespace cpu {

ScaleState next_scale_state(ScaleState state, bool found_inf, double growth_factor,
                            double backoff_factor, int64_t growth_interval) {
  if (found_inf) {
    return {static_cast<float>(state.scale * backoff_factor), 0};
  }
  const int32_t successful = state.growth_tracker + 1;
  if (successful == growth_interval) {
    const float grown = static_cast<float>(state.scale * growth_factor);
    // Never grow past float32's largest finite value: keep the old scale instead.
    return {std::isfinite(grown) ? grown : state.scale, 0};
  }
  return {state.scale, successful};
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

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
