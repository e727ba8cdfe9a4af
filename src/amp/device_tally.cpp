// SPDX-License-Identifier: BSD-3-Clause
// The counters counted on the device (NOTE: [Counting on the device] in device_tally.h).

#include "amp/device_tally.h"

namespace lucid {
namespace amp {
namespace detail {

void DeviceTally::place(const at::Device& device) {
  if (!tally_.defined()) {
    tally_ = at::zeros({kFieldCount}, at::TensorOptions().dtype(at::kLong).device(device));
    update_counts_ = tally_.narrow(0, kUpdateCounts, detail::kUpdateCountFields);
    if (streak_at_reset_ != 0) {
      tally_.select(0, kOverflowStreak).fill_(streak_at_reset_);
    }
  }
}

void DeviceTally::note_step(OptimizerKey key, const at::Tensor& found_inf, int64_t iteration) {
  TORCH_INTERNAL_ASSERT(tally_.defined(), "the tally is made with the scale");
  counted_ = true;
  const at::Tensor skipped =
      found_inf.defined() ? found_inf.ne(0) : at::zeros({}, tally_.options().dtype(at::kBool));
  tally_.narrow(0, kStepsTaken, 2).add_(at::stack({skipped.logical_not(), skipped}));
  Step& last = last_step_[key];
  if (!last.skipped.defined()) {
    last.skipped = at::zeros({}, tally_.options().dtype(at::kBool));
  }
  last.skipped.copy_(skipped);
  last.iteration = iteration;
}

const at::Tensor& DeviceTally::update_counts() const {
  TORCH_INTERNAL_ASSERT(tally_.defined(), "the tally is made with the scale");
  return update_counts_;
}

void DeviceTally::note_update() {
  counted_ = true;
  ++updates_;
}

void DeviceTally::add_to(ScalerCounters& counters) const {
  if (!counted_) {
    return;
  }
  const at::Tensor host = tally_.to(at::kCPU);
  const int64_t* t = host.data_ptr<int64_t>();
  const int64_t* u = t + kUpdateCounts;
  counters.steps_taken += t[kStepsTaken];
  counters.steps_skipped += t[kStepsSkipped];
  // The host counted each update() call it ran; the device also counts the replays.
  counters.updates += u[detail::kCountUpdates] - updates_;
  counters.overflow_updates += u[detail::kCountOverflowUpdates];
  counters.backoffs += u[detail::kCountBackoffs];
  counters.growths += u[detail::kCountGrowths];
  counters.overflow_streak = t[kOverflowStreak];
}

const DeviceTally::Step* DeviceTally::last_step(OptimizerKey key) const {
  const auto it = last_step_.find(key);
  return it != last_step_.end() ? &it->second : nullptr;
}

void DeviceTally::reset(int64_t streak) {
  streak_at_reset_ = streak;
  if (tally_.defined()) {
    tally_.zero_();
    tally_.select(0, kOverflowStreak).fill_(streak);
  }
  updates_ = 0;
  counted_ = false;
  last_step_.clear();
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
