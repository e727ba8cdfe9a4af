// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The kernels of lucid-amp (unscale and check, clipping, the fused optimizers) read and
// write a tensor's storage directly. A tensor subclass that overrides __torch_dispatch__
// (it carries the Python dispatch key: DTensor, as FSDP2's fully_shard and tensor
// parallelism make it, FakeTensor, and other wrapper subclasses) has no storage of its own
// for them to read, so such a tensor is refused, named, before any kernel runs. Subclasses
// of nn.Parameter with plain storage (FSDP1's FlatParameter) carry no such key and pass.

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace lucid {
namespace common {

inline bool is_plain_tensor(const at::Tensor& t) {
  return !t.key_set().has(c10::DispatchKey::Python);
}

// Throws c10::NotImplementedError unless `t` is a plain tensor. `who` is the operation;
// `which...` name the tensor ("the gradient of parameter ", 3) and, as every TORCH_CHECK
// argument, are formatted only when the check fails: the fused optimizers run this for
// every tensor of every step.
template <typename... Which>
void check_plain_tensor(const at::Tensor& t, const char* who, const Which&... which) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      is_plain_tensor(t), who, ": ", which...,
      " is a tensor subclass that overrides __torch_dispatch__ (such as the DTensor of "
      "FSDP2's fully_shard or of tensor parallelism), whose data lies in local shards that "
      "lucid-amp's kernels cannot reach through it. Nothing was changed. From Python, "
      "lucid_amp.GradScaler unscales such gradients on their local shards; step such "
      "parameters with a torch.optim optimizer.");
}

}  // namespace common
}  // namespace lucid
