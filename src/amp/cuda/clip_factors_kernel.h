// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The clip's arithmetic after the norm pass on a CUDA device, seen from C++: plain
// pointers and a stream, so that clip_factors_kernel.cu compiles with nvcc alone.
// Unchecked on purpose: src/amp/cuda/backend.cpp owns every precondition below.

#include <cuda_runtime_api.h>

namespace lucid {
namespace amp {
namespace cuda {

// In one thread on `stream`: norm = sqrt(*partial) (`two`) or *partial; *found_inf = 1
// when the norm is not finite; coefficient = min(max_norm / (norm + 1e-6), 1) in float32
// (NaN stays NaN); *divisor = *scale / coefficient.
// Args: device pointers to float32 values, all on one device; `norm` and `divisor` are
// written. Returns cudaGetLastError() after the launch.
cudaError_t launch_clip_factors(const float* partial, bool two, float max_norm, const float* scale,
                                float* found_inf, float* norm, float* divisor, cudaStream_t stream);

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
