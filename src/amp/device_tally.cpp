// SPDX-License-Identifier: BSD-3-Clause
// The counters counted on the device (NOTE: [Counting on the device] in device_tally.h).

#include "amp/device_tally.h"

#include "common/device_kernels.h"

namespace lucid {
namespace amp {
namespace detail {

void DeviceTally::place(const at::Device& device) {
  if (!counts_.defined()) {
    counts_ = at::zeros({kUpdateCountFields}, at::TensorOptions().dtype(at::kLong).device(device));
    if (streak_at_reset_ != 0) {
      counts_.select(0, kCountOverflowStreak).fill_(streak_at_reset_);
    }
  }
}

void DeviceTally::note_step(OptimizerKey key, int ordinal, int64_t iteration,
                            const at::Tensor& outcomes) {
  TORCH_INTERNAL_ASSERT(counts_.defined(), "the tally is made with the scale");
  counted_ = true;
  if (static_cast<size_t>(ordinal) >= ordinal_owner_.size()) {
    ordinal_owner_.resize(ordinal + 1);
  }
  OptimizerKey& owner = ordinal_owner_[ordinal];
  if (owner && owner != key) {
    // A copy queued while capturing would run only at each replay, after the replays
    // before it overwrote the entry: that outcome is then lost, not kept wrong.
    Step& previous = last_step_.at(owner);
    if (::lucid::capturing(outcomes.device())) {
      previous.lost = true;
    } else {
      previous.outcome = outcomes.select(0, ordinal).clone();
    }
  }
  Step& last = last_step_[key];
  if (ordinal_owner_[last.ordinal] == key) {
    ordinal_owner_[last.ordinal] = OptimizerKey();
  }
  last = {ordinal, iteration, at::Tensor(), false};
  owner = key;
}

const at::Tensor& DeviceTally::update_counts() const {
  TORCH_INTERNAL_ASSERT(counts_.defined(), "the tally is made with the scale");
  return counts_;
}

void DeviceTally::note_update() {
  counted_ = true;
  ++updates_;
}

void DeviceTally::add_to(ScalerCounters& counters) const {
  if (!counted_) {
    return;
  }
  const at::Tensor host = counts_.to(at::kCPU);
  const int64_t* u = host.data_ptr<int64_t>();
  counters.steps_taken += u[kCountStepsTaken];
  counters.steps_skipped += u[kCountStepsSkipped];
  // The host counted each update() call it ran; the device also counts the replays.
  counters.updates += u[kCountUpdates] - updates_;
  counters.overflow_updates += u[kCountOverflowUpdates];
  counters.backoffs += u[kCountBackoffs];
  counters.growths += u[kCountGrowths];
  counters.overflow_streak = u[kCountOverflowStreak];
}

const DeviceTally::Step* DeviceTally::last_step(OptimizerKey key) const {
  const auto it = last_step_.find(key);
  return it != last_step_.end() ? &it->second : nullptr;
}

void DeviceTally::reset(int64_t streak) {
  streak_at_reset_ = streak;
  if (counts_.defined()) {
    counts_.zero_();
    counts_.select(0, kCountOverflowStreak).fill_(streak);
  }
  updates_ = 0;
  counted_ = false;
  last_step_.clear();
  ordinal_owner_.clear();
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
