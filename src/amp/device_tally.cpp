// SPDX-License-Identifier: BSD-3-Clause
// The graph_safe counters (NOTE: [Counting on the device] in device_tally.h).

#include "amp/device_tally.h"

namespace lucid {
namespace amp {
namespace detail {

void DeviceTally::ensure_(const at::Device& device) {
  if (!tally_.defined()) {
    tally_ = at::zeros({kFieldCount}, at::TensorOptions().dtype(at::kLong).device(device));
    if (streak_at_reset_ != 0) {
      tally_.select(0, kOverflowStreak).fill_(streak_at_reset_);
    }
  }
}

void DeviceTally::note_step(OptimizerKey key, const at::Tensor& found_inf,
                            const at::Device& device) {
  ensure_(device);
  const at::Tensor skipped =
      found_inf.defined() ? found_inf.ne(0) : at::zeros({}, tally_.options().dtype(at::kBool));
  tally_.narrow(0, kStepsTaken, 2).add_(at::stack({skipped.logical_not(), skipped}));
  at::Tensor& last = last_skipped_[key];
  if (!last.defined()) {
    last = at::zeros({}, tally_.options().dtype(at::kBool));
  }
  last.copy_(skipped);
}

void DeviceTally::note_update(const at::Tensor& found_inf, const at::Tensor& growth_tracker,
                              const at::Tensor& overflow_tracker,
                              const GradScalerOptions& options) {
  ensure_(found_inf.device());
  ++updates_;
  const at::Tensor found = found_inf.ne(0);
  const at::Tensor grows =
      found.logical_not().logical_and(growth_tracker.eq(options.growth_interval() - 1));
  // Hysteresis absorbs an overflow while fewer than hysteresis - 1 were absorbed before.
  const int64_t absorbs = options.hysteresis() - 1;
  const at::Tensor backs = overflow_tracker.defined()
                               ? found.logical_and(overflow_tracker.ge(absorbs))
                               : (absorbs <= 0 ? found : at::zeros_like(found));
  tally_.narrow(0, kUpdates, 4).add_(at::stack({at::ones_like(found), found, backs, grows}));
  at::Tensor streak = tally_.select(0, kOverflowStreak);
  streak.add_(1).mul_(found);
}

void DeviceTally::add_to(ScalerCounters& counters) const {
  if (!tally_.defined()) {
    return;
  }
  const at::Tensor host = tally_.to(at::kCPU);
  const int64_t* t = host.data_ptr<int64_t>();
  counters.steps_taken += t[kStepsTaken];
  counters.steps_skipped += t[kStepsSkipped];
  // The host counted each update() call it ran; the device also counts the replays.
  counters.updates += t[kUpdates] - updates_;
  counters.overflow_updates += t[kOverflowUpdates];
  counters.backoffs += t[kBackoffs];
  counters.growths += t[kGrowths];
  if (updates_ > 0) {
    counters.overflow_streak = t[kOverflowStreak];
  }
}

bool DeviceTally::last_step(OptimizerKey key, bool* skipped) const {
  const auto it = last_skipped_.find(key);
  if (it == last_skipped_.end()) {
    return false;
  }
  *skipped = it->second.item<bool>();
  return true;
}

void DeviceTally::reset(int64_t streak) {
  tally_ = at::Tensor();
  streak_at_reset_ = streak;
  updates_ = 0;
  last_skipped_.clear();
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
