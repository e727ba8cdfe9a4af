// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The multi-tensor launch description shared by the amp and optim CUDA kernels, seen
// from C++: plain integers and pointers, no LibTorch and no CUDA types, so that both the
// .cu files (nvcc alone) and the LibTorch launchers include it.
//
// NOTE: [Multi-tensor ranges]
// A launch covers a list of tensors as if they were one flat array of N elements, cut
// into fixed chunks of C elements (NOTE: [Chunk size] in multi_tensor_apply.cuh): block
// b takes the elements [b*C, (b+1)*C) of the concatenation, which may span several
// tensors, so one launch suffices for any list, small tensors share a block, and there
// are many more blocks than fit at once, so the hardware balances them. Inside a block,
// each tensor segment is walked in 16-byte vectors where every pointer of the segment is
// 16-byte aligned, element by element otherwise.

#include <cstdint>

namespace lucid {
namespace cuda_common {

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

}  // namespace cuda_common
}  // namespace lucid
