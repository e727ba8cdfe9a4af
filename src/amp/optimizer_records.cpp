// SPDX-License-Identifier: BSD-3-Clause
// The per-optimizer stage machine (optimizer_records.h).

#include "amp/optimizer_records.h"

#include <c10/util/Exception.h>

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

void OptimizerRecords::read_summary(bool* all_read, bool* any_found) const {
  bool read = true;
  bool found = false;
  for (const auto& entry : records_) {
    const OptimizerRecord& r = entry.second;
    if (r.found_inf.defined()) {
      read = read && r.found_inf_read;
      found = found || r.found_inf_value;
    }
  }
  *all_read = read;
  *any_found = found;
}

at::Tensor OptimizerRecords::combined_found_inf(bool* all_read, bool* any_found) const {
  // One optimizer's flag is used as it is, with no kernel: a launch here would add to
  // every iteration's update() for the common case of a single optimizer.
  at::Tensor combined;
  for (const auto& entry : records_) {
    const OptimizerRecord& r = entry.second;
    if (r.found_inf.defined()) {
      combined = combined.defined() ? at::maximum(combined, r.found_inf) : r.found_inf;
    }
  }
  read_summary(all_read, any_found);
  return combined;
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
