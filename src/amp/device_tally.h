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
// any step() being captured never read a flag; such a step() queues a few tensor ops that
// count its outcome and copy its optimizer's flag into a tensor kept for that optimizer.
// The tally and those flags are read when asked for (counters(), step_skipped(), an
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

namespace lucid {
namespace amp {
namespace detail {

class DeviceTally {
 public:
  // Makes the tally on `device` (the scale's), eagerly, before anything is counted on it.
  void place(const at::Device& device);
  // A step of the optimizer with key `key`, counted here in iteration `iteration`, ran (or
  // was skipped on the device) with the overflow flag `found_inf` (float32, 0-dim, on the
  // scale's device; undefined: clean).
  void note_step(OptimizerKey key, const at::Tensor& found_inf, int64_t iteration);
  // The counters (detail::UpdateCount order) that every scale update advances
  // (ScaleSchedule::advance, ScaleSchedule::propose); no read. A view of the tally, made
  // with it once rather than by a narrow() (three ATen calls) per update.
  const at::Tensor& update_counts() const;
  // An update advanced update_counts() (or is committed into them).
  void note_update();

  // Adds what was counted on the device to the host's `counters` (one read; nothing when
  // nothing was counted), whose `updates` already holds the update() calls the host ran;
  // the streak is the tally's.
  void add_to(ScalerCounters& counters) const;
  // The last step of an optimizer counted here.
  struct Step {
    at::Tensor skipped;  // bool, 0-dim
    int64_t iteration = 0;
  };
  // The last step of `key` counted here, or null (no read).
  const Step* last_step(OptimizerKey key) const;
  // Forgets what was counted (zeroing the tally where it is); a loaded checkpoint's streak
  // continues from `streak`.
  void reset(int64_t streak);

 private:
  // Steps taken and skipped, then the update counts (detail::UpdateCount).
  enum Field : int64_t {
    kStepsTaken,
    kStepsSkipped,
    kUpdateCounts,
    kFieldCount = kUpdateCounts + detail::kUpdateCountFields,
  };
  static constexpr int64_t kOverflowStreak =
      static_cast<int64_t>(kUpdateCounts) + detail::kCountOverflowStreak;
  at::Tensor tally_;          // int64, kFieldCount entries, on the scale's device
  at::Tensor update_counts_;  // tally_'s detail::UpdateCount entries
  int64_t streak_at_reset_ = 0;
  int64_t updates_ = 0;   // note_update calls since the last reset (host count)
  bool counted_ = false;  // whether anything was queued on the tally since the last reset
  std::unordered_map<OptimizerKey, Step> last_step_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
