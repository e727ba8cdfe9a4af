// SPDX-License-Identifier: BSD-3-Clause
// The fused optimizers' multi-tensor CUDA kernels: Adam/AdamW, SGD and the step counter
// increment. NOTE: [Multi-tensor ranges] in cuda_common/tensor_table.h says how work is
// split; the optimizers use the default chunk (NOTE: [Chunk size]), or less for lists of
// small tensors (NOTE: [Chunks for lists of small tensors]).

#include "optim/cuda/fused_kernels.cuh"

namespace lucid {
namespace optim {
namespace cuda {
namespace {

using cuda_common::kThreads;

__global__ void increment_steps_kernel(Table table, int list, const float* found_inf) {
  if (cuda_common::skipped(found_inf)) return;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < table.n; t += gridDim.x * blockDim.x) {
    *static_cast<float*>(table.pointer(list, t)) += 1.0f;
  }
}

// The kernel instantiation a step's hyper-parameters need.
template <typename S>
auto kernel_for(const AdamHyper& h) {
  return h.amsgrad ? adam_kernel<S, true> : adam_kernel<S, false>;
}
template <typename S>
auto kernel_for(const SgdHyper& h) {
  return h.momentum != 0 ? sgd_kernel<S, true> : sgd_kernel<S, false>;
}

// One launch over a table of float32 or float64 lists. The table was built by the caller
// (fused_backend.cpp) from checked lists; an empty one launches nothing.
template <typename Hyper>
cudaError_t launch_fused(const TensorTable& t, ElementType type, const Hyper& h, const float* scale,
                         const float* found_inf, cudaStream_t stream) {
  if (t.total_elements == 0) return cudaSuccess;
  const Table table =
      cuda_common::device_table(t, cuda_common::chunk_for_list(t, cuda_common::kChunkElements));
  return type == ElementType::kFloat64
             ? cuda_common::launch_on_table(kernel_for<double>(h), table, kThreads, 0, stream, h,
                                            scale, found_inf)
             : cuda_common::launch_on_table(kernel_for<float>(h), table, kThreads, 0, stream, h,
                                            scale, found_inf);
}

}  // namespace

cudaError_t launch_fused_adam(const TensorTable& table, ElementType type, const AdamHyper& hyper,
                              const float* scale, const float* found_inf, cudaStream_t stream) {
  return launch_fused(table, type, hyper, scale, found_inf, stream);
}

cudaError_t launch_fused_sgd(const TensorTable& table, ElementType type, const SgdHyper& hyper,
                             const float* scale, const float* found_inf, cudaStream_t stream) {
  return launch_fused(table, type, hyper, scale, found_inf, stream);
}

cudaError_t launch_increment_steps(const TensorTable& table, int list, const float* found_inf,
                                   cudaStream_t stream) {
  if (table.num_tensors == 0) return cudaSuccess;
  const int blocks = (table.num_tensors + kThreads - 1) / kThreads;
  increment_steps_kernel<<<blocks, kThreads, 0, stream>>>(cuda_common::device_table(table), list,
                                                          found_inf);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace optim
}  // namespace lucid
