// SPDX-License-Identifier: BSD-3-Clause
// The scale update on a CUDA device: detail::take_found_inf and next_scale_state in one
// thread, so that the schedule (its floor and guards included) is the CPU's, bit for bit,
// with no host synchronisation.

#include "amp/cuda/update_scale_kernel.h"

namespace lucid {
namespace amp {
namespace cuda {
namespace {

__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker,
                                    int32_t* overflow_tracker, float* flags, int64_t flag_count,
                                    detail::ScaleRule rule, int64_t* counts, float* step_outcomes,
                                    detail::SteppedOrdinals stepped, double* log,
                                    const float* grad_norm, int64_t* site) {
  detail::ScaleState state{*scale, *growth_tracker,
                           overflow_tracker != nullptr ? *overflow_tracker : 0};
  if (step_outcomes != nullptr) {
    detail::count_steps(counts, step_outcomes, flags, flag_count, stepped);
  }
  const float flag = detail::take_found_inf(flags, flag_count);
  const bool found = flag != 0.0f;
  detail::ScaleEvent event = detail::ScaleEvent::kNone;
  const detail::ScaleState next = detail::next_scale_state(state, found, rule, &event);
  *scale = next.scale;
  *growth_tracker = next.growth_tracker;
  if (overflow_tracker != nullptr) {
    *overflow_tracker = next.overflow_tracker;
  }
  if (counts != nullptr) {
    detail::count_update(counts, found, event);
  }
  if (log != nullptr) {
    detail::log_update(log, state.scale, next.scale, flag, event, grad_norm, site);
  }
}

}  // namespace

cudaError_t launch_update_scale(float* scale, int32_t* growth_tracker, int32_t* overflow_tracker,
                                float* flags, int64_t flag_count, const detail::ScaleRule& rule,
                                int64_t* counts, float* step_outcomes,
                                const detail::SteppedOrdinals& stepped, double* log,
                                const float* grad_norm, int64_t* site, cudaStream_t stream) {
  update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, overflow_tracker, flags,
                                           flag_count, rule, counts, step_outcomes, stepped, log,
                                           grad_norm, site);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
