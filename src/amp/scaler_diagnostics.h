// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: a scaler's counters, skipped-step record, overflow reports, backoff callback
// and parameter names (include/lucid/amp/diagnostics.h is the public side).
//
// NOTE: [Diagnostics without host synchronisation]
// The default path must not wait for the device more than it has to (NOTE: [Scaler state
// on the device]): step() of a plain optimizer reads its one flag, as PyTorch's does;
// a scaler-aware optimizer skips on the device, so neither its step() nor update() reads
// anything. So every number here comes from what the host knows already, from flags whose
// copy to the host has landed (PendingFlagRead::ready), or is read when it is asked for:
// - steps_taken / steps_skipped / step_skipped(): a plain optimizer's step() decides
//   them. A scaler-aware step's outcome is read at update() when its flag's copy has
//   landed by then, else later (below), or by whichever query comes first; while the
//   iteration lasts, the report is built from the gradients the record kept.
// - The overflow report: built where the host learns of an overflow. It is the slow
//   path: per-gradient NaN and inf counts, read once per device, and the scale. A flag
//   the host learns only after its update() (an unscale_-only optimizer, or a step whose
//   flag had not landed) counts its optimizer as uninspected, its gradients untouched:
//   the optimizer may be gone, or its gradients overwritten, by then. The gradients are
//   unscaled in place when inspected, so it counts non-finite entries after unscaling:
//   exactly the set the flag was raised for.
// - backoffs / growths / overflow_updates / overflow_streak: what update() did on the
//   device, counted there by the update kernel itself (NOTE: [Counting on the device] in
//   device_tally.h) and read when asked. The host keeps no copy of the trackers.
// - The streak warning and the overflow reports need the host to learn each update's
//   flags. An update with a flag the host had not read is queued with the host copies of
//   those flags (Pending); every update() takes the queued updates whose copies have
//   landed, in order, without waiting; the queries, a load and a save wait for the rest,
//   and so does an update() that finds kMaxPendingUpdates queued. The warning comes when
//   its update is taken, from the streak of the updates the host learnt in order.
// - With min_scale, max_overflow_streak or a backoff callback, update() reads the unread
//   flags itself (NOTE: [Guards]), so nothing is queued.
// - graph_safe mode, and a step() captured in a CUDA graph, count steps on the device
//   too (NOTE: [Counting on the device]); all_counters() adds the tally.

#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler_options.h>
#include <lucid/amp/optimizer_view.h>

#include "amp/device_tally.h"
#include "amp/flag_read.h"
#include "amp/step_log.h"

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
  // A step() of this iteration decided whether it skipped the optimizer with key `key`.
  void note_step(OptimizerKey key, bool skipped) { note_step(key, skipped, counters_.updates); }
  // A step() of this iteration left its outcome on the device, for the update to count
  // (NOTE: [Counting on the device]): its place in the iteration `ordinal`, and the
  // iteration's step outcomes `outcomes` (OptimizerRecords::step_outcomes).
  void note_device_step(OptimizerKey key, int ordinal, const at::Tensor& outcomes) {
    tally_.note_step(key, ordinal, counters_.updates, outcomes);
  }
  // The host learnt that an optimizer overflowed in this iteration; `view` lists its
  // gradients, or is null where they are not to be inspected (an optimizer that was only
  // unscale_'d may be gone at update()). `scale` is the scale the gradients were divided
  // by.
  void note_overflow(const OptimizerView* view, double scale) {
    note_overflow(view, scale, counters_.updates);
  }
  // A flag the host had not read when its update() ran: that of the optimizer with key
  // `key`, from its step (`stepped`: a scaler-aware one, which skipped on the device or
  // not) or from its unscale_ alone.
  struct LateFlag {
    OptimizerKey key;
    bool stepped = false;
    PendingFlagRead flag;
  };
  // update() ran the schedule: the host read flags whose outcome is `found`, and the
  // flags in `late` (with `scale`, the scale they were checked with) reach it later.
  void note_schedule_update(bool found, std::vector<LateFlag> late, PendingFlagRead scale,
                            const GradScalerOptions& options);
  // Takes the queued updates, waiting for their flags (`wait`), or, without waiting, as
  // many of the oldest as have all their flags on the host.
  void resolve_pending(const GradScalerOptions& options, bool wait = true);
  // Forgets the queued updates (a checkpoint replaces the run they belong to).
  void drop_pending() { pending_.clear(); }
  // The host's count of update() calls: the iteration in progress.
  int64_t iteration() const { return counters_.updates; }
  // update() finished an iteration (with or without the schedule).
  void finish_iteration() { ++counters_.updates; }
  // update() found no overflow check since the last one and left the schedule alone.
  void note_update_without_checks() { ++counters_.updates_without_checks; }
  // step() ran an optimizer that had no gradient at all.
  void note_step_without_gradients() { ++counters_.steps_without_gradients; }
  // A backoff held the scale at min_scale (counted once the update is resolved).
  void note_min_scale_hold() { ++counters_.min_scale_holds; }

  // What the device counts (NOTE: [Counting on the device]).
  DeviceTally& tally() { return tally_; }
  // What each update did, logged on the device (NOTE: [Step log]).
  StepLog& step_log() { return step_log_; }
  const StepLog& step_log() const { return step_log_; }
  // Everything counted: the resolved counters and the device tally (one read).
  ScalerCounters all_counters(const GradScalerOptions& options);
  // A checkpoint's counters replace these and clear the step log (null: the counters and
  // the log so far are kept).
  void reset(const ScalerCounters* counters);

  // Whether the last step of `key` was skipped; `flags` and `outcomes`: the iteration's
  // (OptimizerRecords), where the device counted that step.
  bool step_skipped(OptimizerKey key, const at::Tensor& flags, const at::Tensor& outcomes) const;
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
  // An update() whose outcome the host does not know in full yet.
  struct Pending {
    bool found = false;          // what the flags the host read said
    std::vector<LateFlag> late;  // the flags it had not read
    PendingFlagRead scale;       // the scale the late flags' gradients were divided by
    int64_t iteration = 0;       // counters_.updates when that update() ran
  };
  struct Name {
    c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> param;
    std::string name;
  };
  void note_overflow(const OptimizerView* view, double scale, int64_t iteration);
  // The step of `key` in iteration `iteration` (a late flag's is older than this one).
  void note_step(OptimizerKey key, bool skipped, int64_t iteration);
  // Takes one update whose every flag the host has read: the warning's streak.
  void take_update(bool found, const GradScalerOptions& options);
  // Warns (TORCH_WARN) when an overflow streak reaches options.overflow_warning_streak.
  void warn_on_streak(const GradScalerOptions& options) const;

  // What the host counts, and the base the device tally adds to (a loaded checkpoint's).
  ScalerCounters counters_;
  // Overflowing updates in a row among those the host learnt, for the warning.
  int64_t learnt_streak_ = 0;
  std::vector<Pending> pending_;  // in update order
  struct LastStep {
    bool skipped = false;
    int64_t iteration = 0;
  };
  std::unordered_map<OptimizerKey, LastStep> last_step_;  // as the host learnt it
  std::optional<OverflowReport> last_overflow_;
  BackoffCallback on_backoff_;
  std::unordered_map<const c10::TensorImpl*, Name> names_;
  DeviceTally tally_;
  StepLog step_log_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
