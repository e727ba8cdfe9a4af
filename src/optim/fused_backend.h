// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the one interface every device's fused optimizer kernels implement. Each
// device folder defines one table: src/optim/cpu, src/optim/cuda (CUDA builds only); the
// launch code (fused_launch.cpp) finds it in the one registry of device kernels
// (common/device_kernels.h). Devices without a table are refused before any launch
// (bucket_params).

#include <ATen/ATen.h>

#include <vector>

#include "optim/fused_kernel_params.h"

namespace lucid {
namespace optim {
namespace detail {

// The entry points of one device's fused kernels, with the same signatures on every
// device. Unchecked on purpose: fused_launch.cpp (bucket_params, Bucket::state) owns the
// preconditions.
struct FusedOptimBackend {
  const char* name;

  // One Adam/AdamW step, counters incremented, or nothing when the step is skipped.
  // Args:
  //   lists:     in AdamList order, step counters last; all tensors on one device of
  //              this table's device type, laid out for a launch (NOTE: [Launch layout]
  //              in fused_launch.h), of one dtype (float32 or float64) except the
  //              counters (float32, one element).
  //   scale:     float32, 0-dim, any device, or undefined: gradients are multiplied by
  //              1/scale when defined.
  //   found_inf: float32, 0-dim, any device, or undefined: the step is skipped when it
  //              is non-zero.
  void (*adam_)(const std::vector<std::vector<at::Tensor>>& lists, const AdamHyper& hyper,
                const at::Tensor& scale, const at::Tensor& found_inf);

  // One SGD step; lists in SgdList order, step counters last. Args as above.
  void (*sgd_)(const std::vector<std::vector<at::Tensor>>& lists, const SgdHyper& hyper,
               const at::Tensor& scale, const at::Tensor& found_inf);
};

}  // namespace detail

// Each device folder's table. cuda::fused_backend() exists in CUDA builds only.
namespace cpu {
const detail::FusedOptimBackend& fused_backend();
}  // namespace cpu
namespace cuda {
const detail::FusedOptimBackend& fused_backend();
}  // namespace cuda

}  // namespace optim
}  // namespace lucid
