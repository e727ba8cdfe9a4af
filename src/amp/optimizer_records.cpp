// SPDX-License-Identifier: BSD-3-Clause
// The per-optimizer stage machine (optimizer_records.h).

#include "amp/optimizer_records.h"

#include "common/device_kernels.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace lucid {
namespace amp {
namespace detail {

const OptimizerRecord* OptimizerRecords::find(OptimizerKey key) const {
  const auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second;
}

OptimizerRecord* OptimizerRecords::find(OptimizerKey key) {
  const auto it = records_.find(key);
  return it == records_.end() ? nullptr : &it->second;
}

void OptimizerRecords::check_can_unscale(const OptimizerRecord& record) {
  TORCH_CHECK(record.stage != OptimizerStage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update(); "
              "call it at most once per optimizer per iteration.");
  TORCH_CHECK(record.stage != OptimizerStage::kStepped,
              "unscale_() is being called after step() for this optimizer; call unscale_() "
              "between backward() and step(), or call update() first.");
}

void OptimizerRecords::check_can_step(const OptimizerRecord& record) {
  TORCH_CHECK(record.stage != OptimizerStage::kStepped,
              "step() has already been called on this optimizer since the last update(); "
              "call update() once per iteration, after the steps.");
}

bool OptimizerRecords::any_checked() const {
  for (const auto& entry : records_) {
    if (entry.second.checked) {
      return true;
    }
  }
  return false;
}

bool OptimizerRecords::any_read_found() const {
  for (const auto& entry : records_) {
    if (entry.second.found_inf_read && entry.second.found_inf_value) {
      return true;
    }
  }
  return false;
}

void OptimizerRecords::place(const at::Device& device) {
  if (!flags_.defined()) {
    // One or two optimizers are the common case; more grow them once.
    constexpr int64_t kFirstFlags = 4;
    make_flags(at::zeros({2, kFirstFlags}, at::TensorOptions().dtype(at::kFloat).device(device)));
  }
}

SteppedOrdinals OptimizerRecords::counted_by_update() const {
  SteppedOrdinals stepped;
  for (const auto& entry : records_) {
    if (entry.second.counted_by_update) {
      stepped.add(entry.second.ordinal);
    }
  }
  return stepped;
}

void OptimizerRecords::make_flags(at::Tensor store) {
  store_ = std::move(store);
  flags_ = store_.select(0, 0);
  outcomes_ = store_.select(0, 1);
  flag_entries_.clear();
  for (int64_t j = 0; j < flags_.numel(); ++j) {
    flag_entries_.push_back(flags_.select(0, j));
  }
}

const at::Tensor& OptimizerRecords::flag_of(const OptimizerRecord& record) {
  TORCH_INTERNAL_ASSERT(flags_.defined(), "the flags are made with the scale");
  const auto held = static_cast<int64_t>(flag_entries_.size());
  if (record.ordinal >= held) {
    // Grown inside a capture, the copy of the old flags would run at each replay from a
    // store that the later replays' update no longer sets back to 0.
    TORCH_CHECK(!::lucid::capturing(store_.device()),
                "GradScaler: the iteration being captured in a CUDA graph checks more "
                "optimizers (",
                record.ordinal + 1, ") than any iteration before it (", held,
                " at most), and the scaler's overflow flags cannot grow inside a capture. Run "
                "one iteration with all of these optimizers before capturing. Nothing was "
                "changed.");
    at::Tensor grown =
        at::zeros({2, std::max<int64_t>(2 * held, record.ordinal + 1)}, store_.options());
    grown.narrow(1, 0, held).copy_(store_);
    make_flags(std::move(grown));
    for (auto& entry : records_) {
      OptimizerRecord& r = entry.second;
      if (r.found_inf.defined()) {
        r.found_inf = flag_entries_[r.ordinal];
      }
    }
  }
  return flag_entries_[record.ordinal];
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
