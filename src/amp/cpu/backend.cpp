// SPDX-License-Identifier: BSD-3-Clause
// The CPU table of the backend interface (amp/backend.h): adapts the CPU kernels, which
// take 1/scale as a host double and return the overflow as a bool, to the table's
// tensor signatures.

#include "amp/backend.h"
#include "amp/cpu/amp_kernels.h"

namespace lucid {
namespace amp {
namespace cpu {
namespace {

// 1/scale on the host, or 1 when `scale` is undefined (the check of gradients already
// unscaled). Reading a CPU scale is no synchronisation; a device scale with CPU
// gradients (a model split over devices) has to come to the host once.
double inv_scale_on_host(const at::Tensor& scale) {
  if (!scale.defined()) {
    return 1.0;
  }
  return 1.0 / static_cast<double>((scale.is_cpu() ? scale : scale.to(at::kCPU)).item<float>());
}

// Raises the flag and records what the kernels met in the site's slot (on any device),
// when a gradient was non-finite.
void record(const NonFinite& met, at::Tensor& found_inf, const OverflowSite& site) {
  if (!met.any()) {
    return;
  }
  found_inf.fill_(1.0);
  if (site.slot.defined()) {
    site.slot.select(0, detail::kSiteFirstKey).clamp_max_(met.first);
    site.slot.select(0, detail::kSiteNanCount).add_(met.nan);
    site.slot.select(0, detail::kSiteInfCount).add_(met.inf);
  }
}

// Table entries. Args as in AmpBackend; unchecked on purpose (routing checks).
void table_unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                              at::Tensor& found_inf, const OverflowSite& site) {
  record(unscale_and_check_(grads, inv_scale_on_host(scale), site.keys), found_inf, site);
}

void table_check_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                         at::Tensor& found_inf, const OverflowSite& site) {
  record(check_finite(grads, inv_scale_on_host(scale), site.keys), found_inf, site);
}

at::Tensor table_check_and_norm_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                 at::Tensor& found_inf, const OverflowSite& site, NormKind kind) {
  NonFinite met;
  const float partial =
      check_and_norm(grads, inv_scale_on_host(scale), kind == NormKind::kInf, site.keys, &met);
  record(met, found_inf, site);
  return at::full({}, partial, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace

const AmpBackend& amp_backend() {
  static const AmpBackend table{"cpu",
                                table_unscale_and_check_,
                                table_check_finite_,
                                table_check_and_norm_,
                                update_scale_,
                                /*clip_factors_=*/nullptr,
                                /*start_flag_read_=*/nullptr};
  return table;
}

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
