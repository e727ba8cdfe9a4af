// GradScaler's guards (min_scale, max_scale, hysteresis) and the schedule update that
// applies them.
//
// NOTE: [Guards]
// The guards are off by default (min_scale 0, max_scale +inf, hysteresis 1); then
// update() runs exactly the seed's path: the routed update kernel (CPU twin, ATen's CUDA
// kernel, or the generic ops), and reads nothing back.
// - max_scale and hysteresis change the update itself. It then runs
//   detail::update_scale_guarded_: the CPU twin for a CPU scale, the generic ATen-ops path
//   on every other device (ATen's CUDA kernel knows no guards); still no host
//   synchronisation. Hysteresis keeps one more 0-dim int32 tensor beside the growth
//   tracker: the consecutive overflows it has absorbed (overflow_tracker_).
// - min_scale is a check, so the host has to know whether an update backs off and to
//   what. update() then reads the flags step() has not read (optimizers that were only
//   unscale_'d), predicts the outcome with the host mirror of the trackers (NOTE:
//   [Diagnostics without host synchronisation]), and only for a backoff computes the
//   update into copies and reads the new scale (4 bytes). Below min_scale it throws
//   c10::Error and applies nothing: scale, trackers, counters and the optimizers' stages
//   stay as they were, and last_overflow() names the gradients of the optimizers that
//   were stepped (or asked with overflowed()). A backoff callback takes
//   the same path (it is handed the old and the new scale).

#include <lucid/amp/grad_scaler.h>

#include "amp/kernel_routing.h"
#include "amp/scaler_state.h"
#include "amp/scale_rule.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

namespace lucid {
namespace amp {

bool GradScaler::guarded_update_() const {
  return options_.hysteresis() > 1 || std::isfinite(options_.max_scale());
}

void GradScaler::ensure_overflow_tracker_() {
  if (scale_.defined() && !overflow_tracker_.defined()) {
    overflow_tracker_ = at::full({}, pending_overflow_tracker_, growth_tracker_.options());
  }
}

void GradScaler::run_update_kernel_(at::Tensor& scale, at::Tensor& growth_tracker,
                                    at::Tensor& overflow_tracker,
                                    const at::Tensor& found_inf) const {
  if (guarded_update_()) {
    detail::update_scale_guarded_(scale, growth_tracker, overflow_tracker, found_inf,
                                  options_.growth_factor(), options_.backoff_factor(),
                                  options_.growth_interval(), options_.hysteresis(),
                                  options_.max_scale());
  } else {
    detail::update_scale_(scale, growth_tracker, found_inf, options_.growth_factor(),
                          options_.backoff_factor(), options_.growth_interval());
  }
}

std::optional<BackoffEvent> GradScaler::update_on_device_() {
  if (guarded_update_()) {
    ensure_overflow_tracker_();  // a load may have turned hysteresis or max_scale on
  }
  const bool decide_on_host = options_.min_scale() > 0.0 || static_cast<bool>(diag_.on_backoff);
  if (decide_on_host) {
    // Only unscale_'d, never stepped: the optimizer may be gone, so its gradients are not
    // inspected (the report counts it as uninspected); the flag is ours.
    for (auto& entry : per_optimizer_) {
      read_found_inf_(nullptr, entry.second);
    }
  }
  // Overflow in any optimizer since the last update backs the scale off; nothing
  // recorded counts as an overflow-free update.
  // One optimizer's flag is used as it is: each kernel launched here comes after step's
  // read of the flag, with the device idle, so it shows in a step's time.
  torch::Tensor found_inf;
  bool known = true;
  bool found = false;
  for (const auto& entry : per_optimizer_) {
    if (entry.second.found_inf.defined()) {
      found_inf = found_inf.defined() ? at::maximum(found_inf, entry.second.found_inf)
                                      : entry.second.found_inf;
      known = known && entry.second.found_inf_read;
      found = found || entry.second.found_inf_value;
    }
  }
  if (!found_inf.defined()) {
    found_inf = at::zeros({}, scale_.options());
  }
  if (!decide_on_host || !predicts_backoff_(found)) {
    run_update_kernel_(scale_, growth_tracker_, overflow_tracker_, found_inf);
    note_schedule_update_(known, found, found_inf);
    return std::nullopt;
  }

  // A backoff that min_scale or the callback must see: compute it into copies first.
  const float old_scale = scale_.item<float>();
  at::Tensor scale = scale_.clone();
  at::Tensor growth_tracker = growth_tracker_.clone();
  at::Tensor overflow_tracker =
      overflow_tracker_.defined() ? overflow_tracker_.clone() : at::Tensor();
  run_update_kernel_(scale, growth_tracker, overflow_tracker, found_inf);
  const float new_scale = scale.item<float>();
  if (options_.min_scale() > 0.0 && static_cast<double>(new_scale) < options_.min_scale()) {
    std::ostringstream what;
    if (diag_.last_overflow.has_value() &&
        diag_.last_overflow->iteration == diag_.counters.updates) {
      what << diag_.last_overflow->to_string();
    }
    TORCH_CHECK(false, "GradScaler: the loss is diverging: this update would back the scale off ",
                "from ", old_scale, " to ", new_scale, ", below min_scale ",
                options_.min_scale(), ", after ", diag_.counters.overflow_streak + 1,
                " consecutive overflowing update(s). ", what.str(),
                "\nNothing was applied: the scale and the optimizers' stages are as before "
                "this call, and last_overflow() names the gradients. Look for inf/NaN in the "
                "data, the loss or the model, lower the learning rate, or lower min_scale.");
  }
  scale_.copy_(scale);
  growth_tracker_.copy_(growth_tracker);
  if (overflow_tracker.defined()) {
    overflow_tracker_.copy_(overflow_tracker);
  }
  note_schedule_update_(/*known=*/true, /*found=*/true, found_inf);

  BackoffEvent event;
  event.iteration = diag_.counters.updates;  // finish_iteration_ has not counted it yet
  event.old_scale = old_scale;
  event.new_scale = new_scale;
  event.overflow_streak = diag_.counters.overflow_streak;
  if (diag_.last_overflow.has_value() && diag_.last_overflow->iteration == event.iteration) {
    event.report = &*diag_.last_overflow;
  }
  return event;
}

void GradScaler::update_on_host_() {
  detail::ScaleGuards guards;
  guards.hysteresis = options_.hysteresis();
  guards.max_scale = static_cast<float>(options_.max_scale());
  const detail::ScaleState next = detail::next_scale_state(
      {pending_scale_, static_cast<int32_t>(pending_growth_tracker_),
       static_cast<int32_t>(pending_overflow_tracker_)},
      /*found_inf=*/false, options_.growth_factor(), options_.backoff_factor(),
      options_.growth_interval(), guards);
  pending_scale_ = next.scale;
  pending_growth_tracker_ = next.growth_tracker;
  pending_overflow_tracker_ = next.overflow_tracker;
  note_schedule_update_(/*known=*/true, /*found=*/false, at::Tensor());
}

}  // namespace amp
}  // namespace lucid
