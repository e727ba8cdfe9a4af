#pragma once

// lucid-amp's CUDA kernels, seen from C++: plain pointers and a stream, no LibTorch
// types, so that the .cu files compile with nvcc alone. Unchecked on purpose: the
// callers in src/cuda/*.cpp own every precondition below. Each launcher returns
// cudaGetLastError() after its launch; callers wrap it in C10_CUDA_CHECK.
//
// NOTE: [Multi-tensor ranges]
// A launch covers a list of tensors as if they were one flat array of N elements, cut
// into fixed chunks of C elements (8K for the unscale pass, 32K for the read-only check,
// 16K for the optimizers; NOTE: [Chunk size] in multi_tensor_kernels.cu): block b takes
// the elements [b*C, (b+1)*C) of the concatenation, which may span several tensors, so
// one launch suffices for any list, small tensors share a block, and there are many more
// blocks than fit at once, so the hardware balances them. Inside a block, each tensor
// segment is walked in 16-byte vectors where every pointer of the segment is 16-byte
// aligned, element by element otherwise.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "optim/fused_hyper.h"

namespace lucid {
namespace amp {
namespace cuda {

enum class ElementType { kFloat32, kFloat64, kBFloat16 };

// A device buffer of int64 describing `num_tensors` tensors:
//   [0, n]                  element offsets: first global element of each tensor; entry n
//                           is the total number of elements
//   then `depth` lists of n pointers (stored as int64): list d starts at n + 1 + d * n.
// All lists of one launch have the same element type unless a kernel says otherwise.
struct TensorTable {
  const int64_t* data = nullptr;
  int num_tensors = 0;
  int depth = 0;
  int64_t total_elements = 0;
};

// Unscale in place and check: list 0 = gradients. Multiplies by 1/scale (float64 for
// float64 lists, else 1/scale rounded to float32, PyTorch's rule) and sets *found_inf = 1
// if any result is non-finite. `scale` and `found_inf` are device pointers.
cudaError_t launch_unscale_and_check(const TensorTable& table, ElementType type, const float* scale,
                              float* found_inf, cudaStream_t stream);

// Read-only check: list 0 = gradients; sets *found_inf = 1 if any gradient times 1/scale
// (times 1 when `scale` is null) is non-finite. Writes nothing else.
cudaError_t launch_check_finite(const TensorTable& table, ElementType type, const float* scale,
                         float* found_inf, cudaStream_t stream);

using optim::detail::AdamHyper;
using optim::detail::SgdHyper;

// Lists: 0 params, 1 grads, 2 exp_avg, 3 exp_avg_sq, 4 max_exp_avg_sq (amsgrad only),
// last: step counters (float32, one element each; read, not written). Gradients are
// multiplied by 1/scale when `scale` is not null; nothing is written when *found_inf != 0
// (`found_inf` may be null). Element types: float32 or float64 for all lists but steps.
cudaError_t launch_fused_adam(const TensorTable& table, ElementType type, const AdamHyper& hyper,
                       const float* scale, const float* found_inf, cudaStream_t stream);

// Lists: 0 params, 1 grads, 2 momentum buffers (momentum != 0 only), last: step counters
// (0 means the buffer is still to be initialised with the first gradient).
cudaError_t launch_fused_sgd(const TensorTable& table, ElementType type, const SgdHyper& hyper,
                      const float* scale, const float* found_inf, cudaStream_t stream);

// Adds 1 to each step counter of list `list` unless *found_inf != 0 (found_inf nullable).
cudaError_t launch_increment_steps(const TensorTable& table, int list, const float* found_inf,
                            cudaStream_t stream);

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
