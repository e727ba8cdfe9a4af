// SPDX-License-Identifier: BSD-3-Clause
// The clip's arithmetic after the norm pass in one thread: what the ATen operations of
// the generic path compute (sqrt, the finiteness test, max_norm / (norm + 1e-6) clamped
// at 1, scale / coefficient), in the same float32 operations, as one launch instead of a
// dozen, so the host's enqueue does not outlast the norm pass before the optimizer's.

#include "amp/cuda/clip_factors_kernel.h"

namespace lucid {
namespace amp {
namespace cuda {
namespace {

__global__ void clip_factors_kernel(const float* partial, bool two, float max_norm,
                                    const float* scale, float* found_inf, float* norm,
                                    float* divisor) {
  const float n = two ? sqrtf(*partial) : *partial;
  if (!isfinite(n)) {
    *found_inf = 1.0f;
  }
  *norm = n;
  const float coefficient = max_norm / (n + 1e-6f);
  // clamp_max keeps NaN: the comparison is false for it
  const float clamped = coefficient > 1.0f ? 1.0f : coefficient;
  *divisor = *scale / clamped;
}

}  // namespace

cudaError_t launch_clip_factors(const float* partial, bool two, float max_norm, const float* scale,
                                float* found_inf, float* norm, float* divisor,
                                cudaStream_t stream) {
  clip_factors_kernel<<<1, 1, 0, stream>>>(partial, two, max_norm, scale, found_inf, norm, divisor);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
