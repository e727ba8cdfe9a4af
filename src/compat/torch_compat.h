// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The one place that knows how LibTorch 1.13 and 2.x differ. Everything else calls
// these names only.
//
// Autocast state: 1.13 has one pair of functions per device (is_enabled/set_enabled for
// CUDA, is_cpu_enabled/..., get_autocast_gpu_dtype/...); 2.4 and later take the device
// type as an argument and deprecate the per-device names.

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#define LUCID_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||        \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace lucid {
namespace compat {

inline void check_autocast_device(c10::DeviceType device_type) {
#if LUCID_TORCH_AT_LEAST(2, 4)
  TORCH_CHECK_NOT_IMPLEMENTED(at::autocast::is_autocast_available(device_type),
                              "lucid::amp::autocast: LibTorch has no autocast for device type ",
                              device_type, ".");
#else
  TORCH_CHECK_NOT_IMPLEMENTED(
      device_type == c10::DeviceType::CPU || device_type == c10::DeviceType::CUDA,
      "lucid::amp::autocast: LibTorch ", TORCH_VERSION,
      " has autocast for CPU and CUDA only, got device type ", device_type, ".");
#endif
}

inline bool autocast_enabled(c10::DeviceType device_type) {
#if LUCID_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::is_cpu_enabled()
                                             : at::autocast::is_enabled();
#endif
}

inline void set_autocast_enabled(c10::DeviceType device_type, bool enabled) {
#if LUCID_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(device_type, enabled);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_cpu_enabled(enabled);
  } else {
    at::autocast::set_enabled(enabled);
  }
#endif
}

inline c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
#if LUCID_TORCH_AT_LEAST(2, 4)
  return at::autocast::get_autocast_dtype(device_type);
#else
  return device_type == c10::DeviceType::CPU ? at::autocast::get_autocast_cpu_dtype()
                                             : at::autocast::get_autocast_gpu_dtype();
#endif
}

inline void set_autocast_dtype(c10::DeviceType device_type, c10::ScalarType dtype) {
#if LUCID_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_dtype(device_type, dtype);
#else
  if (device_type == c10::DeviceType::CPU) {
    at::autocast::set_autocast_cpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_gpu_dtype(dtype);
  }
#endif
}

// The key torch::optim::Optimizer::state() uses for a parameter: the address of its
// TensorImpl, as a string in LibTorch 1.13 and as the pointer itself in later versions.
// Fused optimizers key their state the same way so torch::optim's serialize helpers
// save and load it.
template <typename StateMap>
typename StateMap::key_type optimizer_state_key(const at::Tensor& param) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same<Key, std::string>::value) {
    std::ostringstream out;
    out << param.unsafeGetTensorImpl();
    return out.str();
  } else {
    return static_cast<Key>(param.unsafeGetTensorImpl());
  }
}

// Collects the messages of TORCH_WARN while alive, instead of printing them. LibTorch 2.0
// moved the handler's hooks from c10::Warning to c10::WarningUtils and handed process() a
// c10::Warning instead of its parts.
class ScopedWarningCollector : public c10::WarningHandler {
 public:
  ScopedWarningCollector() : previous_(get_handler()) { set_handler(this); }
  ~ScopedWarningCollector() override { set_handler(previous_); }
  ScopedWarningCollector(const ScopedWarningCollector&) = delete;
  ScopedWarningCollector& operator=(const ScopedWarningCollector&) = delete;

#if LUCID_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& warning) override { messages.push_back(warning.msg()); }
#else
  void process(const c10::SourceLocation& /*where*/, const std::string& msg,
               const bool /*verbatim*/) override {
    messages.push_back(msg);
  }
#endif

  std::vector<std::string> messages;

 private:
#if LUCID_TORCH_AT_LEAST(2, 0)
  static c10::WarningHandler* get_handler() { return c10::WarningUtils::get_warning_handler(); }
  static void set_handler(c10::WarningHandler* h) { c10::WarningUtils::set_warning_handler(h); }
#else
  static c10::WarningHandler* get_handler() { return c10::Warning::get_warning_handler(); }
  static void set_handler(c10::WarningHandler* h) { c10::Warning::set_warning_handler(h); }
#endif
  c10::WarningHandler* previous_;
};

}  // namespace compat
}  // namespace lucid
