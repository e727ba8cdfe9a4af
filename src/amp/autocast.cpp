// SPDX-License-Identifier: BSD-3-Clause
// lucid::amp::autocast: what torch.autocast's __enter__/__exit__ do, as a C++ guard.

#include <lucid/amp/autocast.h>

#include <ATen/autocast_mode.h>

namespace lucid {
namespace amp {

namespace {

void check_autocast_device(c10::DeviceType device_type) {
  TORCH_CHECK_NOT_IMPLEMENTED(at::autocast::is_autocast_available(device_type),
                              "lucid::amp::autocast: LibTorch has no autocast for device type ",
                              device_type, ".");
}

}  // namespace

autocast::autocast(c10::DeviceType device_type) : device_type_(device_type) {
  enter_(c10::nullopt, true);
}

autocast::autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : device_type_(device_type) {
  enter_(dtype, enabled);
}

void autocast::enter_(c10::optional<c10::ScalarType> dtype, bool enabled) {
  check_autocast_device(device_type_);
  if (dtype.has_value()) {
    TORCH_CHECK_VALUE(at::isFloatingType(*dtype),
                      "lucid::amp::autocast: dtype must be a floating type such as Half or "
                      "BFloat16, got ", *dtype, ".");
  }
  prev_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  if (dtype.has_value() && *dtype != prev_dtype_) {
    at::autocast::set_autocast_dtype(device_type_, *dtype);
    // LibTorch's weight cache is keyed by tensor alone: copies cast to the outer level's
    // dtype would be handed to this level's ops (float16 weights meeting bfloat16
    // activations). Drop them when the dtype changes.
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device_type_, enabled);
  at::autocast::increment_nesting();
}

autocast::~autocast() {
  const bool dtype_changes = at::autocast::get_autocast_dtype(device_type_) != prev_dtype_;
  // Leaving the outermost level drops the cached low-precision weight copies, as
  // PyTorch's context manager does; so does handing a different dtype back (see enter_).
  if (at::autocast::decrement_nesting() == 0 || dtype_changes) {
    at::autocast::clear_cache();
  }
  at::autocast::set_autocast_enabled(device_type_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_type_, prev_dtype_);
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  check_autocast_device(device_type);
  return at::autocast::is_autocast_enabled(device_type);
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
  check_autocast_device(device_type);
  return at::autocast::get_autocast_dtype(device_type);
}

}  // namespace amp
}  // namespace lucid
