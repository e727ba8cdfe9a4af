// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// CPU fused optimizer kernels: the twins of the CUDA ones (src/optim/cuda/fused_kernels.cuh),
// same formulas in the same order. Unchecked on purpose: src/optim/ owns the
// preconditions (NOTE: [Launch layout] in fused_launch.h): all tensors on the CPU,
// non-overlapping and dense, each laid out as its parameter, of one dtype (float32 or
// float64) per launch except the step counters (float32, one element).

#include <ATen/ATen.h>

#include <vector>

#include "optim/fused_kernel_params.h"

namespace lucid {
namespace optim {
namespace cpu {

// One Adam/AdamW step, then the step counters incremented.
// Args:
//   lists:     in detail::AdamList order, step counters last (bucket_group's checks).
//   inv_scale: gradients are multiplied by it; the caller skips the call when the step
//              must be skipped.
void fused_adam_(const std::vector<std::vector<at::Tensor>>& lists,
                 const detail::AdamHyper& hyper, double inv_scale);

// One SGD step over lists in detail::SgdList order, step counters last. Args as above.
void fused_sgd_(const std::vector<std::vector<at::Tensor>>& lists,
                const detail::SgdHyper& hyper, double inv_scale);

}  // namespace cpu
}  // namespace optim
}  // namespace lucid
