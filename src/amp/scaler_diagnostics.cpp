// SPDX-License-Identifier: BSD-3-Clause
// A scaler's diagnostics (NOTE: [Diagnostics without host synchronisation] in
// scaler_diagnostics.h).

#include "amp/scaler_diagnostics.h"

#include <c10/util/Exception.h>

#include <functional>
#include <limits>
#include <map>
#include <sstream>

namespace lucid {
namespace amp {

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

namespace detail {
namespace {

// Bounds the queue of updates whose flags have not landed on the host: an update() that
// finds this many waits for them.
constexpr size_t kMaxPendingUpdates = 1024;

// NaN and inf counts of every gradient of `view`, on each gradient's own device, read
// once per device. Entries with neither are dropped.
std::vector<NonFiniteGradient> non_finite_gradients(
    const OptimizerView& view, const std::function<std::string(const at::Tensor&)>& name_of) {
  std::vector<NonFiniteGradient> candidates;
  std::vector<at::Tensor> counts;
  for (size_t g = 0; g < view.param_groups.size(); ++g) {
    const auto& params = view.param_groups[g];
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].defined()) {
        continue;  // a parameter that was gone when its late flag was read
      }
      const at::Tensor& grad = params[i].grad();
      if (!grad.defined()) {
        continue;
      }
      const at::Tensor values = grad.is_sparse() ? grad._values() : grad;
      NonFiniteGradient entry;
      entry.optimizer = view.key;
      entry.param_group = g;
      entry.index = i;
      entry.name = name_of(params[i]);
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
  std::vector<NonFiniteGradient> found;
  for (size_t k = 0; k < candidates.size(); ++k) {
    if (host[k].first + host[k].second > 0) {
      candidates[k].nan_count = host[k].first;
      candidates[k].inf_count = host[k].second;
      found.push_back(std::move(candidates[k]));
    }
  }
  return found;
}

}  // namespace

void ScalerDiagnostics::note_step(OptimizerKey key, bool skipped, int64_t iteration) {
  if (skipped) {
    ++counters_.steps_skipped;
  } else {
    ++counters_.steps_taken;
  }
  LastStep& last = last_step_[key];
  if (iteration >= last.iteration) {
    last = {skipped, iteration};
  }
}

const OverflowReport* ScalerDiagnostics::current_overflow() const {
  return last_overflow_.has_value() && last_overflow_->iteration == counters_.updates
             ? &*last_overflow_
             : nullptr;
}

void ScalerDiagnostics::note_overflow(const OptimizerView* view, double scale, int64_t iteration) {
  if (last_overflow_.has_value() && last_overflow_->iteration > iteration) {
    return;  // a late flag of an iteration older than the report kept
  }
  if (!last_overflow_.has_value() || last_overflow_->iteration != iteration) {
    OverflowReport report;
    report.iteration = iteration;
    report.scale = scale;
    last_overflow_ = std::move(report);
  }
  OverflowReport& report = *last_overflow_;
  ++report.optimizers;
  if (view == nullptr) {
    ++report.uninspected_optimizers;
    return;
  }
  for (auto& entry :
       non_finite_gradients(*view, [this](const at::Tensor& p) { return name_of(p); })) {
    report.gradients.push_back(std::move(entry));
  }
}

void ScalerDiagnostics::note_schedule_update(bool found, std::vector<LateFlag> late,
                                             PendingFlagRead scale,
                                             const GradScalerOptions& options) {
  pending_.push_back({found, std::move(late), std::move(scale), counters_.updates});
  resolve_pending(options, /*wait=*/pending_.size() >= kMaxPendingUpdates);
}

void ScalerDiagnostics::resolve_pending(const GradScalerOptions& options, bool wait) {
  size_t done = 0;
  for (; done < pending_.size(); ++done) {
    Pending& p = pending_[done];
    if (!wait) {
      bool all_landed = true;
      for (const LateFlag& late : p.late) {
        all_landed = all_landed && late.flag.landed();
      }
      if (!all_landed) {
        break;
      }
    }
    bool found = p.found;
    for (const LateFlag& late : p.late) {
      const bool set = late.flag.value() != 0.0f;
      if (late.stepped) {
        note_step(late.key, set, p.iteration);
      }
      if (set) {
        note_overflow(nullptr, static_cast<double>(p.scale.value()), p.iteration);
      }
      found = found || set;
    }
    take_update(found, options);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
}

void ScalerDiagnostics::take_update(bool found, const GradScalerOptions& options) {
  learnt_streak_ = found ? learnt_streak_ + 1 : 0;
  if (found) {
    warn_on_streak(options);
  }
}

void ScalerDiagnostics::warn_on_streak(const GradScalerOptions& options) const {
  const int64_t threshold = options.overflow_warning_streak();
  if (threshold <= 0 || learnt_streak_ != threshold) {
    return;  // once per streak: exactly when it reaches the threshold
  }
  TORCH_WARN("GradScaler: ", learnt_streak_,
             " consecutive updates saw inf/NaN gradients, so every step of those iterations "
             "was skipped and the model did not learn. The scale is now backed off toward its "
             "floor; look for inf/NaN in the data, the loss or the model, or lower the "
             "learning rate. ",
             last_overflow_.has_value() ? last_overflow_->to_string() : std::string(),
             "\n(the option overflow_warning_streak sets when this warning comes; 0 "
             "turns it off.)");
}

ScalerCounters ScalerDiagnostics::all_counters(const GradScalerOptions& options) {
  resolve_pending(options);
  ScalerCounters all = counters_;
  tally_.add_to(all);
  return all;
}

void ScalerDiagnostics::reset(const ScalerCounters* counters) {
  if (counters != nullptr) {
    counters_ = *counters;
    step_log_.clear(counters_.updates);
    // The loaded run counts iterations from its own updates: any later step is newer.
    for (auto& entry : last_step_) {
      entry.second.iteration = std::numeric_limits<int64_t>::min();
    }
  } else {
    tally_.add_to(counters_);  // keep counting: fold the tally into the host counters
  }
  learnt_streak_ = counters_.overflow_streak;
  tally_.reset(counters_.overflow_streak);
}

bool ScalerDiagnostics::step_skipped(OptimizerKey key, const at::Tensor& flags,
                                     const at::Tensor& outcomes) const {
  // The newer of what the host learnt and what the device counted: a step of this
  // iteration by its flag, an older one by its outcome.
  const auto host = last_step_.find(key);
  const DeviceTally::Step* device = tally_.last_step(key);
  if (device != nullptr &&
      (host == last_step_.end() || device->iteration >= host->second.iteration)) {
    TORCH_CHECK(!device->lost,
                "step_skipped(optimizer): the outcome of this optimizer's last step (iteration ",
                device->iteration,
                ") is not known: a step of another optimizer captured in a CUDA graph took "
                "its place in the iteration before the outcome was kept. Ask step_skipped() "
                "before capturing, or step the same optimizers in the same order in the "
                "captured iteration as before it.");
    const at::Tensor& outcome = device->outcome.defined()
                                    ? device->outcome
                                    : (device->iteration == counters_.updates ? flags : outcomes)
                                          .select(0, device->ordinal);
    return outcome.item<float>() != 0.0f;
  }
  return host != last_step_.end() && host->second.skipped;
}

std::string ScalerDiagnostics::name_of(const at::Tensor& param) const {
  const auto it = names_.find(param.unsafeGetTensorImpl());
  return it != names_.end() && !it->second.param.expired() ? it->second.name : std::string();
}

void ScalerDiagnostics::forget_expired_names() {
  for (auto it = names_.begin(); it != names_.end();) {
    it = it->second.param.expired() ? names_.erase(it) : std::next(it);
  }
}

void ScalerDiagnostics::set_parameter_name(const at::Tensor& parameter, const std::string& name) {
  TORCH_CHECK_VALUE(parameter.defined(), "GradScaler::set_parameter_name: the tensor for '", name,
                    "' is undefined.");
  const c10::TensorImpl* key = parameter.unsafeGetTensorImpl();
  names_.erase(key);
  names_.emplace(key, Name{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                               parameter.getIntrusivePtr()),
                           name});
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
