// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: routes unscale-and-check and the scale update to a backend table
// (amp/backend.h: src/amp/cpu, src/amp/cuda, src/amp/generic) by device and layout. Not
// installed; tests include it.

#include "amp/backend.h"
#include "amp/flag_read.h"
#include "amp/scale_rule.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

// Multiplies every gradient by 1/scale in place and raises `found_inf` to 1 when any
// unscaled value is non-finite.
// Args:
//   grads:     defined gradients, dense or sparse (sparse ones through their values),
//              float32, float64 or bfloat16, on any devices. The caller has refused
//              other dtypes already (GradScaler::unscale_); this function re-checks
//              nothing beyond that.
//   scale:     float32, 0-dim, on any device; never modified.
//   found_inf: float32, 0-dim, on `scale`'s device. Pre-zeroing is the caller's job;
//              this function only ever raises it.
//   site:      where the non-finite gradients are recorded (OverflowSite in backend.h:
//              a slot on any device and one key per gradient); default: nowhere. Every
//              check below takes it alike.
// Every gradient is divided, non-finite ones too; dtypes never change; bfloat16 is
// unscaled and checked in float32 and rounded back once.
void unscale_grads_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                    at::Tensor& found_inf, const OverflowSite& site = OverflowSite());

// The read-only twin of unscale_grads_: raises `found_inf` when any gradient times
// 1/scale is non-finite, writes no gradient. `scale` may be undefined (gradients already
// unscaled). Used with the fused optimizers, which unscale inside their own update.
void check_grads_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         at::Tensor& found_inf, const OverflowSite& site = OverflowSite());

// The read-only check of check_grads_finite_, with the total norm of the gradients times
// 1/scale (`scale` undefined: the gradients as they are) computed in the same read pass
// for norm_type 2 and inf: returns it as a float32 0-dim tensor on `found_inf`'s device,
// with no host synchronisation. Other norm types (any finite p > 0) take ATen operations,
// PyTorch's clip_grad_norm_ algorithm (the norm of the per-tensor norms). A non-finite
// norm raises `found_inf` too. Deterministic: the same gradients give the same bits.
at::Tensor check_grads_and_norm_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                 at::Tensor& found_inf, double norm_type,
                                 const OverflowSite& site = OverflowSite());

// The check of check_grads_and_norm_, returning the norm's partial instead of the norm,
// float32, 0-dim, on `found_inf`'s device: the sum of |g/scale|^p for a finite norm_type
// p (the fused pass's sum of squares for 2; ATen operations for other p, each gradient's
// sum in its opmath type), the largest |g/scale| for inf; norm_of_partial gives the
// norm. Partials of disjoint sets of gradients combine by a sum (finite p) or a maximum
// (inf), which is what lets ranks that each hold a shard of the gradients agree on the
// norm of all of them. A non-finite partial raises `found_inf`.
at::Tensor check_grads_and_norm_partial_(const std::vector<at::Tensor>& grads,
                                         const at::Tensor& scale, at::Tensor& found_inf,
                                         double norm_type,
                                         const OverflowSite& site = OverflowSite());

// PyTorch's clip coefficient for a total norm: min(max_norm / (norm + 1e-6), 1) in the
// norm's dtype, NaN kept (ATen operations, on the norm's device).
at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm);

// check_grads_and_norm_ and the clip's coefficient folded into the scale: returns the
// norm and sets *divisor to scale / min(max_norm / (norm + 1e-6), 1) (PyTorch's
// coefficient), found_inf raised for a non-finite norm, on the scale's device. For 2 and
// inf with every gradient on the scale's device, the arithmetic after the pass is one
// launch where the device's table has one (AmpBackend::clip_factors_), the same bits as
// the ATen operations that serve otherwise.
at::Tensor check_grads_and_clip_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                 at::Tensor& found_inf, double norm_type, double max_norm,
                                 at::Tensor* divisor, const OverflowSite& site = OverflowSite());

// The norm of a partial of check_grads_and_norm_partial_: partial^(1/p), the square root
// for 2, the partial itself for inf. For 2 and inf the same bits check_grads_and_norm_
// returns.
at::Tensor norm_of_partial(const at::Tensor& partial, double norm_type);

// One update of the scale by detail::next_scale_state, on the scale's device, through its
// device table, with no host synchronisation.
// Args:
//   scale:            float32, 0-dim. Multiplied by backoff when a flag is non-zero and
//                     hysteresis absorbs no more (never below detail::kScaleFloor); by
//                     growth after `growth_interval` clean updates, unless that overflows
//                     float32, capped at rule.max_scale.
//   growth_tracker:   int32, 0-dim, same device: overflow-free updates since the last change.
//   overflow_tracker: int32, 0-dim, same device: overflows absorbed by hysteresis. May be
//                     undefined only where rule.hysteresis is 1 (it would stay 0).
//   flags:            float32, contiguous, at least one entry, same device: the
//                     iteration's overflow flags (non-zero: overflow), taken and set back
//                     to 0 (detail::take_found_inf, NOTE: [Overflow flags]).
//   rule:             its parameters (rule_of); with the guards off, PyTorch's rule.
//   record:           what the update also writes (UpdateRecord in backend.h), same
//                     device: the steps it ends (count_steps), its counts (count_update)
//                     and its row of the step log (log_update); a part left undefined is
//                     not written.
void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, at::Tensor& overflow_tracker,
                   const at::Tensor& flags, const ScaleRule& rule,
                   const UpdateRecord& record = UpdateRecord());

// Counts the steps of an iteration that ends without update_scale_ (update(new_scale),
// or an update with nothing checked), as update_scale_ would (detail::count_steps), with
// tensor ops on the flags' device; leaves the flags as they are.
void count_steps_(const at::Tensor& flags, const UpdateRecord& record);

// Starts reading `found_inf` (float32, 0-dim; or the step log) back to the host behind
// the work queued on its device so far: PendingFlagRead::wait then waits for that work
// only, not for kernels queued after this call (an optimizer's step). Not started
// (PendingFlagRead::started() false) where the flag's device has no such copy, e.g. a CPU
// flag, which is read where it lies.
PendingFlagRead start_flag_read_(const at::Tensor& found_inf);

// Routes every device to the generic ATen-ops backend (the path Apple MPS and other
// devices take) while alive. Lets the tests exercise that path on CPU. Process-wide.
class ForceGenericBackendGuard {
 public:
  ForceGenericBackendGuard();
  ~ForceGenericBackendGuard();
  ForceGenericBackendGuard(const ForceGenericBackendGuard&) = delete;
  ForceGenericBackendGuard& operator=(const ForceGenericBackendGuard&) = delete;

 private:
  bool previous_;
};

// Whether a ForceGenericBackendGuard is alive.
bool generic_backend_forced();

}  // namespace detail
}  // namespace amp
}  // namespace lucid
