// GradScaler front code: option checks, the per-optimizer stage machine, and routing
// to the backends through kernel_routing.h. No kernels here.
//
// NOTE: [Scaler state on the device]
// The scale (float32) and the growth tracker (int32) are 0-dim tensors on the device of
// the first tensor the scaler meets (the first scaled output, or the first gradient when
// unscale_/step come before any scale()). unscale_ writes each optimizer's overflow flag
// on that device and update() changes the scale there, so neither waits for the device.
// Only step() reads one 4-byte flag back, to decide whether to call optimizer.step(),
// and get_scale()/state_dict() read the scale back (the opt-in guards and diagnostics
// that read more say so: NOTE: [Guards], NOTE: [Diagnostics without host
// synchronisation]). Until the tensors exist the same state is kept on the host
// (pending_*), advanced by the same rule (detail::next_scale_state).
// The scale is 0-dim so that it never broadcasts a 0-dim loss to shape [1]; float16 and
// bfloat16 outputs are promoted explicitly (a 0-dim float32 operand would not promote them).

#include <lucid/amp/grad_scaler.h>

#include <lucid/optim/fused_optimizer.h>

#include "amp/kernel_routing.h"
#include "amp/scaler_state.h"
#include "amp/scale_rule.h"

#include <c10/util/Exception.h>

#include <cfloat>
#include <cmath>
#include <limits>

namespace lucid {
namespace amp {
namespace {

// Collects the defined gradients of an optimizer and refuses, before any is touched,
// the dtypes the scaler cannot unscale.
std::vector<torch::Tensor> checked_gradients(const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> grads;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const torch::Tensor& grad = params[i].grad();
      if (!grad.defined()) {
        continue;  // a parameter that took no part in this backward()
      }
      const at::ScalarType dtype = grad.scalar_type();
      TORCH_CHECK_NOT_IMPLEMENTED(
          !at::isComplexType(dtype), "GradScaler cannot unscale complex gradients: parameter ",
          i, " of param group ", g, " has a ", dtype,
          " gradient. Nothing was unscaled; keep complex parameters out of scaled optimizers.");
      TORCH_CHECK_VALUE(
          dtype != at::kHalf, "Attempting to unscale float16 gradients: parameter ", i,
          " of param group ", g,
          " has a Half gradient. Nothing was unscaled. Loss scaling needs float32 master "
          "weights: keep the parameters in float32 and let lucid::amp::autocast run the "
          "forward pass in half precision.");
      TORCH_CHECK_NOT_IMPLEMENTED(
          dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16,
          "GradScaler cannot unscale ", dtype, " gradients (parameter ", i, " of param group ",
          g, "); supported: Float, Double, BFloat16.");
      grads.push_back(grad);
    }
  }
  return grads;
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  pending_scale_ = detail::checked_scale(options_.init_scale(), "init_scale");
  detail::check_growth_factor(options_.growth_factor());
  detail::check_backoff_factor(options_.backoff_factor());
  detail::check_growth_interval(options_.growth_interval());
  // Guards (NOTE: [Guards] in src/amp/guards.cpp); off by default.
  detail::check_min_scale(options_.min_scale());
  detail::check_max_scale(options_.max_scale());
  TORCH_CHECK_VALUE(options_.min_scale() <= options_.max_scale(), "GradScaler: min_scale ",
                    options_.min_scale(), " is above max_scale ", options_.max_scale(), ".");
  detail::check_hysteresis(options_.hysteresis());
  detail::check_scale_within_guards(pending_scale_, options_.min_scale(), options_.max_scale(),
                                    "init_scale");
}

void GradScaler::lazy_init_(const at::Device& device) {
  if (scale_.defined()) {
    return;
  }
  scale_ = at::full({}, pending_scale_, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::full({}, pending_growth_tracker_,
                             at::TensorOptions().dtype(at::kInt).device(device));
  if (guarded_update_()) {
    ensure_overflow_tracker_();
  }
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) {
  if (!options_.enabled()) {
    return outputs;
  }
  TORCH_CHECK(outputs.defined(), "GradScaler::scale got an undefined tensor.");
  lazy_init_(outputs.device());
  const at::ScalarType dtype = at::promote_types(outputs.scalar_type(), at::kFloat);
  // A CPU scale multiplies a tensor on any device as a scalar; a device scale meeting
  // CPU outputs (a model split over devices) is copied over.
  const torch::Tensor& s =
      (scale_.is_cpu() || scale_.device() == outputs.device()) ? scale_ : scale_.to(outputs.device());
  return outputs.to(dtype) * s;
}

std::vector<torch::Tensor> GradScaler::scale(const std::vector<torch::Tensor>& outputs) {
  if (!options_.enabled()) {
    return outputs;
  }
  std::vector<torch::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& out : outputs) {
    scaled.push_back(scale(out));
  }
  return scaled;
}

GradScaler::PerOptimizer& GradScaler::record_for_(const torch::optim::Optimizer& optimizer) {
  return per_optimizer_[&optimizer];
}

void GradScaler::record_overflow_(torch::optim::Optimizer& optimizer, PerOptimizer& record,
                                  GradientPass pass) {
  const std::vector<torch::Tensor> grads = checked_gradients(optimizer);
  if (!grads.empty()) {
    lazy_init_(grads.front().device());
  }
  // With no gradients (e.g. this rank holds no shard of this optimizer) the flag is still
  // made, clean, whenever the scale exists, so that a hook runs on every rank alike.
  if (scale_.defined()) {
    torch::Tensor found_inf = at::zeros({}, scale_.options());
    if (pass == GradientPass::kUnscale) {
      detail::unscale_grads_(grads, scale_, found_inf);
    } else {
      // NOTE: [Scaler-aware optimizers] in src/optim: the optimizer unscales them itself.
      detail::check_grads_finite_(grads, scale_, found_inf);
    }
    if (found_inf_hook_) {
      found_inf_hook_(found_inf);
    }
    record.found_inf = found_inf;
  }
}

void GradScaler::set_found_inf_hook(FoundInfHook hook) { found_inf_hook_ = std::move(hook); }

std::optional<torch::Tensor> GradScaler::step_scaler_aware_(torch::optim::Optimizer& optimizer,
                                                            PerOptimizer& record) {
  auto& aware = dynamic_cast<lucid::optim::ScalerAware&>(optimizer);
  // Gradients unscale_'d already are handed over as they are; otherwise the optimizer
  // divides them by the scale inside its own kernel.
  torch::Tensor scale_for_optimizer;
  if (record.stage == OptimizerStage::kReady) {
    record_overflow_(optimizer, record, GradientPass::kCheckOnly);
    scale_for_optimizer = scale_;
  }
  aware.set_grad_scaling(scale_for_optimizer, record.found_inf);
  torch::Tensor result = optimizer.step();
  record.stage = OptimizerStage::kStepped;
  if (options_.graph_safe()) {
    // The host never learns here whether the step was skipped: the flag stays unread and
    // the update's counters are settled later (NOTE: [Diagnostics without host
    // synchronisation]); steps_taken/steps_skipped do not count graph-safe steps.
    return result;
  }
  // Read after the launch: the step was already skipped on the device if needed, the
  // flag only tells the caller.
  const bool overflow = read_found_inf_(&optimizer, record);
  note_step_(optimizer, overflow);
  return overflow ? std::nullopt : std::optional<torch::Tensor>(result);
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    return;
  }
  PerOptimizer& record = record_for_(optimizer);
  TORCH_CHECK(record.stage != OptimizerStage::kUnscaled,
              "unscale_() has already been called on this optimizer since the last update(); "
              "call it at most once per optimizer per iteration.");
  TORCH_CHECK(record.stage != OptimizerStage::kStepped,
              "unscale_() is being called after step() for this optimizer; call unscale_() "
              "between backward() and step(), or call update() first.");
  record_overflow_(optimizer, record, GradientPass::kUnscale);
  record.stage = OptimizerStage::kUnscaled;
}

std::optional<torch::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer) {
  return step(optimizer, nullptr);
}

std::optional<torch::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer,
                                              torch::optim::Optimizer::LossClosure closure) {
  if (!options_.enabled()) {
    return optimizer.step(std::move(closure));
  }
  TORCH_CHECK(!closure,
              "GradScaler::step does not accept a closure while the scaler is enabled: the "
              "closure would re-run backward() and its gradients would never be unscaled. "
              "Run forward/backward yourself, then call step(optimizer).");
  PerOptimizer& record = record_for_(optimizer);
  TORCH_CHECK(record.stage != OptimizerStage::kStepped,
              "step() has already been called on this optimizer since the last update(); "
              "call update() once per iteration, after the steps.");
  const bool scaler_aware = dynamic_cast<lucid::optim::ScalerAware*>(&optimizer) != nullptr;
  TORCH_CHECK(scaler_aware || !options_.graph_safe(),
              "GradScaler in graph_safe mode skips steps on the device, which only lucid::optim "
              "fused optimizers (FusedSGD, FusedAdam, FusedAdamW) can do; use one of them, or "
              "turn graph_safe off.");
  if (scaler_aware) {
    return step_scaler_aware_(optimizer, record);
  }
  if (record.stage == OptimizerStage::kReady) {
    record_overflow_(optimizer, record, GradientPass::kUnscale);
    record.stage = OptimizerStage::kUnscaled;
  }
  // The one host read of a step: a 4-byte flag, on the scale's device.
  const bool overflow = read_found_inf_(&optimizer, record);
  if (overflow) {
    record.stage = OptimizerStage::kStepped;
    note_step_(optimizer, /*skipped=*/true);
    return std::nullopt;
  }
  torch::Tensor result = optimizer.step();
  record.stage = OptimizerStage::kStepped;
  note_step_(optimizer, /*skipped=*/false);
  return result;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled()) {
    return;
  }
  if (new_scale.has_value()) {
    const float value = detail::checked_scale(*new_scale, "update(new_scale)");
    detail::check_scale_within_guards(value, options_.min_scale(), options_.max_scale(),
                                      "update(new_scale)");
    if (scale_.defined()) {
      scale_.fill_(value);
    } else {
      pending_scale_ = value;
    }
    finish_iteration_();
    return;
  }
  std::optional<BackoffEvent> backoff;
  if (scale_.defined()) {
    // May throw (min_scale) before anything changed (src/amp/guards.cpp).
    backoff = update_on_device_();
  } else {
    // No tensor exists yet, so nothing can have overflowed: advance the host copy.
    update_on_host_();
  }
  finish_iteration_();
  if (backoff.has_value() && diag_.on_backoff) {
    diag_.on_backoff(*backoff);
  }
}

double GradScaler::get_scale() const {
  if (!options_.enabled()) {
    return 1.0;
  }
  return scale_.defined() ? static_cast<double>(scale_.item<float>()) : pending_scale_;
}

bool GradScaler::is_enabled() const { return options_.enabled(); }

const GradScalerOptions& GradScaler::options() const { return options_; }

OptimizerStage GradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  const auto it = per_optimizer_.find(&optimizer);
  return it == per_optimizer_.end() ? OptimizerStage::kReady : it->second.stage;
}

int64_t GradScaler::growth_tracker_value_() const {
  return growth_tracker_.defined() ? growth_tracker_.item<int32_t>() : pending_growth_tracker_;
}

int64_t GradScaler::overflow_tracker_value_() const {
  return overflow_tracker_.defined() ? overflow_tracker_.item<int32_t>()
                                     : pending_overflow_tracker_;
}

}  // namespace amp
}  // namespace lucid
