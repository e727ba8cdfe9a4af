// SPDX-License-Identifier: BSD-3-Clause
// GradScaler, the C++ front: torch::optim::Optimizer calls become OptimizerViews for the
// core (scaler_core.h), which holds every piece of state.

#include <lucid/amp/grad_scaler.h>

#include "amp/scaler_core.h"
#include "amp/torch_optimizer_view.h"

#include <c10/util/Exception.h>

namespace lucid {
namespace amp {

GradScaler::GradScaler(GradScalerOptions options)
    : core_ptr_(std::make_unique<detail::ScalerCore>(options)) {}

GradScaler::GradScaler(GradScaler&&) noexcept = default;
GradScaler& GradScaler::operator=(GradScaler&&) noexcept = default;
GradScaler::~GradScaler() = default;

detail::ScalerCore& GradScaler::core() {
  TORCH_CHECK(core_ptr_ != nullptr,
              "This GradScaler was moved from; use the scaler it was moved into.");
  return *core_ptr_;
}

const detail::ScalerCore& GradScaler::core() const {
  TORCH_CHECK(core_ptr_ != nullptr,
              "This GradScaler was moved from; use the scaler it was moved into.");
  return *core_ptr_;
}

torch::Tensor GradScaler::scale(const torch::Tensor& outputs) { return core().scale(outputs); }

std::vector<torch::Tensor> GradScaler::scale(const std::vector<torch::Tensor>& outputs) {
  if (!is_enabled()) {
    return outputs;
  }
  std::vector<torch::Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const auto& out : outputs) {
    scaled.push_back(core().scale(out));
  }
  return scaled;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return;
  }
  core().unscale_(detail::view_of(optimizer, nullptr));
}

void GradScaler::unscale_(const OptimizerView& view) { core().unscale_(view); }

torch::Tensor GradScaler::clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm,
                                          double norm_type) {
  return core().clip_grad_norm_(detail::view_of(optimizer, nullptr), max_norm, norm_type);
}

torch::Tensor GradScaler::clip_grad_norm_(const OptimizerView& view, double max_norm,
                                          double norm_type) {
  return core().clip_grad_norm_(view, max_norm, norm_type);
}

std::optional<torch::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer) {
  return step(optimizer, nullptr);
}

std::optional<torch::Tensor> GradScaler::step(torch::optim::Optimizer& optimizer,
                                              torch::optim::Optimizer::LossClosure closure) {
  if (!is_enabled()) {
    return optimizer.step(std::move(closure));
  }
  TORCH_CHECK(!closure,
              "GradScaler::step does not accept a closure while the scaler is enabled: the "
              "closure would re-run backward() and its gradients would never be unscaled. "
              "Run forward/backward yourself, then call step(optimizer).");
  torch::Tensor result;
  const bool ran =
      core().step(detail::view_of(optimizer, [&optimizer, &result] { result = optimizer.step(); }));
  return ran ? std::optional<torch::Tensor>(result) : std::nullopt;
}

bool GradScaler::step(const OptimizerView& view) { return core().step(view); }

void GradScaler::update(std::optional<double> new_scale) { core().update(new_scale); }

double GradScaler::get_scale() const { return core().get_scale(); }

const torch::Tensor& GradScaler::scale_tensor() const { return core().scale_tensor(); }

bool GradScaler::is_enabled() const { return core().enabled(); }

const GradScalerOptions& GradScaler::options() const { return core().options(); }

OptimizerStage GradScaler::stage(const torch::optim::Optimizer& optimizer) const {
  return core().stage(&optimizer);
}

OptimizerStage GradScaler::stage(OptimizerKey key) const { return core().stage(key); }

void GradScaler::set_found_inf_hook(std::shared_ptr<FoundInfHook> hook) {
  core().set_found_inf_hook(std::move(hook));
}

// ---- Diagnostics ----------------------------------------------------------------------

ScalerCounters GradScaler::counters() const {
  // Logically const: reading queued flags settles counts already decided on the device.
  return const_cast<detail::ScalerCore&>(core()).counters();
}

// step_skipped and last_overflow are logically const as counters(): they may read the
// outcome of a scaler-aware step, which the device decided already.
bool GradScaler::step_skipped(const torch::optim::Optimizer& optimizer) const {
  return const_cast<detail::ScalerCore&>(core()).step_skipped(&optimizer);
}

bool GradScaler::step_skipped(OptimizerKey key) const {
  return const_cast<detail::ScalerCore&>(core()).step_skipped(key);
}

torch::Tensor GradScaler::found_inf(const torch::optim::Optimizer& optimizer) const {
  return core().found_inf(&optimizer);
}

torch::Tensor GradScaler::found_inf(OptimizerKey key) const { return core().found_inf(key); }

bool GradScaler::overflowed(const torch::optim::Optimizer& optimizer) {
  if (!is_enabled()) {
    return false;
  }
  return core().overflowed(detail::view_of(optimizer));
}

bool GradScaler::overflowed(const OptimizerView& view) { return core().overflowed(view); }

const std::optional<OverflowReport>& GradScaler::last_overflow() const {
  return const_cast<detail::ScalerCore&>(core()).last_overflow();
}

std::vector<StepRecord> GradScaler::history(bool wait) const {
  // Logically const: it copies the log, which only the updates change.
  return const_cast<detail::ScalerCore&>(core()).history(wait);
}

void GradScaler::set_backoff_callback(BackoffCallback callback) {
  core().diagnostics().set_backoff_callback(std::move(callback));
}

void GradScaler::set_parameter_names(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const std::string& prefix) {
  core().diagnostics().forget_expired_names();
  for (const auto& item : named_parameters) {
    set_parameter_name(item.value(), prefix + item.key());
  }
}

void GradScaler::set_parameter_name(const torch::Tensor& parameter, const std::string& name) {
  core().diagnostics().set_parameter_name(parameter, name);
}

}  // namespace amp
}  // namespace lucid
