// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The scale update on a CUDA device, seen from C++: plain pointers and a stream, so that
// update_scale_kernel.cu compiles with nvcc alone. Unchecked on purpose:
// src/amp/cuda/backend.cpp owns every precondition below.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "amp/scale_rule.h"

namespace lucid {
namespace amp {
namespace cuda {

// One update by detail::next_scale_state, in one thread, on `stream`.
// Args:
//   scale:            device pointer to the float32 scale.
//   growth_tracker:   device pointer to the int32 growth tracker.
//   overflow_tracker: device pointer to the int32 hysteresis tracker, or null when the
//                     rule's guards are off (it is then taken as 0 and not written).
//   flags:            device pointer to the iteration's `flag_count` float32 overflow
//                     flags (non-zero: overflow), taken and set back to 0
//                     (detail::take_found_inf).
//   rule:             the update's parameters, passed to the kernel by value.
//   counts:           device pointer to detail::kUpdateCountFields int64 counters that the
//                     update advances (detail::count_update), or null.
//   step_outcomes:    device pointer to `flag_count` float32 outcomes of the steps in
//                     `stepped`, counted into `counts` first (detail::count_steps), or null
//                     (then `counts` must not be null where it is not).
//   stepped:          the ordinals whose steps are counted, by value.
//   log:              device pointer to the step log (detail::log_update), or null.
//   grad_norm:        device pointer to the float32 norm the log records, or null (none).
//   site:             device pointer to the iteration's overflow site, which the log
//                     records and sets back (detail::log_update), or null.
// All on one device. Returns cudaGetLastError() after the launch.
cudaError_t launch_update_scale(float* scale, int32_t* growth_tracker, int32_t* overflow_tracker,
                                float* flags, int64_t flag_count, const detail::ScaleRule& rule,
                                int64_t* counts, float* step_outcomes,
                                const detail::SteppedOrdinals& stepped, double* log,
                                const float* grad_norm, int64_t* site, cudaStream_t stream);

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
