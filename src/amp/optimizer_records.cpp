// SPDX-License-Identifier: BSD-3-Clause
// The per-optimizer stage machine (optimizer_records.h).

#include "amp/optimizer_records.h"

#include "amp/scale_rule.h"

#include <c10/util/Exception.h>

#include <cmath>

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
  // Each flag is 0 or 1, so adding flag * 2^j sets bit j, exactly in float32. The first
  // optimizer's flag is bit 0 as it is, with no kernel: a launch here would add to every
  // iteration's update() for the common case of a single optimizer. Optimizers past the
  // last bit share it through a maximum, so the bit stays 0 or 1.
  constexpr int kLastBit = kOverflowOptimizerBits - 1;
  at::Tensor low;
  at::Tensor last;
  for (const auto& entry : records_) {
    const OptimizerRecord& r = entry.second;
    if (!r.found_inf.defined()) {
      continue;
    }
    if (r.ordinal >= kLastBit) {
      last = last.defined() ? at::maximum(last, r.found_inf) : r.found_inf;
      continue;
    }
    const double weight = std::ldexp(1.0, r.ordinal);
    if (low.defined()) {
      low = at::add(low, r.found_inf, weight);
    } else {
      low = r.ordinal == 0 ? r.found_inf : at::mul(r.found_inf, weight);
    }
  }
  if (last.defined()) {
    const double weight = std::ldexp(1.0, kLastBit);
    low = low.defined() ? at::add(low, last, weight) : at::mul(last, weight);
  }
  read_summary(all_read, any_found);
  return low;
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
