// SPDX-License-Identifier: BSD-3-Clause
// lucid::amp::autocast: what torch.autocast's __enter__/__exit__ do, as a C++ guard.
// Version differences of LibTorch's autocast state live in compat/torch_compat.h.

#include <lucid/amp/autocast.h>

#include "compat/torch_compat.h"

namespace lucid {
namespace amp {

autocast::autocast(c10::DeviceType device_type) : device_type_(device_type) {
  enter_(c10::nullopt, true);
}

autocast::autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : device_type_(device_type) {
  enter_(dtype, enabled);
}

void autocast::enter_(c10::optional<c10::ScalarType> dtype, bool enabled) {
  compat::check_autocast_device(device_type_);
  if (dtype.has_value()) {
    TORCH_CHECK_VALUE(at::isFloatingType(*dtype),
                      "lucid::amp::autocast: dtype must be a floating type such as Half or "
                      "BFloat16, got ", *dtype, ".");
  }
  prev_enabled_ = compat::autocast_enabled(device_type_);
  prev_dtype_ = compat::autocast_dtype(device_type_);
  if (dtype.has_value() && *dtype != prev_dtype_) {
    compat::set_autocast_dtype(device_type_, *dtype);
    // LibTorch's weight cache is keyed by tensor alone: copies cast to the outer level's
    // dtype would be handed to this level's ops (float16 weights meeting bfloat16
    // activations). Drop them when the dtype changes.
    at::autocast::clear_cache();
  }
  compat::set_autocast_enabled(device_type_, enabled);
  at::autocast::increment_nesting();
}

autocast::~autocast() {
  const bool dtype_changes = compat::autocast_dtype(device_type_) != prev_dtype_;
  // Leaving the outermost level drops the cached low-precision weight copies, as
  // PyTorch's context manager does; so does handing a different dtype back (see enter_).
  if (at::autocast::decrement_nesting() == 0 || dtype_changes) {
    at::autocast::clear_cache();
  }
  compat::set_autocast_enabled(device_type_, prev_enabled_);
  compat::set_autocast_dtype(device_type_, prev_dtype_);
}

bool is_autocast_enabled(c10::DeviceType device_type) {
  compat::check_autocast_device(device_type);
  return compat::autocast_enabled(device_type);
}

c10::ScalarType autocast_dtype(c10::DeviceType device_type) {
  compat::check_autocast_device(device_type);
  return compat::autocast_dtype(device_type);
}

}  // namespace amp
}  // namespace lucid
