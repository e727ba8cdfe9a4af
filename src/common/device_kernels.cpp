// SPDX-License-Identifier: BSD-3-Clause
#include "common/device_kernels.h"

#include "amp/backend.h"
#include "optim/fused_backend.h"

#ifdef LUCID_AMP_WITH_CUDA
#include "cuda_common/stream_capture.h"
#endif

#include <array>

namespace lucid {
namespace {

using Registry = std::array<DeviceKernels, static_cast<size_t>(c10::COMPILE_TIME_MAX_DEVICE_TYPES)>;

// Filled here rather than by a static object in each device's translation unit: lucid_amp
// is a static library by default, and a linker leaves out an object file that nothing
// references, which would silently send CUDA tensors to the generic path. The CUDA tables
// are compiled only against a CUDA LibTorch.
Registry make_registry() {
  Registry registry{};
  // Nothing queued for the CPU is ever captured into a CUDA graph.
  registry[static_cast<size_t>(c10::DeviceType::CPU)] = {&amp::cpu::amp_backend(),
                                                         &optim::cpu::fused_backend(), nullptr};
#ifdef LUCID_AMP_WITH_CUDA
  registry[static_cast<size_t>(c10::DeviceType::CUDA)] = {&amp::cuda::amp_backend(),
                                                          &optim::cuda::fused_backend(),
                                                          cuda_common::current_stream_capturing};
#endif
  return registry;
}

}  // namespace

const DeviceKernels& device_kernels(c10::DeviceType type) {
  static const Registry registry = make_registry();
  static const DeviceKernels none;
  const auto index = static_cast<size_t>(type);
  return index < registry.size() ? registry[index] : none;
}

}  // namespace lucid
