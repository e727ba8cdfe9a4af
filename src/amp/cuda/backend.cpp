// SPDX-License-Identifier: BSD-3-Clause
// The CUDA table of the backend interface (amp/backend.h): turns gradient lists into
// tensor tables and launches lucid-amp's own kernels (unscale_kernels.h,
// update_scale_kernel.h) on the current stream. Compiled only against a CUDA LibTorch.

#include "amp/backend.h"
#include "amp/cuda/clip_factors_kernel.h"
#include "amp/cuda/unscale_kernels.h"
#include "amp/cuda/update_scale_kernel.h"
#include "cuda_common/stream_capture.h"
#include "cuda_common/table_cache.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <memory>

namespace lucid {
namespace amp {
namespace cuda {
namespace {

using cuda_common::make_table;

// Calls launch(table, type) once per element type present: one table of all of `grads`
// when they share one (the common case, built without copying the list), else one per
// type. With keys (OverflowSite::keys, one per gradient) each table carries its
// gradients' keys (kKeyList). Unchecked on purpose: `grads` is non-empty
// (unscale_or_check_).
template <typename Launch>
void for_each_dtype(const std::vector<at::Tensor>& grads, const std::vector<int64_t>& keys,
                    Launch launch) {
  const at::ScalarType first = grads.front().scalar_type();
  const bool one_type = std::all_of(grads.begin(), grads.end(),
                                    [&](const at::Tensor& g) { return g.scalar_type() == first; });
  if (one_type) {
    launch(make_table({&grads}, keys), cuda_common::element_type(first));
    return;
  }
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    std::vector<at::Tensor> same;
    std::vector<int64_t> same_keys;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (grads[i].scalar_type() == dtype) {
        same.push_back(grads[i]);
        if (!keys.empty()) {
          same_keys.push_back(keys[i]);
        }
      }
    }
    if (!same.empty()) {
      launch(make_table({&same}, same_keys), cuda_common::element_type(dtype));
    }
  }
}

// Runs launch(scale_ptr, flag_ptr, site_ptr, stream) on `device` and its current stream,
// with the scale, an overflow flag and the overflow site's slot (null: none) on that
// device. A flag or slot on another device (a model split over devices) is recorded into
// afterwards through one on `device`.
template <typename Launch>
void launch_on_device(const at::Device& device, const at::Tensor& scale, at::Tensor& found_inf,
                      const OverflowSite& site, Launch launch) {
  const bool local_flag = found_inf.device() != device;
  at::Tensor flag = local_flag ? at::zeros({}, found_inf.options().device(device)) : found_inf;
  const bool local_slot = site.slot.defined() && site.slot.device() != device;
  at::Tensor slot = site.slot;
  if (local_slot) {
    slot = at::empty_like(site.slot, site.slot.options().device(device));
    reset_overflow_site_slot(slot);
  }
  {
    c10::cuda::CUDAGuard guard(device);
    at::Tensor scale_here;
    const float* scale_ptr = cuda_common::float_on(scale, device, scale_here);
    launch(scale_ptr, flag.data_ptr<float>(), slot.defined() ? slot.data_ptr<int64_t>() : nullptr,
           at::cuda::getCurrentCUDAStream());
  }
  if (local_flag) {
    found_inf.copy_(at::maximum(found_inf, flag.to(found_inf.device())));
  }
  if (local_slot) {
    const at::Tensor met = slot.to(site.slot.device());
    at::Tensor first = site.slot.select(0, detail::kSiteFirstKey);
    first.copy_(at::minimum(first, met.select(0, detail::kSiteFirstKey)));
    site.slot.narrow(0, detail::kSiteNanCount, 2).add_(met.narrow(0, detail::kSiteNanCount, 2));
  }
}

// The unscale pass (kWrite) or the read-only check over one device's gradients.
// Args: as AmpBackend::unscale_and_check_; the gradients are dense CUDA tensors of one
// device.
template <bool kWrite>
void unscale_or_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                       at::Tensor& found_inf, const OverflowSite& site) {
  if (grads.empty()) {
    return;
  }
  launch_on_device(
      grads.front().device(), scale, found_inf, site,
      [&](const float* scale_ptr, float* flag_ptr, int64_t* site_ptr, cudaStream_t stream) {
        for_each_dtype(grads, site.keys, [&](const TensorTable& table, ElementType type) {
          C10_CUDA_CHECK(
              kWrite ? launch_unscale_and_check(table, type, scale_ptr, flag_ptr, site_ptr, stream)
                     : launch_check_finite(table, type, scale_ptr, flag_ptr, site_ptr, stream));
        });
      });
}

// Table entries. Args as in AmpBackend; unchecked on purpose (routing checks).
void table_unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                              at::Tensor& found_inf, const OverflowSite& site) {
  unscale_or_check_<true>(grads, scale, found_inf, site);
}

void table_check_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         at::Tensor& found_inf, const OverflowSite& site) {
  unscale_or_check_<false>(grads, scale, found_inf, site);
}

// The check with the norm's partials: one launch per element type, each writing one
// partial per block, then the partials combined by ATen's reduction (deterministic for a
// given length) on the gradients' device. A flag or slot on another device is raised or
// lowered through one on the gradients' device (launch_on_device).
at::Tensor table_check_and_norm_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                 at::Tensor& found_inf, const OverflowSite& site, NormKind kind) {
  std::vector<at::Tensor> partials;
  const at::TensorOptions partial_options =
      at::TensorOptions().dtype(at::kFloat).device(grads.front().device());
  launch_on_device(
      grads.front().device(), scale, found_inf, site,
      [&](const float* scale_ptr, float* flag_ptr, int64_t* site_ptr, cudaStream_t stream) {
        for_each_dtype(grads, site.keys, [&](const TensorTable& table, ElementType type) {
          at::Tensor out = at::empty({norm_partials(table)}, partial_options);
          C10_CUDA_CHECK(launch_check_and_norm(table, type, scale_ptr, flag_ptr, site_ptr,
                                               out.data_ptr<float>(), kind == NormKind::kInf,
                                               stream));
          partials.push_back(std::move(out));
        });
      });
  const at::Tensor all = partials.size() == 1 ? partials.front() : at::cat(partials);
  return kind == NormKind::kTwo ? all.sum() : all.max();
}

// The clip's arithmetic in one launch (clip_factors_kernel.h): every tensor on the
// partial's device.
void table_clip_factors_(const at::Tensor& partial, NormKind kind, double max_norm,
                         const at::Tensor& scale, at::Tensor& found_inf, at::Tensor& norm,
                         at::Tensor& divisor) {
  c10::cuda::CUDAGuard guard(partial.device());
  C10_CUDA_CHECK(launch_clip_factors(partial.data_ptr<float>(), kind == NormKind::kTwo,
                                     static_cast<float>(max_norm), scale.data_ptr<float>(),
                                     found_inf.data_ptr<float>(), norm.data_ptr<float>(),
                                     divisor.data_ptr<float>(), at::cuda::getCurrentCUDAStream()));
}

// The scale update (update_scale_kernel.h): every tensor on the scale's device.
void table_update_scale_(at::Tensor& scale, at::Tensor& growth_tracker,
                         at::Tensor& overflow_tracker, const at::Tensor& flags,
                         const detail::ScaleRule& rule, const UpdateRecord& record) {
  c10::cuda::CUDAGuard guard(scale.device());
  C10_CUDA_CHECK(launch_update_scale(
      scale.data_ptr<float>(), growth_tracker.data_ptr<int32_t>(),
      overflow_tracker.defined() ? overflow_tracker.data_ptr<int32_t>() : nullptr,
      flags.data_ptr<float>(), flags.numel(), rule,
      record.counts.defined() ? record.counts.data_ptr<int64_t>() : nullptr,
      record.step_outcomes.defined() ? record.step_outcomes.data_ptr<float>() : nullptr,
      record.stepped, record.log.defined() ? record.log.data_ptr<double>() : nullptr,
      record.grad_norm.defined() ? record.grad_norm.data_ptr<float>() : nullptr,
      record.overflow_site.defined() ? record.overflow_site.data_ptr<int64_t>() : nullptr,
      at::cuda::getCurrentCUDAStream()));
}

// The flag's copy into pinned memory on the flag's current stream, and an event behind
// it: waiting on the event waits for that stream up to this point only, and querying it
// does not wait. The pinned block comes from PyTorch's caching host allocator, which
// keeps it until the copy has landed. Not while the stream is captured into a CUDA graph:
// the copy would land only when the graph is replayed, so the flag is then read as
// before, where it lies.
PendingFlagRead table_start_flag_read_(const at::Tensor& found_inf) {
  if (cuda_common::current_stream_capturing(found_inf.device())) {
    return PendingFlagRead();
  }
  c10::cuda::CUDAGuard guard(found_inf.device());
  PendingFlagRead read;
  read.host =
      at::empty(found_inf.sizes(), found_inf.options().device(at::kCPU).pinned_memory(true));
  read.host.copy_(found_inf, /*non_blocking=*/true);
  auto landed = std::make_shared<at::cuda::CUDAEvent>();
  landed->record(at::cuda::getCurrentCUDAStream());
  read.wait = [landed] { landed->synchronize(); };
  read.ready = [landed] { return landed->query(); };
  return read;
}

}  // namespace

const AmpBackend& amp_backend() {
  static const AmpBackend table{"cuda",
                                table_unscale_and_check_,
                                table_check_finite_,
                                table_check_and_norm_,
                                table_update_scale_,
                                table_clip_factors_,
                                table_start_flag_read_};
  return table;
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
