// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Host side of the multi-tensor launches, shared by the amp and optim CUDA backends:
// turns lists of tensors into device TensorTables (cached, NOTE: [Tensor table cache])
// and LibTorch dtypes into the kernels' element types. Compiled only against a CUDA
// LibTorch. Unchecked on purpose: the backends own the preconditions stated below.

#include <ATen/ATen.h>

#include <vector>

#include "cuda_common/tensor_table.h"

namespace lucid {
namespace cuda_common {

// The table of `lists`, all of one length, on the device of the first tensor; the first
// list gives the element counts. Taken by pointer so that no list is copied on the way.
// `values`, when not empty, one per tensor, follow the lists as one more list of plain
// int64 values (Table::value), outside the table's depth.
TensorTable make_table(const std::vector<const std::vector<at::Tensor>*>& lists,
                       const std::vector<int64_t>& values = {});
TensorTable make_table(const std::vector<std::vector<at::Tensor>>& lists);

// float32, float64 or bfloat16; anything else is an internal error.
ElementType element_type(at::ScalarType dtype);

// Pointer to `t` (float32 0-dim) on `device`, copying it there if needed; `keep` holds
// the copy alive until the launch is queued. Null when `t` is undefined.
const float* float_on(const at::Tensor& t, const at::Device& device, at::Tensor& keep);

}  // namespace cuda_common
}  // namespace lucid
