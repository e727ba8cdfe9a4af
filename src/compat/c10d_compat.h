// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The one place that knows how c10d (torch.distributed's C++ engine) differs between
// LibTorch 1.13 and 2.x. src/distributed/ calls only these names.
//
// What differs:
// - 1.13: ProcessGroupGloo and ProcessGroupNCCL *are* c10d::ProcessGroup subclasses.
// - 2.0 .. 2.5: they are c10d::Backend subclasses; a c10d::ProcessGroup is built from the
//   store with ProcessGroup::Options(backend name, timeout), which sets its backend type,
//   and the backend is attached per device type with setBackend().
// - 2.6 and later (pytorch#135653): ProcessGroup(store, rank, size) takes no Options; the
//   default backend type is set with setDefaultBackend().
// What does not (and is therefore used directly): Store, FileStore(path, n),
// TCPStore(host, TCPStoreOptions{port, isServer, numWorkers, waitWorkers, timeout}),
// <Backend>::Options::create() and its `timeout` field, ProcessGroupGloo::
// createDeviceForHostname/createDefaultDevice (2.x adds a defaulted lazyInit argument),
// ProcessGroup::allreduce(std::vector<Tensor>&, AllreduceOptions) and Work::wait(timeout).
//
// LibTorch's Gloo and NCCL headers are wrapped in USE_C10D_GLOO / USE_C10D_NCCL. LibTorch
// 1.13's CMake package defines neither; PyTorch 2.11's defines both for every user, even
// though the wheel ships no gloo headers. So our sources include them
// only under LUCID_AMP_HAS_GLOO / LUCID_AMP_HAS_NCCL, which CMakeLists.txt defines (with
// the USE_C10D_* twin) when it found the headers.

#include "compat/torch_compat.h"  // LUCID_TORCH_AT_LEAST

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <initializer_list>

namespace lucid {
namespace compat {

/// AllreduceOptions for an element-wise MAX. (1.13 and 2.x both convert
/// ReduceOp::RedOpType to ReduceOp; spelled once here.)
inline c10d::AllreduceOptions max_allreduce_options() {
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  return opts;
}

/// AllreduceOptions for an element-wise SUM.
inline c10d::AllreduceOptions sum_allreduce_options() {
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::SUM);
  return opts;
}

/// Which c10d backend a group wraps; mirrors ProcessGroup::BackendType of 2.x.
enum class C10dBackend { kGloo, kNccl };

/// Turns a freshly built c10d backend (ProcessGroupGloo or ProcessGroupNCCL) into the
/// c10d::ProcessGroup users pass around, serving tensors of the given device types (as
/// torch.distributed does: Gloo serves CPU and CUDA tensors, NCCL CUDA ones).
/// Unchecked on purpose: the caller built `backend` on this store, rank and size.
template <typename BackendT>
c10::intrusive_ptr<c10d::ProcessGroup> as_process_group(
    c10::intrusive_ptr<BackendT> backend, const c10::intrusive_ptr<c10d::Store>& store, int rank,
    int size, std::initializer_list<c10::DeviceType> device_types, C10dBackend kind,
    std::chrono::milliseconds timeout) {
#if LUCID_TORCH_AT_LEAST(2, 0)
  const auto type = kind == C10dBackend::kGloo ? c10d::ProcessGroup::BackendType::GLOO
                                               : c10d::ProcessGroup::BackendType::NCCL;
#if LUCID_TORCH_AT_LEAST(2, 6)
  (void)timeout;  // 2.6+: the timeout lives in the backend's own options only
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setDefaultBackend(type);
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, size,
      c10::make_intrusive<c10d::ProcessGroup::Options>(kind == C10dBackend::kGloo ? "gloo" : "nccl",
                                                       timeout));
#endif
  const auto as_backend = c10::static_intrusive_pointer_cast<c10d::Backend>(backend);
  for (const c10::DeviceType device_type : device_types) {
    group->setBackend(device_type, type, as_backend);
  }
  return group;
#else
  // 1.13: the backend is the process group.
  (void)store, (void)rank, (void)size, (void)device_types, (void)kind, (void)timeout;
  return c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(backend);
#endif
}

}  // namespace compat
}  // namespace lucid
