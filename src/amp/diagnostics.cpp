// GradScaler's diagnostics: counters, skipped steps, overflow reports, the backoff
// callback and parameter names (include/lucid/amp/diagnostics.h).
//
// NOTE: [Diagnostics without host synchronisation]
// The default path must not wait for the device more than it did (NOTE: [Scaler state on
// the device]): step() reads one flag per optimizer, update() reads nothing. So every
// number here comes from what the host knows already, or is read when it is asked for:
// - steps_taken / steps_skipped / step_skipped(): decided in step(), which read the flag.
// - The overflow report: built where the host learns of an overflow (step() skipping,
//   overflowed()). It is the slow path: per-gradient NaN and inf counts, read once per
//   device, and the scale. A guarded update() that reads an unscale_-only optimizer's
//   flag counts that optimizer as uninspected and does not touch it: the scaler keys
//   optimizers by address and cannot know whether one still exists at update().
//   The gradients are unscaled in place by then, so it counts non-finite entries after
//   unscaling: exactly the set the flag was raised for.
// - backoffs / growths / overflow_updates / overflow_streak: what update() did on the
//   device. The host mirrors the two trackers (growth, and overflows absorbed by
//   hysteresis) and advances them with detail::next_scale_state, the rule every backend
//   follows, given whether the update saw an overflow. Usually every flag of an update was
//   read by step(), and the mirror advances at once. An optimizer that was unscale_'d but
//   not stepped has a flag nobody read: that update is queued with its combined device
//   flag, and the queue is read (one read of all its flags) when counters() is asked,
//   before a load, or when it reaches kMaxPendingUpdates entries.
// - With min_scale or a backoff callback, update() reads the unread flags itself (NOTE:
//   [Guards]), so nothing is queued.

#include <lucid/amp/grad_scaler.h>

#include "amp/scale_rule.h"

#include <c10/util/Exception.h>

#include <map>
#include <sstream>

namespace lucid {
namespace amp {
namespace {

// Bounds the queue of updates whose flag has not been read (a loop that unscale_s an
// optimizer and never steps it): one 4-byte-per-update read every this many updates.
constexpr size_t kMaxPendingUpdates = 1024;

}  // namespace

std::string OverflowReport::to_string() const {
  std::ostringstream out;
  out << "Overflow in iteration " << iteration << " at scale " << scale << ": " << optimizers
      << " optimizer(s), " << gradients.size() << " gradient(s) with inf/NaN.";
  if (uninspected_optimizers > 0) {
    out << "\n  " << uninspected_optimizers
        << " optimizer(s) were only unscale_'d and their flag was read by update(): their "
           "gradients were not inspected (call overflowed(optimizer) before update()).";
  }
  if (gradients.empty() && uninspected_optimizers < optimizers) {
    out << "\n  No local gradient holds inf/NaN: the flag was raised by a found_inf hook "
           "(another rank overflowed), or the gradients changed after unscale_.";
  }
  for (const auto& g : gradients) {
    out << "\n  param group " << g.param_group << " index " << g.index;
    if (!g.name.empty()) {
      out << " '" << g.name << "'";
    }
    out << " " << c10::IntArrayRef(g.sizes) << " " << g.dtype << " on " << g.device << ": "
        << g.nan_count << " NaN and " << g.inf_count << " inf of " << g.numel << " entries";
  }
  return out.str();
}

bool GradScaler::read_found_inf_(const torch::optim::Optimizer* optimizer,
                                 PerOptimizer& record) {
  if (!record.found_inf.defined()) {
    return false;  // no scale yet, so nothing was unscaled: clean
  }
  if (!record.found_inf_read) {
    record.found_inf_value = record.found_inf.item<float>() != 0.0f;
    record.found_inf_read = true;
    if (record.found_inf_value) {
      note_overflow_(optimizer);
    }
  }
  return record.found_inf_value;
}

void GradScaler::note_step_(const torch::optim::Optimizer& optimizer, bool skipped) {
  if (skipped) {
    ++diag_.counters.steps_skipped;
  } else {
    ++diag_.counters.steps_taken;
  }
  diag_.last_step_skipped[&optimizer] = skipped;
}

void GradScaler::note_overflow_(const torch::optim::Optimizer* optimizer_or_null) {
  const int64_t iteration = diag_.counters.updates;
  if (!diag_.last_overflow.has_value() || diag_.last_overflow->iteration != iteration) {
    OverflowReport report;
    report.iteration = iteration;
    report.scale = scale_.defined() ? static_cast<double>(scale_.item<float>()) : pending_scale_;
    diag_.last_overflow = std::move(report);
  }
  OverflowReport& report = *diag_.last_overflow;
  ++report.optimizers;
  if (optimizer_or_null == nullptr) {
    ++report.uninspected_optimizers;
    return;
  }
  const torch::optim::Optimizer& optimizer = *optimizer_or_null;

  // NaN and inf counts of every gradient, on its own device, read once per device.
  std::vector<NonFiniteGradient> candidates;
  std::vector<at::Tensor> counts;
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& params = groups[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) {
        continue;
      }
      const at::Tensor values = grad.is_sparse() ? grad._values() : grad;
      NonFiniteGradient entry;
      entry.optimizer = &optimizer;
      entry.param_group = g;
      entry.index = i;
      const auto name = diag_.names.find(params[i].unsafeGetTensorImpl());
      if (name != diag_.names.end() && !name->second.param.expired()) {
        entry.name = name->second.name;
      }
      entry.numel = values.numel();
      entry.sizes = grad.sizes().vec();
      entry.dtype = grad.scalar_type();
      entry.device = grad.device();
      candidates.push_back(std::move(entry));
      counts.push_back(at::stack({values.isnan().sum(), values.isinf().sum()}));
    }
  }
  std::map<std::string, std::vector<size_t>> by_device;
  for (size_t k = 0; k < counts.size(); ++k) {
    by_device[counts[k].device().str()].push_back(k);
  }
  std::vector<std::pair<int64_t, int64_t>> host(counts.size());
  for (const auto& device : by_device) {
    std::vector<at::Tensor> same_device;
    for (const size_t k : device.second) {
      same_device.push_back(counts[k]);
    }
    const at::Tensor read = at::stack(same_device).to(at::kCPU, at::kLong).contiguous();
    const int64_t* data = read.data_ptr<int64_t>();
    for (size_t j = 0; j < device.second.size(); ++j) {
      host[device.second[j]] = {data[2 * j], data[2 * j + 1]};
    }
  }
  for (size_t k = 0; k < candidates.size(); ++k) {
    if (host[k].first + host[k].second > 0) {
      candidates[k].nan_count = host[k].first;
      candidates[k].inf_count = host[k].second;
      report.gradients.push_back(std::move(candidates[k]));
    }
  }
}

void GradScaler::note_schedule_update_(bool known, bool found, const at::Tensor& flag) {
  if (known && diag_.pending.empty()) {
    diag_.pending.push_back({found, at::Tensor()});
    resolve_pending_();  // reads nothing: the host knows `found`
    return;
  }
  diag_.pending.push_back({found, known ? at::Tensor() : flag});
  if (diag_.pending.size() >= kMaxPendingUpdates) {
    resolve_pending_();
  }
}

void GradScaler::resolve_pending_() const {
  if (diag_.pending.empty()) {
    return;
  }
  std::vector<at::Tensor> unread;
  for (const auto& p : diag_.pending) {
    if (p.flag.defined()) {
      unread.push_back(p.flag.reshape({}));
    }
  }
  // The one read: every unread flag at once (they all live on the scale's device).
  at::Tensor host;
  if (!unread.empty()) {
    host = at::stack(unread).to(at::kCPU, at::kFloat).contiguous();
  }
  const float* read = host.defined() ? host.data_ptr<float>() : nullptr;
  detail::ScaleGuards guards;
  guards.hysteresis = options_.hysteresis();
  for (const auto& p : diag_.pending) {
    const bool found = p.flag.defined() ? *read++ != 0.0f : p.found;
    detail::ScaleEvent event = detail::ScaleEvent::kNone;
    // Only the trackers matter here: they follow the same rule on every backend.
    const detail::ScaleState next = detail::next_scale_state(
        {1.0f, diag_.growth_tracker, diag_.overflow_tracker}, found, options_.growth_factor(),
        options_.backoff_factor(), options_.growth_interval(), guards, &event);
    diag_.growth_tracker = next.growth_tracker;
    diag_.overflow_tracker = next.overflow_tracker;
    ScalerCounters& c = diag_.counters;
    c.overflow_updates += found ? 1 : 0;
    c.overflow_streak = found ? c.overflow_streak + 1 : 0;
    c.backoffs += event == detail::ScaleEvent::kBackoff ? 1 : 0;
    c.growths += event == detail::ScaleEvent::kGrowth ? 1 : 0;
  }
  diag_.pending.clear();
}

bool GradScaler::predicts_backoff_(bool found) const {
  resolve_pending_();
  detail::ScaleGuards guards;
  guards.hysteresis = options_.hysteresis();
  detail::ScaleEvent event = detail::ScaleEvent::kNone;
  detail::next_scale_state({1.0f, diag_.growth_tracker, diag_.overflow_tracker}, found,
                        options_.growth_factor(), options_.backoff_factor(),
                        options_.growth_interval(), guards, &event);
  return event == detail::ScaleEvent::kBackoff;
}

void GradScaler::finish_iteration_() {
  per_optimizer_.clear();
  ++diag_.counters.updates;
}

ScalerCounters GradScaler::counters() const {
  resolve_pending_();
  return diag_.counters;
}

bool GradScaler::step_skipped(const torch::optim::Optimizer& optimizer) const {
  const auto it = diag_.last_step_skipped.find(&optimizer);
  return it != diag_.last_step_skipped.end() && it->second;
}

bool GradScaler::overflowed(const torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    return false;
  }
  const auto it = per_optimizer_.find(&optimizer);
  if (it == per_optimizer_.end() || it->second.stage == OptimizerStage::kReady) {
    return false;
  }
  return read_found_inf_(&optimizer, it->second);
}

const std::optional<OverflowReport>& GradScaler::last_overflow() const {
  return diag_.last_overflow;
}

void GradScaler::set_backoff_callback(BackoffCallback callback) {
  diag_.on_backoff = std::move(callback);
}

void GradScaler::set_parameter_names(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
    const std::string& prefix) {
  // Drop the names of parameters that are gone, so the map does not grow without bound.
  for (auto it = diag_.names.begin(); it != diag_.names.end();) {
    it = it->second.param.expired() ? diag_.names.erase(it) : std::next(it);
  }
  for (const auto& item : named_parameters) {
    set_parameter_name(item.value(), prefix + item.key());
  }
}

void GradScaler::set_parameter_name(const torch::Tensor& parameter, const std::string& name) {
  TORCH_CHECK_VALUE(parameter.defined(), "GradScaler::set_parameter_name: the tensor for '",
                    name, "' is undefined.");
  const c10::TensorImpl* key = parameter.unsafeGetTensorImpl();
  diag_.names.erase(key);
  diag_.names.emplace(
      key, Diagnostics::Name{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                                 parameter.getIntrusivePtr()),
                             name});
}

}  // namespace amp
}  // namespace lucid
