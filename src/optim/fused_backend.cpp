// SPDX-License-Identifier: BSD-3-Clause
#include "optim/fused_backend.h"

#include <array>

namespace lucid {
namespace optim {
namespace detail {
namespace {

// One slot per c10::DeviceType.
class FusedBackendRegistry {
 public:
  FusedBackendRegistry() {
    add(c10::DeviceType::CPU, cpu::fused_backend());
    // Registered here rather than by a static object in the CUDA translation unit, for
    // the reason src/amp/backend.cpp gives (a static library drops unreferenced objects).
#ifdef LUCID_AMP_WITH_CUDA
    add(c10::DeviceType::CUDA, cuda::fused_backend());
#endif
  }

  const FusedOptimBackend* find(c10::DeviceType type) const {
    const auto index = static_cast<size_t>(type);
    return index < tables_.size() ? tables_[index] : nullptr;
  }

 private:
  void add(c10::DeviceType type, const FusedOptimBackend& table) {
    tables_.at(static_cast<size_t>(type)) = &table;
  }

  std::array<const FusedOptimBackend*, static_cast<size_t>(c10::COMPILE_TIME_MAX_DEVICE_TYPES)>
      tables_{};
};

}  // namespace

const FusedOptimBackend* find_fused_backend(c10::DeviceType type) {
  static const FusedBackendRegistry registry;
  return registry.find(type);
}

}  // namespace detail
}  // namespace optim
}  // namespace lucid
