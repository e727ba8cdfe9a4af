#include "amp/kernel_routing.h"

#include "cpu/amp_kernels.h"
#include "generic/amp_ops.h"
#ifdef LUCID_AMP_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

#include <atomic>
#include <optional>

namespace lucid {
namespace amp {
namespace detail {
namespace {

std::atomic<bool> force_generic{false};

enum class Backend { kCpu, kCuda, kGeneric };

// One multi-tensor launch: the tensors of one device that one backend takes.
struct LaunchGroup {
  Backend backend;
  at::Device device;
  std::vector<at::Tensor> tensors;
};

Backend backend_for(const at::Tensor& dense) {
  if (force_generic.load()) {
    return Backend::kGeneric;
  }
  if (dense.is_cpu() && dense.is_non_overlapping_and_dense()) {
    return Backend::kCpu;
  }
#ifdef LUCID_AMP_WITH_CUDA
  if (dense.is_cuda() && dense.is_non_overlapping_and_dense()) {
    return Backend::kCuda;
  }
#endif
  return Backend::kGeneric;
}

std::vector<LaunchGroup> group_by_backend_and_device(const std::vector<at::Tensor>& grads) {
  std::vector<LaunchGroup> groups;
  for (const auto& grad : grads) {
    // Sparse gradients are unscaled and checked through their values (an alias).
    at::Tensor dense = grad.is_sparse() ? grad._values() : grad;
    const Backend backend = backend_for(dense);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const LaunchGroup& g) {
      return g.backend == backend && g.device == dense.device();
    });
    if (it == groups.end()) {
      groups.push_back({backend, dense.device(), {}});
      it = std::prev(groups.end());
    }
    it->tensors.push_back(std::move(dense));
  }
  return groups;
}

// kWrite false: the read-only check. `scale` may be undefined there (multiply by 1).
template <bool kWrite>
void run_cpu_group(const std::vector<at::Tensor>& tensors, const at::Tensor& scale,
                   at::Tensor& found_inf) {
  // Reading a CPU scale is no synchronisation; a device scale with CPU gradients (a
  // model split over devices) has to come to the host once.
  const double inv =
      scale.defined() ? 1.0 / static_cast<double>((scale.is_cpu() ? scale : scale.to(at::kCPU)).item<float>())
                      : 1.0;
  const bool found = kWrite ? cpu::unscale_and_check_(tensors, inv) : cpu::check_finite(tensors, inv);
  if (found) {
    found_inf.fill_(1.0);
  }
}

#ifdef LUCID_AMP_WITH_CUDA
// Raises `found_inf` (on its own device) by a flag that lives on another device.
void merge_found_inf(at::Tensor& found_inf, const at::Tensor& local) {
  found_inf.copy_(at::maximum(found_inf, local.to(found_inf.device())));
}

template <bool kWrite>
void run_cuda_group(const at::Device& device, const std::vector<at::Tensor>& tensors,
                    const at::Tensor& scale, at::Tensor& found_inf) {
  const bool local_flag = found_inf.device() != device;
  at::Tensor flag = local_flag ? at::zeros({}, found_inf.options().device(device)) : found_inf;
  if (kWrite) {
    cuda::unscale_and_check_(tensors, scale, flag);
  } else {
    cuda::check_finite_(tensors, scale, flag);
  }
  if (local_flag) {
    merge_found_inf(found_inf, flag);
  }
}
#endif

template <bool kWrite>
void run_group(Backend backend, const at::Device& device, const std::vector<at::Tensor>& tensors,
               const at::Tensor& scale, at::Tensor& found_inf) {
  (void)device;  // only the CUDA backend needs it
  switch (backend) {
    case Backend::kCpu:
      run_cpu_group<kWrite>(tensors, scale, found_inf);
      break;
    case Backend::kCuda:
#ifdef LUCID_AMP_WITH_CUDA
      run_cuda_group<kWrite>(device, tensors, scale, found_inf);
#endif
      break;
    case Backend::kGeneric:
      if (kWrite) {
        generic::unscale_and_check_(tensors, scale, found_inf);
      } else {
        generic::check_finite_(tensors, scale, found_inf);
      }
      break;
  }
}

// The common case, every gradient dense on one device for one backend, runs on the
// caller's list with no per-tensor copies on the host: at 116M parameters the CUDA pass
// takes 0.23 ms on an H200, so microseconds of host work show (docs/PERFORMANCE.md).
// Returns that backend, or nothing when the list needs grouping.
std::optional<Backend> one_dense_backend(const std::vector<at::Tensor>& grads) {
  const at::Tensor& first = grads.front();
  if (first.is_sparse()) {
    return std::nullopt;
  }
  const Backend backend = backend_for(first);
  for (const auto& grad : grads) {
    if (grad.is_sparse() || grad.device() != first.device() || backend_for(grad) != backend) {
      return std::nullopt;
    }
  }
  return backend;
}

template <bool kWrite>
void run_groups(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                at::Tensor& found_inf) {
  if (grads.empty()) {
    return;
  }
  if (const std::optional<Backend> backend = one_dense_backend(grads)) {
    run_group<kWrite>(*backend, grads.front().device(), grads, scale, found_inf);
    return;
  }
  for (const LaunchGroup& group : group_by_backend_and_device(grads)) {
    run_group<kWrite>(group.backend, group.device, group.tensors, scale, found_inf);
  }
}

}  // namespace

void unscale_grads_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                    at::Tensor& found_inf) {
  run_groups<true>(grads, scale, found_inf);
}

void check_grads_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         at::Tensor& found_inf) {
  run_groups<false>(grads, scale, found_inf);
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (!force_generic.load() && scale.is_cpu()) {
    cpu::update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                       growth_interval);
#ifdef LUCID_AMP_WITH_CUDA
  } else if (!force_generic.load() && scale.is_cuda()) {
    cuda::update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                        growth_interval);
#endif
  } else {
    generic::update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                           growth_interval);
  }
}

void update_scale_guarded_(at::Tensor& scale, at::Tensor& growth_tracker,
                           at::Tensor& overflow_tracker, const at::Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval,
                           int64_t hysteresis, double max_scale) {
  if (!force_generic.load() && scale.is_cpu()) {
    cpu::ScaleGuards guards;
    guards.hysteresis = hysteresis;
    guards.max_scale = static_cast<float>(max_scale);
    cpu::update_scale_guarded_(scale, growth_tracker, overflow_tracker, found_inf,
                               growth_factor, backoff_factor, growth_interval, guards);
  } else {
    generic::update_scale_guarded_(scale, growth_tracker, overflow_tracker, found_inf,
                                   growth_factor, backoff_factor, growth_interval, hysteresis,
                                   max_scale);
  }
}

ForceGenericBackendGuard::ForceGenericBackendGuard() : previous_(force_generic.exchange(true)) {}

ForceGenericBackendGuard::~ForceGenericBackendGuard() { force_generic.store(previous_); }

bool generic_backend_forced() { return force_generic.load(); }

}  // namespace detail
}  // namespace amp
}  // namespace lucid
