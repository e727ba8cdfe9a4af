// SPDX-License-Identifier: BSD-3-Clause
// CPU twin of the device-side scale update (ATen's CUDA _amp_update_scale_ does the
// same in one thread): both read the tensors, apply detail::next_scale_state (the rule,
// in amp/scale_rule.h) and write the result back, so a schedule is identical on any
// device. The guards are on only when src/amp/guards.cpp says so.

#include "amp/cpu/amp_kernels.h"

namespace lucid {
namespace amp {
namespace cpu {

using detail::next_scale_state;
using detail::ScaleGuards;
using detail::ScaleState;

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
