// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the one registry of device kernels. Each device folder defines a table per
// feature (the scaler's, amp/backend.h; the fused optimizers', optim/fused_backend.h);
// this registry maps a device type to its tables. Each feature's routing asks here and
// owns what happens where a table is missing (the scaler falls back to its generic ATen
// table, the optimizers refuse the device before any launch).

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

namespace lucid {
namespace amp {
struct AmpBackend;
}  // namespace amp
namespace optim {
namespace detail {
struct FusedOptimBackend;
}  // namespace detail
}  // namespace optim

// One device type's tables; null where that device has none for a feature.
struct DeviceKernels {
  const amp::AmpBackend* amp = nullptr;
  const optim::detail::FusedOptimBackend* optim = nullptr;
  // Whether work queued now for a device of this type is being captured into a CUDA
  // graph (to run on every replay, not now); null where nothing ever is.
  bool (*capturing)(const c10::Device& device) = nullptr;
};

// The tables registered for `type`. Filled once, on first use, and never changed.
const DeviceKernels& device_kernels(c10::DeviceType type);

// Whether work queued now for `device` is being captured into a CUDA graph.
inline bool capturing(const c10::Device& device) {
  const DeviceKernels& kernels = device_kernels(device.type());
  return kernels.capturing != nullptr && kernels.capturing(device);
}

}  // namespace lucid
