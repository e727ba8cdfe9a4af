// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the loss scale and its trackers, and the one rule that moves them.
//
// NOTE: [Scaler state on the device]
// The scale (float32) and the growth tracker (int32) are 0-dim tensors on the device of
// the first scale() output; unscale_, clip_grad_norm_ and step refuse to run before it
// (as torch.amp.GradScaler, whose scale is made there too). unscale_ writes each optimizer's
// overflow flag on that device and update() changes the scale there, so neither waits for the
// device. Only step() reads one 4-byte flag back, to decide whether to run the optimizer's step,
// and get_scale()/state_dict() read the scale back (the opt-in guards and diagnostics
// that read more say so: NOTE: [Guards], NOTE: [Diagnostics without host
// synchronisation]). Until the tensors exist the same state is kept on the host,
// advanced by the same rule (detail::next_scale_state).
// The scale is 0-dim so that it never broadcasts a 0-dim loss to shape [1]; float16 and
// bfloat16 outputs are promoted explicitly (a 0-dim float32 operand would not promote them).
//
// NOTE: [Guards]
// The guards are off by default (min_scale 0, max_scale +inf, hysteresis 1); then an
// update runs exactly PyTorch's rule through the scale device's update kernel (the CPU
// twin, lucid-amp's CUDA kernel, or the generic ops elsewhere) and reads nothing back.
// - max_scale and hysteresis change the update itself: the same kernel applies them
//   (detail::next_scale_state with its ScaleRule); still no host synchronisation.
//   Hysteresis keeps one more 0-dim int32 tensor beside the growth tracker: the
//   consecutive overflows it has absorbed.
// - min_scale is a check, so the host has to know whether an update backs off and to
//   what. The core then reads the flags step() has not read and, for an overflowing
//   update only, computes the update into copies (propose()) and reads what it did: the
//   new scale, whether it backed off, the streak. Below min_scale it throws and applies
//   nothing. A backoff callback and max_overflow_streak take the same path (the callback
//   is handed the old and the new scale).

#include <lucid/amp/grad_scaler_options.h>

#include "amp/backend.h"
#include "amp/scale_rule.h"
#include "amp/scaler_state.h"

#include <ATen/ATen.h>

namespace lucid {
namespace amp {
namespace detail {

// The update rule of `options` (the one place it is read from them).
ScaleRule rule_of(const GradScalerOptions& options);

class ScaleSchedule {
 public:
  // `options` must have passed validate_options().
  explicit ScaleSchedule(GradScalerOptions options);

  const GradScalerOptions& options() const { return options_; }

  // Whether the device tensors exist yet.
  bool placed() const { return scale_.defined(); }
  // Creates the device tensors on `device` from the host copies (no-op once placed).
  void place(const at::Device& device);
  // float32, 0-dim; undefined until placed.
  const at::Tensor& scale() const { return scale_; }
  // int32, 0-dim, beside the scale; undefined until placed.
  const at::Tensor& growth_tracker() const { return growth_tracker_; }
  // int32, 0-dim, beside the scale; undefined until placed and guarded() needs it.
  const at::Tensor& overflow_tracker() const { return overflow_tracker_; }
  // The scale as a double (reads it back when placed).
  double value() const;
  // Sets the scale (update(new_scale)); `value` already checked.
  void set(float value);

  // Whether max_scale or hysteresis change the update (NOTE: [Guards]).
  bool guarded() const;
  // One update on the device tensors, in place, by the iteration's overflow flags `flags`
  // (float32, on the scale's device), which it sets back to 0 (NOTE: [Overflow flags] in
  // scale_rule.h). Reads nothing back. `record` (UpdateRecord, on the scale's device)
  // receives what the update did: its counts and its log row.
  void advance(const at::Tensor& flags, const UpdateRecord& record);

  // The same update computed into copies, counts and log included, for the host to inspect
  // before commit() (one read of the counts, two of the scale).
  struct Proposal {
    float old_scale = 0.0f;
    float new_scale = 0.0f;
    bool backs_off = false;       // the rule backed the scale off (ScaleEvent::kBackoff)
    int64_t overflow_streak = 0;  // overflowing updates in a row, this one included
    at::Tensor scale;
    at::Tensor growth_tracker;
    at::Tensor overflow_tracker;
    // Copies of `target`'s counts, log, overflow site and step outcomes, and of the
    // flags, written by the update.
    UpdateRecord record;
    at::Tensor flags;
    UpdateRecord target;      // the record handed to propose()
    at::Tensor target_flags;  // the flags handed to propose()
  };
  Proposal propose(const at::Tensor& flags, const UpdateRecord& record);
  // Makes `proposal` hold the scale at `floor` instead (MinScalePolicy::kClamp).
  static void hold_at(Proposal& proposal, float floor);
  void commit(const Proposal& proposal);

  // The schedule's state, read back from the device where it lives.
  ScalerSnapshot snapshot() const;
  // Replaces the state and the schedule's options with a validated snapshot.
  void apply(const ScalerSnapshot& snapshot);

 private:
  void ensure_overflow_tracker();
  void run_update_kernel(at::Tensor& scale, at::Tensor& growth_tracker,
                         at::Tensor& overflow_tracker, const at::Tensor& flags,
                         const UpdateRecord& record) const;

  GradScalerOptions options_;
  // Host copies, used until the device tensors exist.
  float host_scale_;
  int64_t host_growth_tracker_ = 0;
  int64_t host_overflow_tracker_ = 0;
  at::Tensor scale_;           // float32, 0-dim
  at::Tensor growth_tracker_;  // int32, 0-dim, beside scale_
  // int32, 0-dim, beside scale_: consecutive overflows absorbed by hysteresis. Made only
  // when guarded() needs it.
  at::Tensor overflow_tracker_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
