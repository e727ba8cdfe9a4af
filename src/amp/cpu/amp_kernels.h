// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// CPU kernels for loss scaling, and the CPU table of the backend interface
// (amp/backend.h; defined in backend.cpp beside this file). Unchecked on purpose:
// src/amp/kernel_routing.cpp owns every precondition stated below.

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "amp/backend.h"
#include "amp/scale_rule.h"

namespace lucid {
namespace amp {
namespace cpu {

// What a check met (NOTE: [Overflow site] in amp/scale_rule.h): the smallest key of a
// gradient holding a non-finite value once unscaled (detail::kNoOverflowKey: none), and
// how many NaN and inf entries.
struct NonFinite {
  int64_t first = detail::kNoOverflowKey;
  int64_t nan = 0;
  int64_t inf = 0;
  bool any() const { return first != detail::kNoOverflowKey; }
};

// Multi-tensor unscale-and-check: one parallel pass over all of `grads`.
// Args:
//   grads:     CPU tensors, each non-overlapping and dense, float32, float64 or
//              bfloat16 (mixed dtypes allowed). The caller's (routing) check.
//   inv_scale: 1/scale in float64; float32 and bfloat16 use it rounded to float32.
//   keys:      one per gradient (NOTE: [Overflow site] in amp/scale_rule.h), or empty:
//              each gradient's index in the list.
// Returns what it met among the unscaled values (NonFinite).
NonFinite unscale_and_check_(const std::vector<at::Tensor>& grads, double inv_scale,
                             const std::vector<int64_t>& keys);

// The read-only twin: the same result, writing nothing. Args as above.
NonFinite check_finite(const std::vector<at::Tensor>& grads, double inv_scale,
                       const std::vector<int64_t>& keys);

// The read-only check with the norm's partial in the same pass: the sum of squares
// (`inf_norm` false) or the largest absolute value (true) of every gradient times
// inv_scale, in float32 per chunk, the chunks' partials reduced in chunk order (the same
// bits whatever the thread count). NaN reaches the result. Args as above; sets *met to
// what the check returns.
float check_and_norm(const std::vector<at::Tensor>& grads, double inv_scale, bool inf_norm,
                     const std::vector<int64_t>& keys, NonFinite* met);

// The CPU table's scale update: detail::next_scale_state on the host. Args:
// AmpBackend::update_scale_ (amp/backend.h), every tensor on the CPU.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, at::Tensor& overflow_tracker,
                   const at::Tensor& flags, const detail::ScaleRule& rule,
                   const UpdateRecord& record);

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
