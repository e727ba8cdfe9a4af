// SPDX-License-Identifier: BSD-3-Clause
// The scaler's stage machine over OptimizerViews (scaler_core.h).

#include "amp/scaler_core.h"

#include "common/device_kernels.h"
#include "common/plain_tensor.h"

#include <lucid/amp/clip_grad.h>

#include "amp/clip_grad.h"
#include "amp/kernel_routing.h"

#include <c10/util/Exception.h>

#include <sstream>

namespace lucid {
namespace amp {
namespace detail {
namespace {

// "parameter 3 'fc.weight' of param group 0", or without the quotes when unnamed.
std::string describe(size_t group, size_t index, const std::string& name) {
  std::ostringstream out;
  out << "parameter " << index;
  if (!name.empty()) {
    out << " '" << name << "'";
  }
  out << " of param group " << group;
  return out.str();
}

bool has_any_gradient(const OptimizerView& view) {
  for (const auto& params : view.param_groups) {
    for (const auto& param : params) {
      if (param.grad().defined()) {
        return true;
      }
    }
  }
  return false;
}

// The gradients of one optimizer's check, and where the check records those that are
// non-finite (NOTE: [Overflow site] in scale_rule.h).
struct CheckedGradients {
  std::vector<at::Tensor> grads;
  OverflowSite site;
};

// Collects the defined gradients of `view`, keyed by the optimizer's place in the
// iteration `ordinal` and their position among its parameters, and refuses, before any is
// touched, the dtypes the scaler cannot unscale.
CheckedGradients checked_gradients(const OptimizerView& view, int ordinal,
                                   const ScalerDiagnostics& diagnostics) {
  CheckedGradients checked;
  std::vector<at::Tensor>& grads = checked.grads;
  int64_t position = -1;
  for (size_t g = 0; g < view.param_groups.size(); ++g) {
    const auto& params = view.param_groups[g];
    for (size_t i = 0; i < params.size(); ++i) {
      ++position;
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) {
        continue;  // a parameter that took no part in this backward()
      }
      if (!common::is_plain_tensor(grad)) {
        common::check_plain_tensor(
            grad, "GradScaler",
            "the gradient of " + describe(g, i, diagnostics.name_of(params[i])));
      }
      const at::ScalarType dtype = grad.scalar_type();
      const bool supported = dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16;
      if (!supported) {
        const std::string which = describe(g, i, diagnostics.name_of(params[i]));
        TORCH_CHECK_NOT_IMPLEMENTED(
            !at::isComplexType(dtype), "GradScaler cannot unscale complex gradients: ", which,
            " has a ", dtype,
            " gradient. Nothing was unscaled; keep complex parameters out of scaled optimizers.");
        TORCH_CHECK_VALUE(
            dtype != at::kHalf, "Attempting to unscale float16 gradients: ", which,
            " has a Half gradient. Nothing was unscaled. Loss scaling needs float32 master "
            "weights: keep the parameters in float32 and let lucid::amp::autocast run the "
            "forward pass in half precision.");
        TORCH_CHECK_NOT_IMPLEMENTED(false, "GradScaler cannot unscale ", dtype, " gradients (",
                                    which, "); supported: Float, Double, BFloat16.");
      }
      grads.push_back(grad);
      checked.site.keys.push_back(overflow_key(ordinal, position));
    }
  }
  checked.site.slot = diagnostics.step_log().overflow_site();
  return checked;
}

// A hook may leave any non-zero value for an overflow (a sum over ranks, say); the flag is
// then made exactly 1, because PyTorch's fused optimizers skip only on a flag of 1.
void agree(FoundInfHook& hook, at::Tensor& found_inf) {
  hook.agree_(found_inf);
  found_inf.copy_(found_inf.ne(0));
}

// The norm over every gradient a norm hook combines: this optimizer's partial (its
// gradients checked in the same read pass), combined with the flag by the hook, then its
// norm. A non-finite combined norm is an overflow wherever it is taken, so every party
// to the combination skips alike.
at::Tensor combined_norm(FoundInfHook& hook, const CheckedGradients& checked,
                         const at::Tensor& scale, at::Tensor& found_inf, double norm_type) {
  at::Tensor partial =
      check_grads_and_norm_partial_(checked.grads, scale, found_inf, norm_type, checked.site);
  hook.agree_with_norm_(found_inf, partial, norm_type);
  TORCH_CHECK(
      partial.defined() && partial.scalar_type() == at::kFloat && partial.numel() == 1,
      "GradScaler::clip_grad_norm_: the found-inf hook's agree_with_norm_ must leave the norm's "
      "partial a 1-element float32 tensor.");
  at::Tensor norm = norm_of_partial(partial.reshape({}), norm_type);
  // 1 where the hook left the flag non-zero (as agree() makes it) or the norm is not finite.
  found_inf.copy_(found_inf.ne(0).logical_or(norm.isfinite().logical_not()));
  return norm;
}

// A read of `value` (float32, 0-dim) as it is now: its host copy where the device's table
// starts one, else a copy where it lies, read (and waited for) later.
PendingFlagRead read_later(const at::Tensor& value) {
  PendingFlagRead read = start_flag_read_(value);
  if (!read.started()) {
    read.host = value.clone();
  }
  return read;
}

// Runs `check`, which raises the record's flag `found_inf` (its entry of the iteration's
// flags, NOTE: [Overflow flags]); if it throws, the flag is set back to 0 first, so that a
// check that failed records nothing, neither for a second attempt nor for update().
template <typename Check>
void raising_or_clean(at::Tensor& found_inf, Check&& check) {
  try {
    check();
  } catch (...) {
    found_inf.zero_();
    throw;
  }
}

GradScalerOptions validated(const GradScalerOptions& options) {
  validate_options(options);
  return options;
}

}  // namespace

ScalerCore::ScalerCore(const GradScalerOptions& options) : schedule_(validated(options)) {}

at::Tensor ScalerCore::scale(const at::Tensor& outputs) {
  if (!enabled()) {
    return outputs;
  }
  TORCH_CHECK(outputs.defined(), "GradScaler::scale got an undefined tensor.");
  schedule_.place(outputs.device());
  const at::Tensor& scale = schedule_.scale();
  records_.place(scale.device());
  diagnostics_.tally().place(scale.device());
  diagnostics_.step_log().place(scale.device());
  const at::ScalarType dtype = at::promote_types(outputs.scalar_type(), at::kFloat);
  // A CPU scale multiplies a tensor on any device as a scalar; a device scale meeting
  // outputs on another device (a model split over devices) is copied over.
  const at::Tensor& s =
      (scale.is_cpu() || scale.device() == outputs.device()) ? scale : scale.to(outputs.device());
  return outputs.to(dtype) * s;
}

void ScalerCore::record_overflow(const OptimizerView& view, OptimizerRecord& record,
                                 GradientPass pass) {
  const CheckedGradients checked = checked_gradients(view, record.ordinal, diagnostics_);
  // With no gradients (e.g. this rank holds no shard of this optimizer) the flag is still
  // recorded, clean, so that a hook runs on every rank alike.
  at::Tensor found_inf = records_.flag_of(record);
  record.had_gradients = !checked.grads.empty();
  raising_or_clean(found_inf, [&] {
    if (pass == GradientPass::kUnscale) {
      unscale_grads_(checked.grads, schedule_.scale(), found_inf, checked.site);
    } else {
      // NOTE: [Scaler-aware optimizers] in src/optim: the optimizer unscales them itself.
      check_grads_finite_(checked.grads, schedule_.scale(), found_inf, checked.site);
    }
    if (found_inf_hook_) {
      agree(*found_inf_hook_, found_inf);
    }
  });
  record.found_inf = found_inf;
  record.checked = record.had_gradients || static_cast<bool>(found_inf_hook_);
}

void ScalerCore::unscale_(const OptimizerView& view) {
  if (!enabled()) {
    return;
  }
  check_scaled("unscale_");
  OptimizerRecord& record = records_.at(view.key);
  OptimizerRecords::check_can_unscale(record);
  record_overflow(view, record, GradientPass::kUnscale);
  // Whatever the caller queues before step() (a clip of its own) need not finish first.
  start_reading_found_inf(record);
  record.stage = OptimizerStage::kUnscaled;
}

at::Tensor ScalerCore::clip_grad_norm_(const OptimizerView& view, double max_norm,
                                       double norm_type) {
  check_clip_arguments(max_norm, norm_type, "GradScaler::clip_grad_norm_");
  if (!enabled()) {
    std::vector<at::Tensor> params;
    for (const auto& group : view.param_groups) {
      params.insert(params.end(), group.begin(), group.end());
    }
    return ::lucid::amp::clip_grad_norm_(params, max_norm, norm_type);
  }
  check_scaled("clip_grad_norm_");
  OptimizerRecord& record = records_.at(view.key);
  OptimizerRecords::check_can_unscale(record);
  const CheckedGradients checked = checked_gradients(view, record.ordinal, diagnostics_);
  const std::vector<at::Tensor>& grads = checked.grads;
  const at::Tensor& scale = schedule_.scale();
  at::Tensor found_inf = records_.flag_of(record);
  record.had_gradients = !grads.empty();
  // NOTE: [Clipping in the check pass] The one read pass checks the gradients and
  // accumulates their norm; the clip coefficient (PyTorch's: max_norm / (norm + 1e-6),
  // at most 1) then folds into the scale the gradients are divided by. A scaler-aware
  // optimizer gets that divisor and reads the gradients once more inside its own step;
  // any other optimizer gets one write pass of grad * (coefficient / scale). With a norm
  // hook the pass yields the norm's partial, which the hook combines (with the flag, e.g.
  // in one all-reduce across the ranks of a sharded run) before the norm is taken.
  at::Tensor divisor;
  at::Tensor norm;
  raising_or_clean(found_inf, [&] {
    if (found_inf_hook_ && found_inf_hook_->combines_norm()) {
      norm = combined_norm(*found_inf_hook_, checked, scale, found_inf, norm_type);
      divisor = scale / clip_coefficient(norm, max_norm);
    } else {
      norm = check_grads_and_clip_(grads, scale, found_inf, norm_type, max_norm, &divisor,
                                   checked.site);
      if (found_inf_hook_) {
        agree(*found_inf_hook_, found_inf);
      }
    }
  });
  record.found_inf = found_inf;
  record.checked = record.had_gradients || static_cast<bool>(found_inf_hook_);
  // The flag is final here: the write pass below raises it only where it is raised
  // already (a finite norm bounds every |g / scale|, and the coefficient is at most 1),
  // so step() need not wait for that pass.
  start_reading_found_inf(record);
  if (view.set_grad_scaling) {
    record.grad_scale = divisor;
  } else {
    unscale_grads_(grads, divisor, found_inf);
  }
  record.stage = OptimizerStage::kUnscaled;
  clip_norm_ = norm.to(scale.device(), at::kFloat);
  return norm;
}

bool ScalerCore::step(const OptimizerView& view) {
  if (!enabled()) {
    view.step();
    return true;
  }
  check_scaled("step");
  OptimizerRecord& record = records_.at(view.key);
  OptimizerRecords::check_can_step(record);
  if (options().strict_inf_checks()) {
    const bool checked = record.stage == OptimizerStage::kReady
                             ? has_any_gradient(view) || static_cast<bool>(found_inf_hook_)
                             : record.checked;
    TORCH_CHECK(checked,
                "No inf checks were recorded for this optimizer: none of its parameters has a "
                "gradient. Nothing was changed. Call backward() on the scaled loss before "
                "step(), or turn the option strict_inf_checks off to count such steps "
                "instead.");
  }
  const bool scaler_aware = static_cast<bool>(view.set_grad_scaling);
  const bool on_device = counts_on_device(::lucid::capturing(schedule_.scale().device()));
  TORCH_CHECK(
      !(scaler_aware && on_device) || record.ordinal < kMaxSteppedOrdinals, "GradScaler::step: ",
      options().graph_safe() ? "in graph_safe mode" : "in a step captured in a CUDA graph",
      " the update counts each optimizer's step on the device, for at most ", kMaxSteppedOrdinals,
      " optimizers per iteration; this is optimizer ", record.ordinal + 1,
      " since the last update(). Step fewer optimizers per update(), or group their "
      "parameters into fewer optimizers. Nothing was changed.");
  if (!scaler_aware && on_device) {
    const bool graph_safe = options().graph_safe();
    TORCH_CHECK(false, "GradScaler::step: ",
                graph_safe ? "in graph_safe mode" : "in a step captured in a CUDA graph",
                " the scaler skips steps on the device, which only optimizers that take the "
                "overflow flag can do (lucid::optim's FusedSGD, FusedAdam, FusedAdamW; from "
                "Python also PyTorch's fused optimizers); this optimizer's step would need the "
                "host to read the flag. Use one of them, or ",
                graph_safe ? "turn graph_safe off" : "run this step outside the capture",
                ". Nothing was changed.");
  }
  if (scaler_aware) {
    return step_scaler_aware(view, record, on_device);
  }
  if (record.stage == OptimizerStage::kReady) {
    record_overflow(view, record, GradientPass::kUnscale);
    record.stage = OptimizerStage::kUnscaled;
  }
  if (!record.had_gradients) {
    diagnostics_.note_step_without_gradients();
  }
  // The one host read of a step: a 4-byte flag, on the scale's device.
  const bool overflow = read_found_inf(&view, record);
  if (!overflow) {
    view.step();
  }
  record.stage = OptimizerStage::kStepped;
  diagnostics_.note_step(view.key, /*skipped=*/overflow);
  return !overflow;
}

bool ScalerCore::step_scaler_aware(const OptimizerView& view, OptimizerRecord& record,
                                   bool on_device) {
  // Gradients unscale_'d already are handed over as they are; otherwise the optimizer
  // divides them by the scale inside its own kernel.
  at::Tensor scale_for_optimizer = record.grad_scale;  // set by clip_grad_norm_
  if (record.stage == OptimizerStage::kReady) {
    record_overflow(view, record, GradientPass::kCheckOnly);
    if (!on_device) {
      // The outcome is then read without waiting for the optimizer's kernel.
      start_reading_found_inf(record);
    }
    scale_for_optimizer = schedule_.scale();
  }
  if (!record.had_gradients) {
    diagnostics_.note_step_without_gradients();
  }
  view.set_grad_scaling(scale_for_optimizer, record.found_inf);
  view.step();
  record.stage = OptimizerStage::kStepped;
  if (on_device) {
    // The host never learns here whether the step was skipped: the flag stays unread and
    // the update counts the outcome (NOTE: [Steps counted by the update]).
    record.counted_by_update = true;
    diagnostics_.note_device_step(view.key, record.ordinal, records_.step_outcomes());
    return true;
  }
  // The device skipped the step or not; the host learns which when the flag's copy has
  // landed (NOTE: [Diagnostics without host synchronisation]). Until update() the record
  // keeps the parameters, whose gradients the overflow report inspects.
  record.outcome_deferred = true;
  record.deferred_params.clear();
  for (const c10::ArrayRef<at::Tensor> group : view.param_groups) {
    std::vector<WeakTensor>& params = record.deferred_params.emplace_back();
    params.reserve(group.size());
    for (const at::Tensor& p : group) {
      params.emplace_back(p.getIntrusivePtr());
    }
  }
  return true;
}

bool ScalerCore::learn_found_inf(OptimizerRecord& record) {
  if (!record.found_inf.defined() || record.found_inf_read) {
    return false;  // not checked in this iteration (its unscale_ or step threw), or known
  }
  const PendingFlagRead& on_host = record.found_inf_on_host;
  const float flag = on_host.started() ? on_host.value() : record.found_inf.item<float>();
  record.found_inf_value = flag != 0.0f;
  record.found_inf_read = true;
  return record.found_inf_value;
}

bool ScalerCore::read_found_inf(const OptimizerView* view, OptimizerRecord& record) {
  if (learn_found_inf(record)) {
    diagnostics_.note_overflow(view, schedule_.value());
  }
  return record.found_inf_read && record.found_inf_value;
}

void ScalerCore::start_reading_found_inf(OptimizerRecord& record) {
  if (record.found_inf.defined() && !options().graph_safe()) {
    record.found_inf_on_host = start_flag_read_(record.found_inf);
  }
}

void ScalerCore::resolve_deferred_step(OptimizerKey key, OptimizerRecord& record) {
  if (learn_found_inf(record)) {
    // The report inspects the parameters that are still there (a gone one is left
    // undefined, so the others keep their indices).
    std::vector<std::vector<at::Tensor>> params;
    OptimizerView view;
    view.key = key;
    for (const std::vector<WeakTensor>& group : record.deferred_params) {
      std::vector<at::Tensor>& locked = params.emplace_back();
      for (const WeakTensor& p : group) {
        c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> strong = p.lock();
        locked.push_back(strong ? at::Tensor(std::move(strong)) : at::Tensor());
      }
      view.param_groups.emplace_back(locked);
    }
    diagnostics_.note_overflow(&view, schedule_.value());
  }
  diagnostics_.note_step(key, record.found_inf_read && record.found_inf_value);
  record.outcome_deferred = false;
  record.deferred_params.clear();
}

void ScalerCore::resolve_outcomes() {
  diagnostics_.resolve_pending(options());
  records_.for_each([this](OptimizerKey key, OptimizerRecord& record) {
    if (record.outcome_deferred) {
      resolve_deferred_step(key, record);
    }
  });
}

std::vector<ScalerDiagnostics::LateFlag> ScalerCore::read_landed_flags(bool* found) {
  std::vector<ScalerDiagnostics::LateFlag> late;
  records_.for_each([&](OptimizerKey key, OptimizerRecord& record) {
    if (!record.found_inf.defined()) {
      return;
    }
    // Landed: read now, while a stepped optimizer's gradients are there for the report.
    // An unscale_-only optimizer's are not inspected: it may be gone.
    if (record.found_inf_read || record.found_inf_on_host.landed()) {
      if (record.outcome_deferred) {
        resolve_deferred_step(key, record);
      } else {
        read_found_inf(nullptr, record);
      }
    }
    if (record.found_inf_read) {
      *found = *found || record.found_inf_value;
      return;
    }
    late.push_back({key, record.outcome_deferred, record.found_inf_on_host});
  });
  return late;
}

bool ScalerCore::step_skipped(OptimizerKey key) {
  resolve_outcomes();
  return diagnostics_.step_skipped(key, records_.flags(), records_.step_outcomes());
}

const std::optional<OverflowReport>& ScalerCore::last_overflow() {
  resolve_outcomes();
  return diagnostics_.last_overflow();
}

void ScalerCore::update(std::optional<double> new_scale) {
  if (!enabled()) {
    return;
  }
  check_scaled("update");
  // Under a capture the host reads nothing: this iteration's steps were counted on the
  // device, and what earlier ones left is read after it.
  const bool capturing = ::lucid::capturing(schedule_.scale().device());
  if (new_scale.has_value()) {
    if (!capturing) {
      resolve_outcomes();
    }
    const float value = checked_scale(*new_scale, "update(new_scale)");
    check_scale_within_guards(value, options().min_scale(), options().max_scale(),
                              "update(new_scale)");
    schedule_.set(value);
    // No update kernel takes this iteration's flags and logs it, so none counts its steps
    // or sets its flags and its overflow site back.
    count_steps_without_update();
    records_.clear_flags();
    diagnostics_.step_log().forget_overflow_site();
    finish_iteration();
    return;
  }
  // No growth without evidence: an iteration in which no optimizer's gradients were
  // checked says nothing about the scale (PyTorch raises here; strict_inf_checks does too).
  if (!records_.any_checked()) {
    if (!capturing) {
      resolve_outcomes();
    }
    TORCH_CHECK(!options().strict_inf_checks(),
                "No inf checks were recorded prior to update(): no optimizer had a gradient "
                "since the last update(). Nothing was changed. Call step(optimizer) after "
                "backward() on the scaled loss, or turn the option strict_inf_checks "
                "off to count such updates instead.");
    diagnostics_.note_update_without_checks();
    count_steps_without_update();
    finish_iteration();
    return;
  }
  // May throw (min_scale, max_overflow_streak) before anything changed.
  const std::optional<BackoffEvent> backoff = update_on_device(capturing);
  finish_iteration();
  if (backoff.has_value() && diagnostics_.backoff_callback()) {
    diagnostics_.backoff_callback()(*backoff);
  }
}

std::optional<BackoffEvent> ScalerCore::update_on_device(bool capturing) {
  const GradScalerOptions& opts = options();
  const bool decide_on_host = opts.min_scale() > 0.0 || opts.max_overflow_streak() > 0 ||
                              static_cast<bool>(diagnostics_.backoff_callback());
  TORCH_CHECK(!decide_on_host || !capturing,
              "GradScaler::update is being captured in a CUDA graph, but min_scale, "
              "max_overflow_streak or a backoff callback is set: each needs the host to learn "
              "whether an update backs off, which a replayed update cannot tell it. Turn them "
              "off for a captured update, or run update() outside the capture. Nothing was "
              "changed.");
  if (decide_on_host) {
    resolve_outcomes();
    // Only unscale_'d, never stepped: the optimizer may be gone, so its gradients are not
    // inspected (the report counts it as uninspected); the flag is ours.
    records_.for_each([this](OptimizerKey, OptimizerRecord& r) { read_found_inf(nullptr, r); });
  }
  // Overflow in any optimizer since the last update backs the scale off; the update kernel
  // takes every flag of the iteration (NOTE: [Overflow flags]).
  const bool found = records_.any_read_found();
  const at::Tensor& flags = records_.flags();
  DeviceTally& tally = diagnostics_.tally();
  const StepLog& log = diagnostics_.step_log();
  const UpdateRecord record{tally.update_counts(),
                            log.rows(),
                            clip_norm_,
                            log.overflow_site(),
                            records_.step_outcomes(),
                            records_.counted_by_update()};
  if (decide_on_host && found) {
    return update_deciding_on_host(flags, record);
  }
  // Before the schedule moves: a flag read now is reported with the scale as it is; a
  // flag that lands later, with the copy of that scale queued here.
  const bool host_learns = decide_on_host || !counts_on_device(capturing);
  bool read_found = false;
  std::vector<ScalerDiagnostics::LateFlag> late;
  PendingFlagRead scale_at_step;
  if (host_learns) {
    late = read_landed_flags(&read_found);
    if (!late.empty()) {
      scale_at_step = read_later(schedule_.scale());
    }
  }
  // The update's own kernel adds what it did to the device tally.
  schedule_.advance(flags, record);
  tally.note_update();
  if (host_learns) {
    diagnostics_.note_schedule_update(read_found, std::move(late), std::move(scale_at_step), opts);
  }
  return std::nullopt;
}

std::optional<BackoffEvent> ScalerCore::update_deciding_on_host(const at::Tensor& flags,
                                                                const UpdateRecord& record) {
  const GradScalerOptions& opts = options();
  DeviceTally& tally = diagnostics_.tally();
  // Computed into copies first: nothing is applied before the checks below pass.
  ScaleSchedule::Proposal proposal = schedule_.propose(flags, record);
  check_overflow_streak(proposal.overflow_streak);
  const bool below_min = proposal.backs_off && opts.min_scale() > 0.0 &&
                         static_cast<double>(proposal.new_scale) < opts.min_scale();
  if (below_min && opts.min_scale_policy() == MinScalePolicy::kClamp) {
    schedule_.hold_at(proposal, static_cast<float>(opts.min_scale()));
    diagnostics_.note_min_scale_hold();
  } else if (below_min) {
    const OverflowReport* report = diagnostics_.current_overflow();
    TORCH_CHECK(false, "GradScaler: the loss is diverging: this update would back the scale off ",
                "from ", proposal.old_scale, " to ", proposal.new_scale, ", below min_scale ",
                opts.min_scale(), ", after ", proposal.overflow_streak,
                " consecutive overflowing update(s). ", report ? report->to_string() : "",
                "\nNothing was applied: the scale and the optimizers' stages are as before "
                "this call, and last_overflow() names the gradients. Look for inf/NaN in the "
                "data, the loss or the model, lower the learning rate, lower min_scale, or hold "
                "the scale there with min_scale_policy(MinScalePolicy::kClamp).");
  }
  schedule_.commit(proposal);
  tally.note_update();
  diagnostics_.note_schedule_update(/*found=*/true, {}, PendingFlagRead(), opts);
  if (!proposal.backs_off) {
    return std::nullopt;  // absorbed by hysteresis
  }
  BackoffEvent event;
  event.iteration = diagnostics_.iteration();  // finish_iteration has not counted it yet
  event.old_scale = proposal.old_scale;
  event.new_scale = proposal.new_scale;
  event.overflow_streak = proposal.overflow_streak;
  event.report = diagnostics_.current_overflow();
  return event;
}

void ScalerCore::check_scaled(const char* call) const {
  // As torch.amp.GradScaler, whose scale does not exist before the first scale(): the
  // gradients of a loss that was not scaled must not be divided by the scale.
  TORCH_CHECK(schedule_.placed(), call,
              "() was called before any scale(): the scale is made by the first scale() "
              "call, and gradients of a loss that was not scaled must not be divided by it. "
              "Call scale(loss) and backward() on its result first. Nothing was changed.");
}

void ScalerCore::check_overflow_streak(int64_t streak) const {
  const int64_t limit = options().max_overflow_streak();
  if (limit <= 0 || streak < limit) {
    return;
  }
  const OverflowReport* report = diagnostics_.current_overflow();
  TORCH_CHECK(false, "GradScaler: ", streak,
              " consecutive updates saw inf/NaN gradients (max_overflow_streak is ", limit,
              "): every step of those iterations was skipped. ", report ? report->to_string() : "",
              "\nNothing was applied: the scale and the optimizers' stages are as before this "
              "call, and last_overflow() names the gradients. Look for inf/NaN in the data, the "
              "loss or the model, or lower the learning rate.");
}

void ScalerCore::count_steps_without_update() {
  UpdateRecord record;
  record.counts = diagnostics_.tally().update_counts();
  record.step_outcomes = records_.step_outcomes();
  record.stepped = records_.counted_by_update();
  count_steps_(records_.flags(), record);
}

void ScalerCore::finish_iteration() {
  records_.clear();
  clip_norm_ = at::Tensor();
  diagnostics_.finish_iteration();
}

double ScalerCore::get_scale() const { return enabled() ? schedule_.value() : 1.0; }

OptimizerStage ScalerCore::stage(OptimizerKey key) const {
  const OptimizerRecord* record = records_.find(key);
  return record == nullptr ? OptimizerStage::kReady : record->stage;
}

ScalerCounters ScalerCore::counters() {
  resolve_outcomes();
  ScalerCounters counters = diagnostics_.all_counters(options());
  // This iteration's steps that its update will count, counted as it will count them
  // (count_steps) on a host copy of their flags (one read).
  const SteppedOrdinals stepped = records_.counted_by_update();
  if (stepped.any()) {
    const at::Tensor flags = records_.flags().to(at::kCPU);
    int64_t counts[kUpdateCountFields] = {};
    std::vector<float> outcomes(static_cast<size_t>(flags.numel()));
    count_steps(counts, outcomes.data(), flags.data_ptr<float>(), flags.numel(), stepped);
    counters.steps_taken += counts[kCountStepsTaken];
    counters.steps_skipped += counts[kCountStepsSkipped];
  }
  return counters;
}

at::Tensor ScalerCore::found_inf(OptimizerKey key) const {
  const OptimizerRecord* record = records_.find(key);
  TORCH_CHECK(record != nullptr && record->stage != OptimizerStage::kReady,
              "found_inf(optimizer): no overflow check was recorded for this optimizer since "
              "the last update(). Call unscale_(optimizer), clip_grad_norm_(optimizer, ...) or "
              "step(optimizer) first; update() starts a new iteration.");
  // A stage past ready was reached by a check, which made the flag.
  TORCH_INTERNAL_ASSERT(record->found_inf.defined());
  return record->found_inf;
}

bool ScalerCore::overflowed(const OptimizerView& view) {
  if (!enabled()) {
    return false;
  }
  OptimizerRecord* record = records_.find(view.key);
  if (record == nullptr || record->stage == OptimizerStage::kReady) {
    return false;
  }
  return read_found_inf(&view, *record);
}

void ScalerCore::apply(const ScalerSnapshot& snapshot, const ScalerCounters* counters) {
  if (counters != nullptr) {
    diagnostics_.drop_pending();  // outcomes of the run the checkpoint replaces
  } else {
    diagnostics_.resolve_pending(options());  // taken under the old options
  }
  schedule_.apply(snapshot);
  diagnostics_.reset(counters);
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
