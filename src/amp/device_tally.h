// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the outcome counters counted on the device: every update's, and the steps of
// graph_safe mode and of captured calls.
//
// NOTE: [Counting on the device]
// An int64 tally on the scale's device counts what the scaler did. Every update() adds to
// it in its own scale-update kernel (detail::count_update, the rule's own event), eager,
// captured or replayed alike, so the schedule's counters (updates, overflowing updates,
// backoffs, growths, the overflow streak) have one source and the host keeps no copy of
// the trackers. Steps are counted here where the host cannot count them: a step() or
// update() that runs from a CUDA graph runs no host code at all, so graph_safe mode and
// any step() being captured never read a flag; the update that ends such a step's
// iteration counts it from its flag (NOTE: [Steps counted by the update] in
// scale_rule.h) and keeps its outcome in its ordinal's entry of the step outcomes. The
// host remembers which ordinal each optimizer's last such step had; before another
// optimizer's step takes that ordinal over, the entry is copied aside for the first (not
// while capturing: the copy would run at each replay, after the entry was overwritten,
// so that outcome is lost and step_skipped() says so).
// The tally and the outcomes are read when asked for (counters(), step_skipped(), an
// update() that must decide on the host), never otherwise inside step() or update(). The
// tally is made with the scale, by the first scale(), which a capture follows (CUDA
// graphs need warm-up iterations): made inside a capture, its zero fill would become part
// of the graph and reset it on every replay; the fused optimizers refuse a captured first
// step for the same reason.
//
// Which step was the last of an optimizer is decided by iteration (the host's count of
// update() calls when it ran): a flag from before a capture that lands after the replays
// does not replace what the replays counted.

#include "amp/scale_rule.h"

#include <lucid/amp/diagnostics.h>

#include <ATen/ATen.h>

#include <unordered_map>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

class DeviceTally {
 public:
  // Makes the tally on `device` (the scale's), eagerly, before anything is counted on it.
  void place(const at::Device& device);
  // A step of the optimizer with key `key` that the update of iteration `iteration`
  // counts, its place in that iteration `ordinal`; `outcomes` is the iteration's step
  // outcomes (OptimizerRecords::step_outcomes), whose entry `ordinal` another
  // optimizer's last step may still need.
  void note_step(OptimizerKey key, int ordinal, int64_t iteration, const at::Tensor& outcomes);
  // The counters (detail::UpdateCount order) that every scale update advances
  // (ScaleSchedule::advance, ScaleSchedule::propose); no read.
  const at::Tensor& update_counts() const;
  // An update advanced update_counts() (or is committed into them).
  void note_update();

  // Adds what was counted on the device to the host's `counters` (one read; nothing when
  // nothing was counted), whose `updates` already holds the update() calls the host ran;
  // the streak is the tally's.
  void add_to(ScalerCounters& counters) const;
  // The last step of an optimizer counted here.
  struct Step {
    int ordinal = 0;
    int64_t iteration = 0;
    at::Tensor outcome;  // float32, 0-dim: its copy aside; undefined: the ordinal's entry
    // A step captured in a CUDA graph took the ordinal over before its entry was copied
    // aside: the outcome is not known.
    bool lost = false;
  };
  // The last step of `key` counted here, or null (no read).
  const Step* last_step(OptimizerKey key) const;
  // Forgets what was counted (zeroing the tally where it is); a loaded checkpoint's streak
  // continues from `streak`.
  void reset(int64_t streak);

 private:
  at::Tensor counts_;  // int64, detail::kUpdateCountFields entries, on the scale's device
  int64_t streak_at_reset_ = 0;
  int64_t updates_ = 0;   // note_update calls since the last reset (host count)
  bool counted_ = false;  // whether anything was queued on the tally since the last reset
  std::unordered_map<OptimizerKey, Step> last_step_;
  std::vector<OptimizerKey> ordinal_owner_;  // whose last step each ordinal's entry holds
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
