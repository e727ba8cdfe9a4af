// SPDX-License-Identifier: BSD-3-Clause
#include "amp/backend.h"

#include <array>

namespace lucid {
namespace amp {
namespace {

// One slot per c10::DeviceType; generic is the fallback and needs none.
class AmpBackendRegistry {
 public:
  AmpBackendRegistry() {
    add(c10::DeviceType::CPU, cpu::amp_backend());
    // Registered here rather than by a static object in the CUDA translation unit:
    // lucid_amp is a static library by default, and a linker leaves out an object file
    // that nothing references, which would silently send CUDA tensors to the generic
    // path. The CUDA table is compiled only against a CUDA LibTorch.
#ifdef LUCID_AMP_WITH_CUDA
    add(c10::DeviceType::CUDA, cuda::amp_backend());
#endif
  }

  const AmpBackend* find(c10::DeviceType type) const {
    const auto index = static_cast<size_t>(type);
    return index < tables_.size() ? tables_[index] : nullptr;
  }

 private:
  void add(c10::DeviceType type, const AmpBackend& table) {
    tables_.at(static_cast<size_t>(type)) = &table;
  }

  std::array<const AmpBackend*, static_cast<size_t>(c10::COMPILE_TIME_MAX_DEVICE_TYPES)>
      tables_{};
};

}  // namespace

const AmpBackend* find_amp_backend(c10::DeviceType type) {
  static const AmpBackendRegistry registry;
  return registry.find(type);
}

const AmpBackend& generic_amp_backend() { return generic::amp_backend(); }

}  // namespace amp
}  // namespace lucid
