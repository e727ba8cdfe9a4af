// SPDX-License-Identifier: BSD-3-Clause
// The CUDA table of the fused optimizer interface (optim/fused_backend.h): turns the
// lists into one tensor table and launches the fused kernels (fused_kernels.h) on the
// current stream; the skip on overflow happens on the device. Compiled only against a
// CUDA LibTorch.

#include "optim/fused_backend.h"
#include "cuda_common/table_cache.h"
#include "optim/cuda/fused_kernels.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace lucid {
namespace optim {
namespace cuda {
namespace {

// One fused optimizer step over `lists` (step counters last): launch(table, type, scale,
// found_inf, stream) runs the optimizer's kernel, then the counters are incremented; both
// skip on the device when *found_inf != 0. Args as in detail::FusedOptimBackend;
// unchecked on purpose.
template <typename Launch>
void fused_step_(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& scale,
                 const at::Tensor& found_inf, Launch launch) {
  const at::Tensor& first = lists.front().front();
  const at::Device device = first.device();
  c10::cuda::CUDAGuard guard(device);
  at::Tensor scale_here, found_here;
  const float* scale_ptr = cuda_common::float_on(scale, device, scale_here);
  const float* found_ptr = cuda_common::float_on(found_inf, device, found_here);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const TensorTable table = cuda_common::make_table(lists);
  C10_CUDA_CHECK(
      launch(table, cuda_common::element_type(first.scalar_type()), scale_ptr, found_ptr, stream));
  const int steps_list = table.depth - 1;  // the counters follow the last data list
  C10_CUDA_CHECK(launch_increment_steps(table, steps_list, found_ptr, stream));
}

void table_adam_(const std::vector<std::vector<at::Tensor>>& lists, const AdamHyper& hyper,
                 const at::Tensor& scale, const at::Tensor& found_inf) {
  fused_step_(lists, scale, found_inf,
              [&](const TensorTable& table, ElementType type, const float* scale_ptr,
                  const float* found_ptr, cudaStream_t stream) {
                return launch_fused_adam(table, type, hyper, scale_ptr, found_ptr, stream);
              });
}

void table_sgd_(const std::vector<std::vector<at::Tensor>>& lists, const SgdHyper& hyper,
                const at::Tensor& scale, const at::Tensor& found_inf) {
  fused_step_(lists, scale, found_inf,
              [&](const TensorTable& table, ElementType type, const float* scale_ptr,
                  const float* found_ptr, cudaStream_t stream) {
                return launch_fused_sgd(table, type, hyper, scale_ptr, found_ptr, stream);
              });
}

}  // namespace

const detail::FusedOptimBackend& fused_backend() {
  static const detail::FusedOptimBackend table{"cuda", table_adam_, table_sgd_};
  return table;
}

}  // namespace cuda
}  // namespace optim
}  // namespace lucid
