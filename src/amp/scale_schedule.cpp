// SPDX-License-Identifier: BSD-3-Clause
// The loss scale, its trackers and their update (NOTE: [Scaler state on the device],
// NOTE: [Guards] in scale_schedule.h).

#include "amp/scale_schedule.h"

#include "amp/kernel_routing.h"
#include "amp/scale_rule.h"

#include <cmath>

namespace lucid {
namespace amp {
namespace detail {

ScaleRule rule_of(const GradScalerOptions& options) {
  ScaleRule rule;
  rule.growth_factor = options.growth_factor();
  rule.backoff_factor = options.backoff_factor();
  rule.growth_interval = options.growth_interval();
  rule.hysteresis = options.hysteresis();
  rule.refill_on_clean = options.hysteresis_refill() == HysteresisRefill::kOnCleanUpdate;
  rule.max_scale = static_cast<float>(options.max_scale());
  return rule;
}

ScaleSchedule::ScaleSchedule(GradScalerOptions options)
    : options_(options), host_scale_(static_cast<float>(options.init_scale())) {}

void ScaleSchedule::place(const at::Device& device) {
  if (scale_.defined()) {
    return;
  }
  scale_ = at::full({}, host_scale_, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ =
      at::full({}, host_growth_tracker_, at::TensorOptions().dtype(at::kInt).device(device));
  if (guarded()) {
    ensure_overflow_tracker();
  }
}

double ScaleSchedule::value() const {
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : host_scale_;
}

void ScaleSchedule::set(float value) {
  TORCH_INTERNAL_ASSERT(scale_.defined(), "the scale is set only once scale() has made it");
  scale_.fill_(value);
}

bool ScaleSchedule::guarded() const {
  return options_.hysteresis() > 1 || std::isfinite(options_.max_scale());
}

void ScaleSchedule::ensure_overflow_tracker() {
  if (scale_.defined() && !overflow_tracker_.defined()) {
    overflow_tracker_ = at::full({}, host_overflow_tracker_, growth_tracker_.options());
  }
}

void ScaleSchedule::run_update_kernel(at::Tensor& scale, at::Tensor& growth_tracker,
                                      at::Tensor& overflow_tracker, const at::Tensor& flags,
                                      const UpdateRecord& record) const {
  // Hysteresis and max_scale off: the overflow tracker takes no part, as in PyTorch's rule.
  at::Tensor unused;
  update_scale_(scale, growth_tracker, guarded() ? overflow_tracker : unused, flags,
                rule_of(options_), record);
}

void ScaleSchedule::advance(const at::Tensor& flags, const UpdateRecord& record) {
  if (guarded()) {
    ensure_overflow_tracker();  // a load may have turned hysteresis or max_scale on
  }
  run_update_kernel(scale_, growth_tracker_, overflow_tracker_, flags, record);
}

ScaleSchedule::Proposal ScaleSchedule::propose(const at::Tensor& flags,
                                               const UpdateRecord& record) {
  if (guarded()) {
    ensure_overflow_tracker();
  }
  Proposal p;
  p.old_scale = scale_.item<float>();
  p.scale = scale_.clone();
  p.growth_tracker = growth_tracker_.clone();
  p.overflow_tracker = overflow_tracker_.defined() ? overflow_tracker_.clone() : at::Tensor();
  p.target = record;
  p.record = {record.counts.clone(),
              record.log.defined() ? record.log.clone() : at::Tensor(),
              record.grad_norm,
              record.overflow_site.defined() ? record.overflow_site.clone() : at::Tensor(),
              record.step_outcomes.defined() ? record.step_outcomes.clone() : at::Tensor(),
              record.stepped};
  p.target_flags = flags;
  p.flags = flags.clone();
  run_update_kernel(p.scale, p.growth_tracker, p.overflow_tracker, p.flags, p.record);
  p.new_scale = p.scale.item<float>();
  // What the rule did, from its own counts: before and after, in one read.
  const at::Tensor read = at::stack({record.counts, p.record.counts}).to(at::kCPU);
  const int64_t* before = read.data_ptr<int64_t>();
  const int64_t* after = before + kUpdateCountFields;
  p.backs_off = after[kCountBackoffs] > before[kCountBackoffs];
  p.overflow_streak = after[kCountOverflowStreak];
  return p;
}

void ScaleSchedule::hold_at(Proposal& proposal, float floor) {
  proposal.scale.fill_(floor);
  proposal.new_scale = floor;
  if (proposal.record.log.defined()) {  // the logged new scale is the one held
    const auto update = static_cast<int64_t>(proposal.record.log[0][0].item<double>()) - 1;
    proposal.record.log[1 + update % kStepLogRows][kLogNewScale].fill_(floor);
  }
}

void ScaleSchedule::commit(const Proposal& proposal) {
  scale_.copy_(proposal.scale);
  growth_tracker_.copy_(proposal.growth_tracker);
  if (proposal.overflow_tracker.defined()) {
    overflow_tracker_.copy_(proposal.overflow_tracker);
  }
  proposal.target.counts.copy_(proposal.record.counts);
  if (proposal.target.log.defined()) {
    proposal.target.log.copy_(proposal.record.log);
  }
  if (proposal.target.overflow_site.defined()) {
    proposal.target.overflow_site.copy_(proposal.record.overflow_site);
  }
  if (proposal.target.step_outcomes.defined()) {
    proposal.target.step_outcomes.copy_(proposal.record.step_outcomes);
  }
  proposal.target_flags.copy_(proposal.flags);
}

ScalerSnapshot ScaleSchedule::snapshot() const {
  ScalerSnapshot s;
  s.options = options_;
  s.scale = scale_.defined() ? scale_.item<float>() : host_scale_;
  s.growth_tracker =
      growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : host_growth_tracker_;
  s.overflow_tracker =
      overflow_tracker_.defined() ? overflow_tracker_.item<int32_t>() : host_overflow_tracker_;
  return s;
}

void ScaleSchedule::apply(const ScalerSnapshot& s) {
  // Every snapshot starts from this scaler's options (scaler_state.h), so what describes
  // the scaler rather than its schedule is the same on both sides.
  TORCH_INTERNAL_ASSERT(s.options.enabled() == options_.enabled() &&
                        s.options.graph_safe() == options_.graph_safe());
  options_ = s.options;
  if (scale_.defined()) {
    scale_.fill_(s.scale);
    growth_tracker_.fill_(s.growth_tracker);
    if (overflow_tracker_.defined()) {
      overflow_tracker_.fill_(s.overflow_tracker);
    } else {
      host_overflow_tracker_ = s.overflow_tracker;
      if (guarded()) {
        ensure_overflow_tracker();
      }
    }
  } else {
    host_scale_ = s.scale;
    host_growth_tracker_ = s.growth_tracker;
    host_overflow_tracker_ = s.overflow_tracker;
  }
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
