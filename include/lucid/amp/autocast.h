// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// lucid::amp::autocast: the C++ form of `with lucid.amp.autocast():`.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Optional.h>

namespace lucid {
namespace amp {

/// RAII guard that runs the enclosed ops under autocast for one device type. Nestable:
/// each level restores the enabled flag and dtype it found; leaving the outermost
/// level clears the autocast weight cache, as PyTorch's context manager does. A level
/// that changes the dtype also clears it when it enters and exits, since LibTorch's cache
/// is keyed by tensor alone and would hand one level's casts to the other.
class autocast {
 public:
  /// Enables autocast for `device_type` in the device's default dtype.
  explicit autocast(c10::DeviceType device_type);
  /// `dtype`: the lower-precision type ops are cast to; `enabled`: false makes the
  /// guard a scope in which autocast is off for this device type.
  autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled = true);
  /// Restores the enabled flag and dtype the guard found (see the class description).
  ~autocast();

  /// Not copyable: a guard restores its level exactly once.
  autocast(const autocast&) = delete;
  /// Not copyable.
  autocast& operator=(const autocast&) = delete;

  /// The device type this guard governs.
  c10::DeviceType device_type() const { return device_type_; }

 private:
  void enter_(c10::optional<c10::ScalarType> dtype, bool enabled);

  c10::DeviceType device_type_;
  bool prev_enabled_ = false;
  c10::ScalarType prev_dtype_ = c10::ScalarType::Undefined;
};

/// Whether autocast is on for `device_type` in the calling thread.
bool is_autocast_enabled(c10::DeviceType device_type);
/// The dtype autocast casts to for `device_type` in the calling thread.
c10::ScalarType autocast_dtype(c10::DeviceType device_type);

}  // namespace amp
}  // namespace lucid
