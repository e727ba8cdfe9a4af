// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: a scaler's counters, skipped-step record, overflow reports, backoff callback
// and parameter names (include/lucid/amp/diagnostics.h is the public side).
//
// NOTE: [Diagnostics without host synchronisation]
// The default path must not wait for the device more than it has to (NOTE: [Scaler state
// on the device]): step() reads one flag per optimizer, update() reads nothing. So every
// number here comes from what the host knows already, or is read when it is asked for:
// - steps_taken / steps_skipped / step_skipped(): decided in step(), which read the flag;
//   for a step whose view defers its outcome (OptimizerView::defer_outcome: a scaler-aware
//   optimizer skips on the device anyway), by update() right after queueing its kernel,
//   or by whichever query comes first; the report is built then, from the gradients the
//   record kept.
// - The overflow report: built where the host learns of an overflow (step() skipping,
//   overflowed()). It is the slow path: per-gradient NaN and inf counts, read once per
//   device, and the scale. A guarded update() that reads an unscale_-only optimizer's
//   flag counts that optimizer as uninspected and does not touch it: the scaler keys
//   optimizers by view key and cannot know whether one still exists at update().
//   The gradients are unscaled in place by then, so it counts non-finite entries after
//   unscaling: exactly the set the flag was raised for.
// - backoffs / growths / overflow_updates / overflow_streak: what update() did on the
//   device. The host mirrors the two trackers (growth, and overflows absorbed by
//   hysteresis) and advances them with detail::next_scale_state, the rule every backend
//   follows, given whether the update saw an overflow. Usually every flag of an update was
//   read by step(), and the mirror advances at once. An optimizer that was unscale_'d but
//   not stepped has a flag nobody read: that update is queued with its combined device
//   flag, and the queue is read (one read of all its flags) when the counters are asked
//   for, before a load or a save, or when it reaches kMaxPendingUpdates entries.
// - With min_scale or a backoff callback, update() reads the unread flags itself (NOTE:
//   [Guards]), so nothing is queued.
// - graph_safe mode counts steps and schedule updates on the device instead (NOTE:
//   [Counting on the device] in device_tally.h); all_counters() adds that tally.

#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler_options.h>
#include <lucid/amp/optimizer_view.h>

#include "amp/device_tally.h"

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

class ScalerDiagnostics {
 public:
  // A step() decided whether it skipped the optimizer with key `key`.
  void note_step(OptimizerKey key, bool skipped);
  // The host learnt that an optimizer overflowed in this iteration; `view` lists its
  // gradients, or is null where the optimizer may be gone (update() reading the flag of
  // one that was only unscale_'d). `scale` is the scale the gradients were divided by.
  void note_overflow(const OptimizerView* view, double scale);
  // update() ran the schedule: `found` is its outcome when `known`, else `flag` (the
  // combined device flag) is read later.
  void note_schedule_update(bool known, bool found, const at::Tensor& flag,
                            const GradScalerOptions& options);
  // Whether an update that saw `found` backs the scale off (reads the queue first).
  bool predicts_backoff(bool found, const GradScalerOptions& options);
  // Reads the queued flags and counts their updates.
  void resolve_pending(const GradScalerOptions& options);
  // Forgets the queued updates (a checkpoint replaces the run they belong to).
  void drop_pending() { pending_.clear(); }
  // update() finished an iteration (with or without the schedule).
  void finish_iteration() { ++counters_.updates; }
  // update() found no overflow check since the last one and left the schedule alone.
  void note_update_without_checks() { ++counters_.updates_without_checks; }
  // step() ran an optimizer that had no gradient at all.
  void note_step_without_gradients() { ++counters_.steps_without_gradients; }
  // A backoff held the scale at min_scale (counted once the update is resolved).
  void note_min_scale_hold() { ++counters_.min_scale_holds; }

  // graph_safe mode counts on the device (NOTE: [Counting on the device]).
  DeviceTally& tally() { return tally_; }

  // The counters as of the last resolved update (without the device tally).
  const ScalerCounters& counters() const { return counters_; }
  // Everything counted: the resolved counters and the device tally (one read).
  ScalerCounters all_counters(const GradScalerOptions& options);
  // A checkpoint's trackers (and counters, when it has them) replace the mirror.
  void reset(int64_t growth_tracker, int64_t overflow_tracker, const ScalerCounters* counters);

  bool step_skipped(OptimizerKey key) const;
  const std::optional<OverflowReport>& last_overflow() const { return last_overflow_; }
  // The report of the iteration in progress, if it has one.
  const OverflowReport* current_overflow() const;

  const BackoffCallback& backoff_callback() const { return on_backoff_; }
  void set_backoff_callback(BackoffCallback callback) { on_backoff_ = std::move(callback); }

  void set_parameter_name(const at::Tensor& parameter, const std::string& name);
  // The registered name of `param`, or "" when it has none.
  std::string name_of(const at::Tensor& param) const;
  // Drops the names of parameters that are gone, so the map does not grow without bound.
  void forget_expired_names();

 private:
  struct Pending {
    bool found = false;
    at::Tensor flag;  // undefined when the host knew `found`
  };
  struct Name {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> param;
    std::string name;
  };
  // Warns (TORCH_WARN) when an overflow streak reaches options.overflow_warning_streak.
  void warn_on_streak_(const GradScalerOptions& options) const;

  ScalerCounters counters_;
  // The trackers as of the last resolved update, advanced on the host by the rule every
  // backend follows; they tell whether an update backed off or grew.
  int32_t growth_tracker_ = 0;
  int32_t overflow_tracker_ = 0;
  std::vector<Pending> pending_;  // in update order
  std::unordered_map<OptimizerKey, bool> last_step_skipped_;
  std::optional<OverflowReport> last_overflow_;
  BackoffCallback on_backoff_;
  std::unordered_map<const c10::TensorImpl*, Name> names_;
  DeviceTally tally_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
