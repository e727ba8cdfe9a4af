// GradScaler front code: option checks, the per-optimizer stage machine, and routing
// to the backends through kernel_routing.h. No kernels here.
//
// NOTE: [Scaler state on the device]
// The scale (float32) and the growth tracker (int32) are 0-dim tensors on the device of
// the first tensor the scaler meets (the first scaled output, or the first gradient when
// unscale_/step come before any scale()). unscale_ writes each optimizer's overflow flag
// on that device and update() changes the scale there, so neither waits for the device.
// Only step() reads one 4-byte flag back, to decide whether to call optimizer.step(),
// and get_scale()/state_dict() read the scale back. Until the tensors exist the same
// state is kept on the host (pending_*), advanced by the same rule (cpu::next_scale_state).
// The scale is 0-dim so that it never broadcasts a 0-dim loss to shape [1]; float16 and
// bfloat16 outputs are promoted explicitly (a 0-dim float32 operand would not promote them).

#include <lucid/amp/grad_scaler.h>

#include <lucid/optim/fused_optimizer.h>

#include "amp/kernel_routing.h"
#include "cpu/amp_kernels.h"

#include <c10/util/Exception.h>

#include <cfloat>
#include <cmath>
#include <limits>

namespace lucid {
namespace amp {
namespace {

constexpr const char* kScaleKey = "scale";
constexpr const char* kGrowthFactorKey = "growth_factor";
constexpr const char* kBackoffFactorKey = "backoff_factor";
constexpr const char* kGrowthIntervalKey = "growth_interval";
constexpr const char* kGrowthTrackerKey = "growth_tracker";

// The scale is stored in float32, so it must be a positive float32 value.
float checked_scale(double value, const char* what) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0.0, "GradScaler: ", what,
                    " must be finite and > 0, got ", value, ".");
  TORCH_CHECK_VALUE(value <= static_cast<double>(FLT_MAX), "GradScaler: ", what, " ", value,
                    " exceeds float32's largest finite value ", FLT_MAX,
                    "; the scale is kept in float32, pass a smaller value.");
  const float rounded = static_cast<float>(value);
  TORCH_CHECK_VALUE(rounded > 0.0f, "GradScaler: ", what, " ", value,
                    " rounds to 0 in float32, where the scale is kept; pass a larger value.");
  return rounded;
}

void check_growth_factor(double value) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 1.0,
                    "GradScaler: growth_factor must be finite and > 1.0, got ", value, ".");
}

void check_backoff_factor(double value) {
  TORCH_CHECK_VALUE(value > 0.0 && value < 1.0,
                    "GradScaler: backoff_factor must be in (0, 1), got ", value, ".");
}

// The tracker is int32 on the device (as PyTorch keeps it), so the interval must fit.
void check_growth_interval(int64_t value) {
  TORCH_CHECK_VALUE(value >= 1 && value <= std::numeric_limits<int32_t>::max(),
                    "GradScaler: growth_interval must be in [1, 2147483647], got ", value, ".");
}

// A state_dict carries integers as doubles; they must be whole numbers.
int64_t checked_integer(double value, const char* key) {
  TORCH_CHECK_VALUE(std::isfinite(value) && std::floor(value) == value &&
                        std::abs(value) <= static_cast<double>(std::numeric_limits<int32_t>::max()),
                    "GradScaler::load_state_dict: '", key,
                    "' must be a whole number within int32's range, got ", value, ".");
  return static_cast<int64_t>(value);
}

double required(const std::map<std::string, double>& state, const char* key) {
  const auto it = state.find(key);
  TORCH_CHECK_VALUE(it != state.end(), "GradScaler::load_state_dict: the state has no '", key,
                    "' entry; pass a map produced by GradScaler::state_dict().");
  return it->second;
}

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
  pending_scale_ = checked_scale(options_.init_scale(), "init_scale");
  check_growth_factor(options_.growth_factor());
  check_backoff_factor(options_.backoff_factor());
  check_growth_interval(options_.growth_interval());
}

void GradScaler::lazy_init_(const at::Device& device) {
  if (scale_.defined()) {
    return;
  }
  scale_ = at::full({}, pending_scale_, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::full({}, pending_growth_tracker_,
                             at::TensorOptions().dtype(at::kInt).device(device));
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

void GradScaler::unscale_checked_(torch::optim::Optimizer& optimizer, PerOptimizer& record) {
  const std::vector<torch::Tensor> grads = checked_gradients(optimizer);
  if (!grads.empty()) {
    lazy_init_(grads.front().device());
  }
  // With no gradients (e.g. this rank holds no shard of this optimizer) the flag is still
  // made, clean, whenever the scale exists, so that a hook runs on every rank alike.
  if (scale_.defined()) {
    torch::Tensor found_inf = at::zeros({}, scale_.options());
    detail::unscale_grads_(grads, scale_, found_inf);
    if (found_inf_hook_) {
      found_inf_hook_(found_inf);
    }
    record.found_inf = found_inf;
  }
  record.stage = OptimizerStage::kUnscaled;
}

void GradScaler::set_found_inf_hook(FoundInfHook hook) { found_inf_hook_ = std::move(hook); }

// The scaler-aware counterpart of unscale_checked_: the same checks and flag, but the
// gradients are only read (NOTE: [Scaler-aware optimizers] in src/optim).
void GradScaler::check_checked_(torch::optim::Optimizer& optimizer, PerOptimizer& record) {
  const std::vector<torch::Tensor> grads = checked_gradients(optimizer);
  if (!grads.empty()) {
    lazy_init_(grads.front().device());
  }
  if (scale_.defined()) {
    torch::Tensor found_inf = at::zeros({}, scale_.options());
    detail::check_grads_finite_(grads, scale_, found_inf);
    if (found_inf_hook_) {
      found_inf_hook_(found_inf);
    }
    record.found_inf = found_inf;
  }
}

std::optional<torch::Tensor> GradScaler::step_scaler_aware_(torch::optim::Optimizer& optimizer,
                                                            PerOptimizer& record) {
  auto& aware = dynamic_cast<lucid::optim::ScalerAware&>(optimizer);
  // Gradients unscale_'d already are handed over as they are; otherwise the optimizer
  // divides them by the scale inside its own kernel.
  torch::Tensor scale_for_optimizer;
  if (record.stage == OptimizerStage::kReady) {
    check_checked_(optimizer, record);
    scale_for_optimizer = scale_;
  }
  aware.set_grad_scaling(scale_for_optimizer, record.found_inf);
  torch::Tensor result = optimizer.step();
  record.stage = OptimizerStage::kStepped;
  if (options_.graph_safe()) {
    return result;
  }
  // Read after the launch: the step was already skipped on the device if needed, the
  // flag only tells the caller.
  const bool overflow = record.found_inf.defined() && record.found_inf.item<float>() != 0.0f;
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
  unscale_checked_(optimizer, record);
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
    unscale_checked_(optimizer, record);
  }
  // The one host read of a step: a 4-byte flag, on the scale's device.
  const bool overflow = record.found_inf.defined() && record.found_inf.item<float>() != 0.0f;
  if (overflow) {
    record.stage = OptimizerStage::kStepped;
    return std::nullopt;
  }
  torch::Tensor result = optimizer.step();
  record.stage = OptimizerStage::kStepped;
  return result;
}

void GradScaler::update(std::optional<double> new_scale) {
  if (!options_.enabled()) {
    return;
  }
  if (new_scale.has_value()) {
    const float value = checked_scale(*new_scale, "update(new_scale)");
    if (scale_.defined()) {
      scale_.fill_(value);
    } else {
      pending_scale_ = value;
    }
  } else if (scale_.defined()) {
    // Overflow in any optimizer since the last update backs the scale off; nothing
    // recorded counts as an overflow-free update.
    torch::Tensor found_inf = at::zeros({}, scale_.options());
    for (const auto& entry : per_optimizer_) {
      if (entry.second.found_inf.defined()) {
        found_inf = at::maximum(found_inf, entry.second.found_inf);
      }
    }
    detail::update_scale_(scale_, growth_tracker_, found_inf, options_.growth_factor(),
                          options_.backoff_factor(), options_.growth_interval());
  } else {
    // No tensor exists yet, so nothing can have overflowed: advance the host copy.
    const cpu::ScaleState next = cpu::next_scale_state(
        {pending_scale_, static_cast<int32_t>(pending_growth_tracker_)}, /*found_inf=*/false,
        options_.growth_factor(), options_.backoff_factor(), options_.growth_interval());
    pending_scale_ = next.scale;
    pending_growth_tracker_ = next.growth_tracker;
  }
  per_optimizer_.clear();
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

std::map<std::string, double> GradScaler::state_dict() const {
  if (!options_.enabled()) {
    return {};  // as PyTorch: a disabled scaler has no state
  }
  return {{kScaleKey, get_scale()},
          {kGrowthFactorKey, options_.growth_factor()},
          {kBackoffFactorKey, options_.backoff_factor()},
          {kGrowthIntervalKey, static_cast<double>(options_.growth_interval())},
          {kGrowthTrackerKey, static_cast<double>(growth_tracker_value_())}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!options_.enabled()) {
    return;  // nothing to load into a pass-through, as PyTorch
  }
  // Validate everything first, so that a bad map leaves the scaler as it was.
  const float scale = checked_scale(required(state, kScaleKey), "state 'scale'");
  const double growth_factor = required(state, kGrowthFactorKey);
  check_growth_factor(growth_factor);
  const double backoff_factor = required(state, kBackoffFactorKey);
  check_backoff_factor(backoff_factor);
  const int64_t growth_interval =
      checked_integer(required(state, kGrowthIntervalKey), kGrowthIntervalKey);
  check_growth_interval(growth_interval);
  const int64_t growth_tracker =
      checked_integer(required(state, kGrowthTrackerKey), kGrowthTrackerKey);
  TORCH_CHECK_VALUE(growth_tracker >= 0 && growth_tracker < growth_interval,
                    "GradScaler::load_state_dict: 'growth_tracker' must be in [0, growth_interval=",
                    growth_interval, "), got ", growth_tracker, ".");

  options_.growth_factor(growth_factor).backoff_factor(backoff_factor).growth_interval(growth_interval);
  if (scale_.defined()) {
    scale_.fill_(scale);
    growth_tracker_.fill_(growth_tracker);
  } else {
    pending_scale_ = scale;
    pending_growth_tracker_ = growth_tracker;
  }
}

}  // namespace amp
}  // namespace lucid
