// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the scaler itself, for any optimizer that can be described by an
// OptimizerView. GradScaler (the C++ front) and the Python package are thin fronts over
// it. It composes three pieces, each in a file named for what it holds:
//   ScaleSchedule     (scale_schedule.h)      the scale, its trackers and their update
//   OptimizerRecords  (optimizer_records.h)   each optimizer's stage and overflow flag
//   ScalerDiagnostics (scaler_diagnostics.h)  counters, reports, callback, names
// and owns the stage machine that ties them together. It includes no optimizer class.

#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler_options.h>
#include <lucid/amp/optimizer_view.h>

#include "amp/optimizer_records.h"
#include "amp/scale_schedule.h"
#include "amp/scaler_diagnostics.h"
#include "amp/scaler_state.h"

#include <ATen/ATen.h>

#include <optional>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

class ScalerCore {
 public:
  // Throws c10::ValueError for an invalid option.
  explicit ScalerCore(const GradScalerOptions& options);

  at::Tensor scale(const at::Tensor& outputs);
  void unscale_(const OptimizerView& view);
  // Runs view.step unless the gradients overflowed; returns whether the caller should
  // report the step's result (false: skipped). Disabled: runs it and returns true.
  bool step(const OptimizerView& view);
  void update(std::optional<double> new_scale);
  // unscale_ and clip by the total norm in one read pass (plus one write pass for an
  // optimizer that is not scaler-aware); returns the norm of the unscaled gradients.
  at::Tensor clip_grad_norm_(const OptimizerView& view, double max_norm, double norm_type);

  double get_scale() const;
  bool enabled() const { return schedule_.options().enabled(); }
  const GradScalerOptions& options() const { return schedule_.options(); }
  const at::Tensor& scale_tensor() const { return schedule_.scale(); }
  OptimizerStage stage(OptimizerKey key) const;
  void set_found_inf_hook(std::shared_ptr<FoundInfHook> hook) { found_inf_hook_ = std::move(hook); }

  // Diagnostics.
  // These three read every outcome the host has not read first, waiting for it.
  ScalerCounters counters();
  bool step_skipped(OptimizerKey key);
  // The overflow flag of this iteration for the optimizer with key `key` (float32, 0-dim,
  // on the scale's device, unread); throws when it has none since the last update().
  at::Tensor found_inf(OptimizerKey key) const;
  bool overflowed(const OptimizerView& view);
  const std::optional<OverflowReport>& last_overflow();
  // The step log's records (NOTE: [Step log]); `wait`: every update so far included.
  std::vector<StepRecord> history(bool wait) { return diagnostics_.step_log().read(wait); }
  ScalerDiagnostics& diagnostics() { return diagnostics_; }

  // State I/O (serialize.cpp): the schedule as it stands, and a validated replacement
  // (with the counters of a checkpoint, or null to keep counting).
  ScalerSnapshot snapshot() const { return schedule_.snapshot(); }
  void apply(const ScalerSnapshot& snapshot, const ScalerCounters* counters);

 private:
  // Unscales the gradients in place, or (for a scaler-aware optimizer, which unscales
  // inside its own step) only checks them.
  enum class GradientPass { kUnscale, kCheckOnly };
  void record_overflow(const OptimizerView& view, OptimizerRecord& record, GradientPass pass);
  // `on_device`: counts_on_device(), decided once by step().
  bool step_scaler_aware(const OptimizerView& view, OptimizerRecord& record, bool on_device);
  // Starts the host copy of the record's final flag (PendingFlagRead), where the host
  // will read it: not in graph_safe mode, which never does.
  void start_reading_found_inf(OptimizerRecord& record);
  // Reads the record's flag once; `view` is null where the gradients are not to be
  // inspected (an unscale_-only optimizer may be gone). An overflow is reported with the
  // current scale: every read here comes before update() moves it.
  bool read_found_inf(const OptimizerView* view, OptimizerRecord& record);
  // Reads the flag of `record` if it was made and not read yet (OptimizerRecord::
  // found_inf_read, found_inf_value); true when this read found it set.
  bool learn_found_inf(OptimizerRecord& record);
  // Reads the flag of the scaler-aware step of `key` and counts it (its report inspects
  // the parameters the record kept).
  void resolve_deferred_step(OptimizerKey key, OptimizerRecord& record);
  // Every outcome the host has not read, waiting for it: the queued updates and this
  // iteration's scaler-aware steps.
  void resolve_outcomes();
  // update(), before the schedule moves: reads the flags whose copy has landed and
  // returns the others, to be counted when they land; *found: whether one it read was set.
  std::vector<ScalerDiagnostics::LateFlag> read_landed_flags(bool* found);
  // Whether step() and update() leave the outcome on the device, counted there (NOTE:
  // [Counting on the device]): in graph_safe mode, and while the scale's device is being
  // captured into a CUDA graph (`capturing`, asked once per call).
  bool counts_on_device(bool capturing) const { return options().graph_safe() || capturing; }
  // Throws unless scale() has made the scale: `call` (unscale_, step, ...) needs it.
  void check_scaled(const char* call) const;
  // update() once the iteration had checks; `capturing`: the scale's device is being
  // captured. Returns the backoff a callback is to see.
  std::optional<BackoffEvent> update_on_device(bool capturing);
  // An overflowing update with min_scale, max_overflow_streak or a backoff callback: the
  // update computed into copies, checked, then applied (NOTE: [Guards]). `record`: what
  // the update writes besides the schedule.
  std::optional<BackoffEvent> update_deciding_on_host(const at::Tensor& flags,
                                                      const UpdateRecord& record);
  // Throws when `streak` (this overflowing update's, itself included) reaches
  // max_overflow_streak.
  void check_overflow_streak(int64_t streak) const;
  // Counts the steps that this iteration's update would have counted, where it ends
  // without one.
  void count_steps_without_update();
  void finish_iteration();

  ScaleSchedule schedule_;  // holds the options (growth, backoff and guards follow loads)
  OptimizerRecords records_;
  ScalerDiagnostics diagnostics_;
  std::shared_ptr<FoundInfHook> found_inf_hook_;
  // The norm this iteration's last clip_grad_norm_ returned (float32, 0-dim, on the
  // scale's device), for the step log; undefined when it did not clip.
  at::Tensor clip_norm_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
