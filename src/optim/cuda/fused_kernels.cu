// The fused optimizers' multi-tensor CUDA kernels: Adam/AdamW, SGD and the step counter
// increment. NOTE: [Multi-tensor ranges] in cuda_common/tensor_table.h says how work is
// split; the optimizers use the default chunk (NOTE: [Chunk size]).

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

// Unchecked on purpose: launch_fused_adam below has checked the table.
template <typename S>
cudaError_t launch_adam_typed(const TensorTable& t, const AdamHyper& h, const float* scale,
                              const float* found_inf, cudaStream_t stream) {
  const Table table = cuda_common::device_table(t);
  return h.amsgrad ? cuda_common::launch_on_table(adam_kernel<S, true>, table, kThreads, 0,
                                                  stream, h, scale, found_inf)
                   : cuda_common::launch_on_table(adam_kernel<S, false>, table, kThreads, 0,
                                                  stream, h, scale, found_inf);
}

// Unchecked on purpose: launch_fused_sgd below has checked the table.
template <typename S>
cudaError_t launch_sgd_typed(const TensorTable& t, const SgdHyper& h, const float* scale,
                             const float* found_inf, cudaStream_t stream) {
  const Table table = cuda_common::device_table(t);
  return h.momentum != 0 ? cuda_common::launch_on_table(sgd_kernel<S, true>, table, kThreads, 0,
                                                        stream, h, scale, found_inf)
                         : cuda_common::launch_on_table(sgd_kernel<S, false>, table, kThreads,
                                                        0, stream, h, scale, found_inf);
}

}  // namespace

cudaError_t launch_fused_adam(const TensorTable& table, ElementType type, const AdamHyper& hyper,
                              const float* scale, const float* found_inf, cudaStream_t stream) {
  if (table.total_elements == 0) return cudaSuccess;
  return type == ElementType::kFloat64
             ? launch_adam_typed<double>(table, hyper, scale, found_inf, stream)
             : launch_adam_typed<float>(table, hyper, scale, found_inf, stream);
}

cudaError_t launch_fused_sgd(const TensorTable& table, ElementType type, const SgdHyper& hyper,
                             const float* scale, const float* found_inf, cudaStream_t stream) {
  if (table.total_elements == 0) return cudaSuccess;
  return type == ElementType::kFloat64
             ? launch_sgd_typed<double>(table, hyper, scale, found_inf, stream)
             : launch_sgd_typed<float>(table, hyper, scale, found_inf, stream);
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
