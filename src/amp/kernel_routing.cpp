// SPDX-License-Identifier: BSD-3-Clause
#include "amp/kernel_routing.h"

#include "amp/backend.h"
#include "common/device_kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iterator>

namespace lucid {
namespace amp {
namespace detail {
namespace {

std::atomic<bool> force_generic{false};

// The table a device takes when nothing is forced: its own if it has one, else generic.
const AmpBackend& backend_for_device(c10::DeviceType type) {
  if (force_generic.load()) {
    return generic::amp_backend();
  }
  const AmpBackend* table = device_kernels(type).amp;
  return table != nullptr ? *table : generic::amp_backend();
}

// A device table takes non-overlapping, dense tensors only; views that are not go to the
// generic path, as does every device without a table.
const AmpBackend& backend_for(const at::Tensor& dense) {
  if (force_generic.load()) {
    return generic::amp_backend();
  }
  const AmpBackend* table = device_kernels(dense.device().type()).amp;
  return table != nullptr && dense.is_non_overlapping_and_dense() ? *table : generic::amp_backend();
}

// One multi-tensor launch: the tensors of one device that one backend takes, with their
// keys where the first overflow is recorded.
struct LaunchGroup {
  const AmpBackend* backend;
  at::Device device;
  std::vector<at::Tensor> tensors;
  OverflowSite site;
};

std::vector<LaunchGroup> group_by_backend_and_device(const std::vector<at::Tensor>& grads,
                                                     const OverflowSite& site) {
  std::vector<LaunchGroup> groups;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& grad = grads[i];
    // Sparse gradients are unscaled and checked through their values (an alias).
    at::Tensor dense = grad.is_sparse() ? grad._values() : grad;
    const AmpBackend* backend = &backend_for(dense);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const LaunchGroup& g) {
      return g.backend == backend && g.device == dense.device();
    });
    if (it == groups.end()) {
      groups.push_back({backend, dense.device(), {}, {site.slot, {}}});
      it = std::prev(groups.end());
    }
    it->tensors.push_back(std::move(dense));
    if (site.slot.defined()) {
      it->site.keys.push_back(site.keys[i]);
    }
  }
  return groups;
}

// kWrite false: the read-only check. `scale` may be undefined there (multiply by 1).
template <bool kWrite>
void run_group(const AmpBackend& backend, const std::vector<at::Tensor>& tensors,
               const at::Tensor& scale, at::Tensor& found_inf, const OverflowSite& site) {
  if (kWrite) {
    backend.unscale_and_check_(tensors, scale, found_inf, site);
  } else {
    backend.check_finite_(tensors, scale, found_inf, site);
  }
}

// The common case, every gradient dense on one device for one backend, runs on the
// caller's list with no per-tensor copies on the host: the device pass over a model's
// gradients is short enough that microseconds of host work show (docs/PERFORMANCE.md).
// Returns that backend, or null when the list needs grouping.
const AmpBackend* one_dense_backend(const std::vector<at::Tensor>& grads) {
  const at::Tensor& first = grads.front();
  if (first.is_sparse()) {
    return nullptr;
  }
  const AmpBackend* backend = &backend_for(first);
  for (const auto& grad : grads) {
    if (grad.is_sparse() || grad.device() != first.device() || &backend_for(grad) != backend) {
      return nullptr;
    }
  }
  return backend;
}

template <bool kWrite>
void run_groups(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                at::Tensor& found_inf, const OverflowSite& site) {
  if (grads.empty()) {
    return;
  }
  TORCH_INTERNAL_ASSERT(!site.slot.defined() || site.keys.size() == grads.size(),
                        "one overflow key per gradient");
  TORCH_INTERNAL_ASSERT(!site.slot.defined() ||
                        (site.slot.scalar_type() == at::kLong && site.slot.is_contiguous() &&
                         site.slot.numel() == kOverflowSiteFields));
  if (const AmpBackend* backend = one_dense_backend(grads)) {
    run_group<kWrite>(*backend, grads, scale, found_inf, site);
    return;
  }
  for (const LaunchGroup& group : group_by_backend_and_device(grads, site)) {
    run_group<kWrite>(*group.backend, group.tensors, scale, found_inf, group.site);
  }
}

}  // namespace

void unscale_grads_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                    at::Tensor& found_inf, const OverflowSite& site) {
  run_groups<true>(grads, scale, found_inf, site);
}

void check_grads_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         at::Tensor& found_inf, const OverflowSite& site) {
  run_groups<false>(grads, scale, found_inf, site);
}

namespace {

// The norm's partials of every launch group (one per backend and device), combined on
// `found_inf`'s device: summed for kTwo, the largest for kInf (ATen's max keeps NaN).
at::Tensor combined_partial(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                            at::Tensor& found_inf, const OverflowSite& site, NormKind kind) {
  TORCH_INTERNAL_ASSERT(!site.slot.defined() || site.keys.size() == grads.size(),
                        "one overflow key per gradient");
  std::vector<at::Tensor> partials;
  const auto add = [&](const AmpBackend& backend, const std::vector<at::Tensor>& tensors,
                       const OverflowSite& tensors_site) {
    partials.push_back(backend.check_and_norm_(tensors, scale, found_inf, tensors_site, kind)
                           .to(found_inf.device()));
  };
  if (const AmpBackend* backend = one_dense_backend(grads)) {
    add(*backend, grads, site);
  } else {
    for (const LaunchGroup& group : group_by_backend_and_device(grads, site)) {
      add(*group.backend, group.tensors, group.site);
    }
  }
  if (partials.size() == 1) {
    return partials.front();
  }
  const at::Tensor stacked = at::stack(partials);
  return kind == NormKind::kTwo ? stacked.sum() : stacked.max();
}

// PyTorch's algorithm for other norm types: the p-norm of the per-tensor p-norms of the
// gradients times 1/scale, each in its opmath type.
at::Tensor norm_of_norms(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         const at::Tensor& found_inf, double norm_type) {
  std::vector<at::Tensor> norms;
  for (const auto& grad : grads) {
    const at::Tensor values = grad.is_sparse() ? grad._values() : grad;
    const at::ScalarType opmath = values.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor work = values.to(opmath);
    if (scale.defined()) {
      work = work * scale.to(values.device(), opmath).reciprocal();
    }
    norms.push_back(at::norm(work, norm_type).to(found_inf.device(), at::kFloat));
  }
  return at::norm(at::stack(norms), norm_type);
}

// The partial of a finite p-norm other than 2: the sum over the gradients of
// sum(|g/scale|^p), each in its opmath type, added up in float32 on `found_inf`'s device.
at::Tensor sum_of_powers(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         const at::Tensor& found_inf, double norm_type) {
  std::vector<at::Tensor> sums;
  for (const auto& grad : grads) {
    const at::Tensor values = grad.is_sparse() ? grad._values() : grad;
    const at::ScalarType opmath = values.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    at::Tensor work = values.to(opmath).abs();
    if (scale.defined()) {
      work = work * scale.to(values.device(), opmath).reciprocal();
    }
    sums.push_back(work.pow(norm_type).sum().to(found_inf.device(), at::kFloat));
  }
  return at::stack(sums).sum();
}

// Squares of finite values can overflow float32: a non-finite norm or partial is an
// overflow too.
void raise_if_not_finite(at::Tensor& found_inf, const at::Tensor& value) {
  found_inf.copy_(at::maximum(found_inf, value.isfinite().logical_not().to(at::kFloat)));
}

}  // namespace

at::Tensor check_grads_and_norm_partial_(const std::vector<at::Tensor>& grads,
                                         const at::Tensor& scale, at::Tensor& found_inf,
                                         double norm_type, const OverflowSite& site) {
  if (grads.empty()) {
    return at::zeros({}, found_inf.options());
  }
  at::Tensor partial;
  if (norm_type == 2.0) {
    partial = combined_partial(grads, scale, found_inf, site, NormKind::kTwo);
  } else if (std::isinf(norm_type)) {
    partial = combined_partial(grads, scale, found_inf, site, NormKind::kInf);
  } else {
    run_groups<false>(grads, scale, found_inf, site);
    partial = sum_of_powers(grads, scale, found_inf, norm_type);
  }
  raise_if_not_finite(found_inf, partial);
  return partial;
}

at::Tensor norm_of_partial(const at::Tensor& partial, double norm_type) {
  if (norm_type == 2.0) {
    return partial.sqrt();
  }
  if (std::isinf(norm_type)) {
    return partial;
  }
  return partial.pow(1.0 / norm_type);
}

at::Tensor check_grads_and_norm_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                 at::Tensor& found_inf, double norm_type,
                                 const OverflowSite& site) {
  if (grads.empty()) {
    return at::zeros({}, found_inf.options());
  }
  at::Tensor norm;
  if (norm_type == 2.0) {
    norm = combined_partial(grads, scale, found_inf, site, NormKind::kTwo).sqrt();
  } else if (std::isinf(norm_type)) {
    norm = combined_partial(grads, scale, found_inf, site, NormKind::kInf);
  } else {
    run_groups<false>(grads, scale, found_inf, site);
    norm = norm_of_norms(grads, scale, found_inf, norm_type);
  }
  raise_if_not_finite(found_inf, norm);
  return norm;
}

at::Tensor clip_coefficient(const at::Tensor& norm, double max_norm) {
  return (max_norm / (norm + 1e-6)).clamp_max(1.0);
}

at::Tensor check_grads_and_clip_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                 at::Tensor& found_inf, double norm_type, double max_norm,
                                 at::Tensor* divisor, const OverflowSite& site) {
  const bool fused_norm = norm_type == 2.0 || std::isinf(norm_type);
  const AmpBackend* table = fused_norm && !grads.empty() && !generic_backend_forced()
                                ? device_kernels(scale.device().type()).amp
                                : nullptr;
  const bool one_launch =
      table != nullptr && table->clip_factors_ != nullptr && found_inf.device() == scale.device() &&
      std::all_of(grads.begin(), grads.end(),
                  [&](const at::Tensor& g) { return g.device() == scale.device(); });
  if (!one_launch) {
    at::Tensor norm = check_grads_and_norm_(grads, scale, found_inf, norm_type, site);
    *divisor = scale / clip_coefficient(norm, max_norm);
    return norm;
  }
  const NormKind kind = norm_type == 2.0 ? NormKind::kTwo : NormKind::kInf;
  const at::Tensor partial = combined_partial(grads, scale, found_inf, site, kind);
  at::Tensor out = at::empty({2}, scale.options());
  at::Tensor norm = out[0];
  *divisor = out[1];
  table->clip_factors_(partial, kind, max_norm, scale, found_inf, norm, *divisor);
  return norm;
}

namespace {

// The steps an update counts: an outcome per flag, with the counts they go to.
void check_step_outcomes(const at::Tensor& flags, const UpdateRecord& record) {
  const at::Tensor& outcomes = record.step_outcomes;
  TORCH_INTERNAL_ASSERT(!outcomes.defined() ||
                        (record.counts.defined() && outcomes.scalar_type() == at::kFloat &&
                         outcomes.is_contiguous() && outcomes.numel() == flags.numel() &&
                         outcomes.device() == flags.device()));
}

}  // namespace

void count_steps_(const at::Tensor& flags, const UpdateRecord& record) {
  check_step_outcomes(flags, record);
  if (record.step_outcomes.defined() && record.stepped.any()) {
    generic::count_steps_(flags, record);
  }
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, at::Tensor& overflow_tracker,
                   const at::Tensor& flags, const ScaleRule& rule, const UpdateRecord& record) {
  TORCH_INTERNAL_ASSERT(overflow_tracker.defined() || rule.hysteresis == 1,
                        "a scale update with hysteresis needs the overflow tracker");
  TORCH_INTERNAL_ASSERT(flags.scalar_type() == at::kFloat && flags.is_contiguous() &&
                        flags.numel() >= 1 && flags.device() == scale.device());
  const at::Tensor& counts = record.counts;
  const at::Tensor& log = record.log;
  const at::Tensor& norm = record.grad_norm;
  TORCH_INTERNAL_ASSERT(!counts.defined() ||
                        (counts.scalar_type() == at::kLong && counts.is_contiguous() &&
                         counts.numel() == kUpdateCountFields &&
                         counts.device() == scale.device()));
  TORCH_INTERNAL_ASSERT(!log.defined() ||
                        (log.scalar_type() == at::kDouble && log.is_contiguous() &&
                         log.numel() == (1 + kStepLogRows) * kStepLogFields &&
                         log.device() == scale.device()));
  TORCH_INTERNAL_ASSERT(!norm.defined() || (norm.scalar_type() == at::kFloat && norm.dim() == 0 &&
                                            norm.device() == scale.device()));
  check_step_outcomes(flags, record);
  const at::Tensor& site = record.overflow_site;
  TORCH_INTERNAL_ASSERT(!site.defined() ||
                        (site.scalar_type() == at::kLong && site.is_contiguous() &&
                         site.numel() == kOverflowSiteFields && site.device() == scale.device()));
  backend_for_device(scale.device().type())
      .update_scale_(scale, growth_tracker, overflow_tracker, flags, rule, record);
}

PendingFlagRead start_flag_read_(const at::Tensor& found_inf) {
  const AmpBackend& table = backend_for_device(found_inf.device().type());
  return table.start_flag_read_ != nullptr ? table.start_flag_read_(found_inf) : PendingFlagRead();
}

ForceGenericBackendGuard::ForceGenericBackendGuard() : previous_(force_generic.exchange(true)) {}

ForceGenericBackendGuard::~ForceGenericBackendGuard() { force_generic.store(previous_); }

bool generic_backend_forced() { return force_generic.load(); }

}  // namespace detail
}  // namespace amp
}  // namespace lucid
