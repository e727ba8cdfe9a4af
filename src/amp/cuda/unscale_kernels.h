// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The scaler's CUDA kernels, seen from C++: plain pointers and a stream, no LibTorch
// types, so that unscale_kernels.cu compiles with nvcc alone. Unchecked on purpose:
// src/amp/cuda/backend.cpp owns every precondition below. Each launcher returns
// cudaGetLastError() after its launch; the caller wraps it in C10_CUDA_CHECK.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_common/tensor_table.h"

namespace lucid {
namespace amp {
namespace cuda {

using cuda_common::ElementType;
using cuda_common::TensorTable;

// The list of an unscale or check launch, and after it, where `site` is given, the
// gradients' keys as values (cuda_common::make_table's `values`).
enum GradList : int { kGradList = 0, kKeyList = 1 };

// Unscale in place and check.
// Args:
//   table:     one list (kGradList), the gradients, all of element type `type`; with
//              `site`, their keys too (kKeyList).
//   scale:     device pointer to a float32; gradients are multiplied by 1/scale (float64
//              for float64 lists, else 1/scale rounded to float32, PyTorch's rule).
//   found_inf: device pointer to a float32, set to 1 if any result is non-finite; never
//              cleared.
//   site:      device pointer to the detail::kOverflowSiteFields int64 entries of the
//              iteration's overflow site (NOTE: [Overflow site] in amp/scale_rule.h): its
//              first key lowered to the smallest key of a gradient with a non-finite
//              result, the NaN and inf results added to its counts; null: not recorded.
// All preconditions are the caller's (backend.cpp).
cudaError_t launch_unscale_and_check(const TensorTable& table, ElementType type, const float* scale,
                                     float* found_inf, int64_t* site, cudaStream_t stream);

// Read-only check: sets *found_inf = 1 if any gradient times 1/scale (times 1 when
// `scale` is null) is non-finite, and records in `site` as above. Writes nothing else. Args
// as above.
cudaError_t launch_check_finite(const TensorTable& table, ElementType type, const float* scale,
                                float* found_inf, int64_t* site, cudaStream_t stream);

// The read-only check with the norm's partials: as launch_check_finite, and block b of
// the launch writes partials[b], the sum of squares (inf_norm false) or the largest
// absolute value of its chunk of gradients times 1/scale. `partials` is a device array
// of norm_partials(table) floats.
cudaError_t launch_check_and_norm(const TensorTable& table, ElementType type, const float* scale,
                                  float* found_inf, int64_t* site, float* partials, bool inf_norm,
                                  cudaStream_t stream);
// How many partials launch_check_and_norm writes for `table`.
int norm_partials(const TensorTable& table);

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
