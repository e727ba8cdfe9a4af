// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the outcome counters of graph_safe mode, counted on the device.
//
// NOTE: [Counting on the device]
// A step() or update() that runs from a CUDA graph runs no host code at all, so the host
// cannot count what it did: graph_safe mode, and any step() or update() being captured
// in a CUDA graph, never read a flag. Instead an int64 tally on the scale's device counts
// them, advanced by work queued with them (captured and replayed with the step): each
// such update()'s scale-update kernel adds what it did (detail::count_update, the rule's
// own event), each such step() queues a few tensor ops that count its outcome and copy
// its optimizer's flag into a tensor kept for that optimizer. The tally and the flags are
// read when asked for (counters(), step_skipped()), never inside step() or update(). The
// tally is made with the scale, by the first scale(), which a capture follows (CUDA
// graphs need warm-up iterations): made inside a capture, its zero fill would become part
// of the graph and reset it on every replay; the fused optimizers refuse a captured first
// step for the same reason.
//
// The overflow streak: once anything was counted here, every update() advances the tally's
// streak, those the host counts too (two small ops, queued, never read), so the tally holds
// the true streak from then on. The first update counted here starts from the tally's
// streak as it was made (0, or a loaded checkpoint's), not from overflowing updates the host
// counted before it. When the host counts again after updates counted here, it takes the
// trackers and the streak from the device (one read, at that change only).
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
  // An update() is counted here: the counters (detail::UpdateCount order) that its
  // scale update advances (ScaleSchedule::advance).
  at::Tensor update_counts();

  // An update() with the combined flag `found_inf` was counted by the host, not here.
  void note_host_update(const at::Tensor& found_inf);
  // Whether the last update() was counted here.
  bool last_update_here() const { return last_update_here_; }
  // The overflow streak the tally holds (one read).
  int64_t streak() const;

  // Adds what was counted on the device to the host's `counters` (one read; nothing when
  // nothing was counted), whose `updates` already holds the update() calls the host ran.
  void add_to(ScalerCounters& counters) const;
  // The last step of an optimizer counted here.
  struct Step {
    at::Tensor skipped;  // bool, 0-dim
    int64_t iteration = 0;
  };
  // The last step of `key` counted here, or null (no read).
  const Step* last_step(OptimizerKey key) const;
  // Updates counted so far (host count: no read).
  int64_t updates() const { return updates_; }
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
  static constexpr int64_t kOverflowStreak = kUpdateCounts + detail::kCountOverflowStreak;
  at::Tensor tally_;  // int64, kFieldCount entries, on the scale's device
  int64_t streak_at_reset_ = 0;
  int64_t updates_ = 0;   // note_update calls since the last reset (host count)
  bool counted_ = false;  // whether anything was queued on the tally since the last reset
  bool last_update_here_ = false;
  std::unordered_map<OptimizerKey, Step> last_step_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
