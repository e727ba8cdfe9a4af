// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The fused optimizers' CUDA kernels, seen from C++: plain pointers and a stream, no
// LibTorch types, so that fused_kernels.cu compiles with nvcc alone. Unchecked on
// purpose: src/optim/cuda/fused_backend.cpp owns every precondition below. Each
// launcher returns cudaGetLastError() after its launch; the caller wraps it in
// C10_CUDA_CHECK.

#include <cuda_runtime_api.h>

#include "cuda_common/tensor_table.h"
#include "optim/fused_kernel_params.h"

namespace lucid {
namespace optim {
namespace cuda {

using cuda_common::ElementType;
using cuda_common::TensorTable;
using detail::AdamHyper;
using detail::AdamList;
using detail::LiveSlot;
using detail::SgdHyper;
using detail::SgdList;

// One Adam/AdamW step.
// Args:
//   table:     the lists of detail::AdamList, step counters last (float32, one element
//              each; read, not written). Element type `type` (float32 or float64) for
//              all lists but the counters.
//   scale:     device pointer or null; gradients are multiplied by 1/scale when set.
//   found_inf: device pointer or null; nothing is written when *found_inf != 0.
// All preconditions are the caller's (fused_backend.cpp).
cudaError_t launch_fused_adam(const TensorTable& table, ElementType type, const AdamHyper& hyper,
                              const float* scale, const float* found_inf, cudaStream_t stream);

// One SGD step over the lists of detail::SgdList, step counters last (0 means the
// momentum buffer is still to be initialised with the first gradient). Args as above.
cudaError_t launch_fused_sgd(const TensorTable& table, ElementType type, const SgdHyper& hyper,
                             const float* scale, const float* found_inf, cudaStream_t stream);

// Adds 1 to each step counter of list `list` unless *found_inf != 0 (found_inf nullable).
cudaError_t launch_increment_steps(const TensorTable& table, int list, const float* found_inf,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace optim
}  // namespace lucid
