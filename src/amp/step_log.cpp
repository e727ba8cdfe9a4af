// SPDX-License-Identifier: BSD-3-Clause
// The step log (NOTE: [Step log] in step_log.h).

#include "amp/step_log.h"

#include "amp/backend.h"
#include "amp/kernel_routing.h"
#include "amp/scale_rule.h"
#include "common/device_kernels.h"

#include <algorithm>
#include <cmath>

namespace lucid {
namespace amp {
namespace detail {

static_assert(static_cast<int>(ScaleChange::kNone) == static_cast<int>(ScaleEvent::kNone) &&
                  static_cast<int>(ScaleChange::kGrowth) == static_cast<int>(ScaleEvent::kGrowth) &&
                  static_cast<int>(ScaleChange::kAbsorbed) ==
                      static_cast<int>(ScaleEvent::kAbsorbed) &&
                  static_cast<int>(ScaleChange::kBackoff) == static_cast<int>(ScaleEvent::kBackoff),
              "the public ScaleChange names detail::ScaleEvent's values");
static_assert(kStepLogRows == kStepLogCapacity && kOverflowOptimizerBits == kStepLogOptimizers,
              "the device log keeps what the API promises");

void StepLog::place(const at::Device& device) {
  if (!log_.defined()) {
    log_ = at::zeros({1 + kStepLogRows, kStepLogFields},
                     at::TensorOptions().dtype(at::kDouble).device(device));
    overflow_site_ =
        at::empty({kOverflowSiteFields}, at::TensorOptions().dtype(at::kLong).device(device));
    forget_overflow_site();
  }
}

void StepLog::forget_overflow_site() {
  if (overflow_site_.defined()) {
    reset_overflow_site_slot(overflow_site_);
  }
}

std::vector<StepRecord> StepLog::read(bool wait) {
  if (!log_.defined()) {
    return {};
  }
  // Takes the copy on its way when it has landed (or when told to wait for it).
  auto take = [this, wait] {
    if (!in_flight_.started() || !(wait || in_flight_.landed())) {
      return;
    }
    if (in_flight_.wait) {
      in_flight_.wait();
    }
    landed_ = in_flight_.host;
    in_flight_ = PendingFlagRead();
  };
  take();
  if (!in_flight_.started() && !capturing(log_.device())) {
    in_flight_ = start_flag_read_(log_);
    if (!in_flight_.started()) {  // a device whose table reads where the tensor lies
      in_flight_.host = log_.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    }
    take();
  }
  std::vector<StepRecord> records;
  if (!landed_.defined()) {
    return records;
  }
  const double* log = landed_.data_ptr<double>();
  const auto logged = static_cast<int64_t>(log[0]);
  for (int64_t n = std::max<int64_t>(0, logged - kStepLogRows); n < logged; ++n) {
    const double* row = log + (1 + n % kStepLogRows) * kStepLogFields;
    StepRecord r;
    r.update = first_update_ + static_cast<int64_t>(row[kLogUpdate]);
    r.scale = row[kLogScale];
    r.new_scale = row[kLogNewScale];
    r.found_inf = row[kLogFoundInf] != 0.0;
    const auto bits = static_cast<int64_t>(row[kLogFoundInf]);
    for (int j = 0; j < kOverflowOptimizerBits; ++j) {
      if ((bits >> j) & 1) {
        r.overflowed_optimizers.push_back(j);
      }
    }
    r.change = static_cast<ScaleChange>(static_cast<int>(row[kLogEvent]));
    if (row[kLogGradNorm] >= 0.0 || std::isnan(row[kLogGradNorm])) {
      r.grad_norm = row[kLogGradNorm];
    }
    if (row[kLogFirstOverflow] >= 0.0) {
      const auto key = static_cast<int64_t>(row[kLogFirstOverflow]);
      r.first_overflow = GradientPlace{static_cast<int>(key >> 32), key & 0xffffffff};
    }
    r.nan_count = static_cast<int64_t>(row[kLogNanCount]);
    r.inf_count = static_cast<int64_t>(row[kLogInfCount]);
    records.push_back(r);
  }
  return records;
}

void StepLog::clear(int64_t first_update) {
  first_update_ = first_update;
  in_flight_ = PendingFlagRead();
  landed_ = at::Tensor();
  if (log_.defined()) {
    log_.zero_();
  }
  forget_overflow_site();
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
