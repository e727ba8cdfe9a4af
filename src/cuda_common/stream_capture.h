// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Whether work queued now would be captured into a CUDA graph instead of run, shared by
// the amp and optim CUDA backends. Compiled only against a CUDA LibTorch.

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>

namespace lucid {
namespace cuda_common {

// Whether `device`'s current stream is being captured into a CUDA graph.
inline bool current_stream_capturing(const at::Device& device) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(at::cuda::getCurrentCUDAStream(device.index()), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace cuda_common
}  // namespace lucid
