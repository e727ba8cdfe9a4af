// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// What a GradScaler needs of an optimizer, whoever implements it: a C++
/// torch::optim::Optimizer (GradScaler's overloads build the view themselves), a Python
/// torch.optim optimizer (the Python package builds one per call), or a user's own
/// optimizer class.

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <vector>

namespace lucid {
namespace amp {

/// Names one optimizer to a GradScaler from one call to the next: compared and hashed,
/// never dereferenced, and it keeps nothing alive. A C++ optimizer's key is its address
/// (any pointer converts: `&optimizer`); a front without C++ objects makes one from a
/// number unique among the optimizers alive (from_id: the Python front uses id()). The
/// default key is null and names no optimizer.
class OptimizerKey {
 public:
  /// The null key.
  constexpr OptimizerKey() noexcept = default;
  /// The key of the object at `address` (`&optimizer`).
  OptimizerKey(const void* address) noexcept  // NOLINT(google-explicit-constructor): `&opt`
      : id_(reinterpret_cast<std::uintptr_t>(address)) {}
  /// The key numbered `id` (0 is the null key).
  static constexpr OptimizerKey from_id(std::uintptr_t id) noexcept { return OptimizerKey(id, 0); }

  /// The number the key compares by: the address, or from_id's number.
  constexpr std::uintptr_t id() const noexcept { return id_; }
  /// Whether the key names an optimizer (is not null).
  constexpr explicit operator bool() const noexcept { return id_ != 0; }

  /// Whether two keys name the same optimizer.
  friend constexpr bool operator==(OptimizerKey a, OptimizerKey b) noexcept {
    return a.id_ == b.id_;
  }
  /// Whether two keys name different optimizers.
  friend constexpr bool operator!=(OptimizerKey a, OptimizerKey b) noexcept {
    return a.id_ != b.id_;
  }
  /// Prints the number in hexadecimal, as a pointer prints.
  friend std::ostream& operator<<(std::ostream& out, OptimizerKey key) {
    const auto flags = out.flags();
    out << "0x" << std::hex << key.id_;
    out.flags(flags);
    return out;
  }

 private:
  constexpr OptimizerKey(std::uintptr_t id, int /*tag*/) noexcept : id_(id) {}
  std::uintptr_t id_ = 0;
};

/// A non-owning view of one optimizer for one GradScaler call. Build it right before the
/// call; everything it refers to must outlive the call.
struct OptimizerView {
  /// Identifies the optimizer from one call to the next (a C++ optimizer's address):
  /// the scaler keeps the optimizer's stage and overflow flag under this key until
  /// update(). Must not be null.
  OptimizerKey key;
  /// The optimizer's parameters, one list per param group, in the optimizer's order.
  /// Gradients are read from them (`param.grad()`); undefined gradients are passed over.
  std::vector<c10::ArrayRef<at::Tensor>> param_groups;
  /// Runs the optimizer's step once. Needed by GradScaler::step only.
  std::function<void()> step;
  /// Set only for a scaler-aware optimizer, which unscales the gradients and skips its
  /// update on the device inside its own step: called right before `step` with the scale
  /// (undefined when the gradients are unscaled already) and the overflow flag (float32,
  /// 0-dim; non-zero means skip). Empty for every other optimizer. The scaler never waits
  /// for such a step: GradScaler::step returns true, and whether the step was skipped
  /// (step_skipped, the counters, the overflow report) reaches the host once the flag's
  /// copy has landed, or when one of those is asked for. The parameters are kept
  /// referenced until update(), for the report.
  std::function<void(at::Tensor scale, at::Tensor found_inf)> set_grad_scaling;
};

}  // namespace amp
}  // namespace lucid

// OptimizerKey is a key of std::unordered_map (outside the API reference, which
// documents lucid's namespaces only).
/// @cond
namespace std {
template <>
struct hash<lucid::amp::OptimizerKey> {
  /// The hash of the key's number.
  size_t operator()(lucid::amp::OptimizerKey key) const noexcept {
    return hash<uintptr_t>()(key.id());
  }
};
}  // namespace std
/// @endcond
