// SPDX-License-Identifier: BSD-3-Clause
// CPU twin of the device-side scale update (src/amp/cuda/update_scale_kernel.cu): both
// take the iteration's flags (detail::take_found_inf), apply detail::next_scale_state (the
// rule, in amp/scale_rule.h) and write the result back, so a schedule is identical on any
// device; both count the steps it ends (detail::count_steps) and what the update did
// (detail::count_update), and log it
// (detail::log_update) where asked to.

#include "amp/cpu/amp_kernels.h"

namespace lucid {
namespace amp {
namespace cpu {

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, at::Tensor& overflow_tracker,
                   const at::Tensor& flags, const detail::ScaleRule& rule,
                   const UpdateRecord& record) {
  float* scale_ptr = scale.data_ptr<float>();
  int32_t* tracker_ptr = growth_tracker.data_ptr<int32_t>();
  int32_t* overflow_ptr =
      overflow_tracker.defined() ? overflow_tracker.data_ptr<int32_t>() : nullptr;
  if (record.step_outcomes.defined()) {
    detail::count_steps(record.counts.data_ptr<int64_t>(), record.step_outcomes.data_ptr<float>(),
                        flags.data_ptr<float>(), flags.numel(), record.stepped);
  }
  const float flag = detail::take_found_inf(flags.data_ptr<float>(), flags.numel());
  const bool found = flag != 0.0f;
  detail::ScaleEvent event = detail::ScaleEvent::kNone;
  const detail::ScaleState state{*scale_ptr, *tracker_ptr,
                                 overflow_ptr != nullptr ? *overflow_ptr : 0};
  const detail::ScaleState next = detail::next_scale_state(state, found, rule, &event);
  *scale_ptr = next.scale;
  *tracker_ptr = next.growth_tracker;
  if (overflow_ptr != nullptr) {
    *overflow_ptr = next.overflow_tracker;
  }
  if (record.counts.defined()) {
    detail::count_update(record.counts.data_ptr<int64_t>(), found, event);
  }
  if (record.log.defined()) {
    detail::log_update(
        record.log.data_ptr<double>(), state.scale, next.scale, flag, event,
        record.grad_norm.defined() ? record.grad_norm.data_ptr<float>() : nullptr,
        record.overflow_site.defined() ? record.overflow_site.data_ptr<int64_t>() : nullptr);
  }
}

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
