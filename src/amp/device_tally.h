// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the outcome counters of graph_safe mode, counted on the device.
//
// NOTE: [Counting on the device]
// In graph_safe mode step() and update() never read a flag, and a CUDA graph replays
// them without running any host code at all, so the host cannot count what they did.
// Instead each graph_safe step() and update() queues a few tensor ops that advance an
// int64 tally on the scale's device (they are captured and replayed with the step), and
// each step() copies its optimizer's flag into a tensor kept for that optimizer. The
// tally and the flags are read when asked for (counters(), step_skipped()), never inside
// step() or update(). Both are made by the first graph_safe step() or update(), which
// must therefore run eagerly (inside a capture their zero fill would become part of the
// graph and reset them on every replay); the fused optimizers refuse a captured first
// step for the same reason.
//
// What an update did is decided from the trackers as they were before it, by the rule
// every backend follows (scale_rule.h): a clean update grows when the growth tracker
// completes growth_interval; an overflowing one backs off unless hysteresis absorbs it.

#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler_options.h>

#include <ATen/ATen.h>

#include <unordered_map>

namespace lucid {
namespace amp {
namespace detail {

class DeviceTally {
 public:
  // A graph_safe step of the optimizer with key `key` ran (or was skipped on the device)
  // with the overflow flag `found_inf` (float32, 0-dim, on the scale's device; undefined:
  // clean).
  void note_step(OptimizerKey key, const at::Tensor& found_inf, const at::Device& device);
  // A graph_safe update() with the combined flag `found_inf` is about to advance the
  // schedule, whose trackers are still those before it (`overflow_tracker` undefined: 0).
  void note_update(const at::Tensor& found_inf, const at::Tensor& growth_tracker,
                   const at::Tensor& overflow_tracker, const GradScalerOptions& options);

  // Adds what was counted on the device to the host's `counters` (one read; nothing when
  // nothing was counted), whose `updates` already holds the update() calls the host ran.
  void add_to(ScalerCounters& counters) const;
  // Whether a step of `key` was counted here; then *skipped is whether the last one was
  // skipped (one read).
  bool last_step(OptimizerKey key, bool* skipped) const;
  // Updates counted so far (host count: no read).
  int64_t updates() const { return updates_; }
  // Forgets what was counted; a loaded checkpoint's streak continues from `streak`.
  void reset(int64_t streak);

 private:
  enum Field : int64_t {
    kStepsTaken,
    kStepsSkipped,
    kUpdates,
    kOverflowUpdates,
    kBackoffs,
    kGrowths,
    kOverflowStreak,
    kFieldCount,
  };
  void ensure_(const at::Device& device);

  at::Tensor tally_;  // int64, kFieldCount entries, on the scale's device
  int64_t streak_at_reset_ = 0;
  int64_t updates_ = 0;  // note_update calls since the last reset (host count)
  std::unordered_map<OptimizerKey, at::Tensor> last_skipped_;  // bool, 0-dim, per optimizer
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
