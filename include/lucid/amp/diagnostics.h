// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// What a GradScaler tells about itself when things go wrong: which gradients overflowed,
/// counters of steps and scale changes, and the event handed to a backoff callback.
/// NOTE: [Diagnostics without host synchronisation] in src/amp/scaler_diagnostics.h says where
/// each number comes from and what it costs.

#include <lucid/amp/optimizer_view.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace lucid {
namespace amp {

/// One gradient that held inf or NaN after unscaling.
struct NonFiniteGradient {
  /// The key of the optimizer the parameter belongs to (OptimizerView::key: `&optimizer`
  /// for a C++ optimizer); for comparing only, it is not kept alive.
  OptimizerKey optimizer;
  /// Index of the parameter group in `optimizer->param_groups()`.
  size_t param_group = 0;
  /// Index of the parameter within that group.
  size_t index = 0;
  /// The name registered with GradScaler::set_parameter_names (empty when none was).
  std::string name;
  /// How many entries of the (unscaled) gradient are NaN.
  int64_t nan_count = 0;
  /// How many entries of the (unscaled) gradient are +inf or -inf.
  int64_t inf_count = 0;
  /// How many entries the gradient has (for a sparse gradient: its stored values).
  int64_t numel = 0;
  /// The gradient's shape.
  std::vector<int64_t> sizes;
  /// The gradient's dtype.
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  /// The gradient's device.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

/// Which gradients overflowed in one iteration (between two update() calls). Built only
/// when the scaler learns of an overflow: when step() skips, or when overflowed() or
/// update() reads the flag of an optimizer that was only unscale_'d.
struct OverflowReport {
  /// The iteration: how many schedule updates (update() without a new scale) came before.
  int64_t iteration = 0;
  /// The scale the gradients had been multiplied by (and were divided by).
  double scale = 0.0;
  /// How many optimizers overflowed in this iteration (so far).
  int64_t optimizers = 0;
  /// Of those, the optimizers whose flag update() read after they were only unscale_'d:
  /// their gradients are not in `gradients` (update() does not touch an optimizer that
  /// may be gone by then). Call overflowed(optimizer) before update() to list them.
  int64_t uninspected_optimizers = 0;
  /// Every gradient holding a non-finite entry, in optimizer, group and parameter order.
  /// Empty when the flag was raised although no local gradient is non-finite (a
  /// found_inf hook: another rank overflowed; or gradients changed after unscale_), or
  /// when the only overflowing optimizers were uninspected.
  std::vector<NonFiniteGradient> gradients;

  /// One line per gradient, e.g. "group 0 param 3 'fc.weight' [4, 8] Float: 2 NaN, 0 inf of 32".
  std::string to_string() const;
};

/// What an update did to the scale.
enum class ScaleChange {
  /// A clean update that did not complete growth_interval clean updates: scale kept.
  kNone,
  /// growth_interval clean updates completed: the scale grew (capped, or kept at the cap).
  kGrowth,
  /// An overflow absorbed by hysteresis: the scale kept.
  kAbsorbed,
  /// An overflow that backed the scale off.
  kBackoff,
};

/// How many updates the step log keeps (GradScaler::history): the latest ones.
constexpr int64_t kStepLogCapacity = 1024;
/// How many optimizers of one iteration the step log tells apart
/// (StepRecord::overflowed_optimizers).
constexpr int kStepLogOptimizers = 24;

/// A gradient named by where its optimizer and its parameter stand (StepRecord::
/// first_overflow).
struct GradientPlace {
  /// The optimizer's place in the iteration, as in StepRecord::overflowed_optimizers.
  int optimizer = 0;
  /// The parameter's position among that optimizer's parameters, its param groups
  /// concatenated in order (parameters without a gradient count too).
  int64_t parameter = 0;
};

/// One update() as the step log recorded it on the device (GradScaler::history).
struct StepRecord {
  /// The update's number among the updates that ran the schedule (replays of a captured
  /// update included), from 0, since the scaler was built or a checkpoint was loaded
  /// (then counting on from the checkpoint's ScalerCounters::updates).
  int64_t update = 0;
  /// The scale the iteration's gradients were divided by.
  double scale = 0.0;
  /// The scale after the update.
  double new_scale = 0.0;
  /// Whether a gradient of the iteration held inf/NaN (its steps were skipped).
  bool found_inf = false;
  /// Which optimizers' gradients held inf/NaN, ascending: j names the iteration's j-th
  /// optimizer, from 0, in the order of each one's first unscale_, clip_grad_norm_ or
  /// step() since the update before. kStepLogOptimizers - 1 stands for that optimizer and
  /// every later one. Empty exactly when found_inf is false.
  std::vector<int> overflowed_optimizers;
  /// The first gradient the iteration's checks found holding inf/NaN once unscaled: of
  /// the first such optimizer, the first such parameter. nullopt when none did; so also
  /// when only a found-inf hook raised the flag (another rank's gradients) or the norm
  /// alone overflowed (finite gradients whose squares sum past float32).
  std::optional<GradientPlace> first_overflow;
  /// How many gradient entries held NaN once unscaled, over the iteration's checks (each
  /// optimizer's gradients as its first unscale_, clip_grad_norm_ or step() saw them); 0
  /// where first_overflow is nullopt.
  int64_t nan_count = 0;
  /// How many held inf (an entry that overflowed only once unscaled counts), as nan_count.
  int64_t inf_count = 0;
  /// What the update did to the scale (a backoff held at min_scale is a backoff).
  ScaleChange change = ScaleChange::kNone;
  /// The total norm the iteration's last clip_grad_norm_ returned (before clipping, of
  /// the unscaled gradients); nullopt when the iteration did not clip.
  std::optional<double> grad_norm;
};

/// Counters of what the scaler did since it was built (or since the checkpoint it was
/// loaded from). A disabled scaler counts nothing.
struct ScalerCounters {
  /// step() calls that ran optimizer.step().
  int64_t steps_taken = 0;
  /// step() calls that skipped optimizer.step() because a gradient was inf/NaN.
  int64_t steps_skipped = 0;
  /// update() calls: every iteration ended, replays of a captured update() included, and
  /// so are update(new_scale) and the updates_without_checks.
  int64_t updates = 0;
  /// Of those, the updates that saw an overflow in any optimizer.
  int64_t overflow_updates = 0;
  /// Updates that multiplied the scale by backoff_factor (with hysteresis > 1, fewer than
  /// overflow_updates).
  int64_t backoffs = 0;
  /// Updates that completed growth_interval clean updates and grew the scale (capped at
  /// max_scale and float32's largest value: at the cap the scale stays, and it counts).
  int64_t growths = 0;
  /// Consecutive overflowing updates up to the last one (0 after a clean update). A
  /// streak that keeps rising means every step is being skipped.
  int64_t overflow_streak = 0;
  /// update() calls with no overflow check since the last one (no optimizer had a
  /// gradient): not evidence of a clean step, so the scale and its growth tracker stayed.
  /// Not counted in overflow_updates or growths; a streak is left as it was.
  int64_t updates_without_checks = 0;
  /// step() calls of an optimizer that had no gradient at all.
  int64_t steps_without_gradients = 0;
  /// Backoffs that would have gone below min_scale and held it instead
  /// (MinScalePolicy::kClamp); counted in backoffs too.
  int64_t min_scale_holds = 0;
};

/// What a backoff callback receives, once per backoff, after update() has applied it.
struct BackoffEvent {
  /// The iteration that overflowed (as OverflowReport::iteration).
  int64_t iteration = 0;
  /// The scale before the backoff.
  double old_scale = 0.0;
  /// The scale after it.
  double new_scale = 0.0;
  /// Consecutive overflowing updates, this one included.
  int64_t overflow_streak = 0;
  /// The overflow report of the iteration, when one was built (see OverflowReport).
  const OverflowReport* report = nullptr;
};

/// Called on every backoff (GradScaler::set_backoff_callback).
using BackoffCallback = std::function<void(const BackoffEvent& event)>;

}  // namespace amp
}  // namespace lucid
