// SPDX-License-Identifier: BSD-3-Clause
// The CPU table of the fused optimizer interface (optim/fused_backend.h): the CPU
// kernels read scale and flag on the host, which is free for CPU tensors; a device flag
// with CPU parameters (a model split over devices) has to come over once.

#include "optim/fused_backend.h"
#include "optim/cpu/fused_kernels.h"

namespace lucid {
namespace optim {
namespace cpu {
namespace {

// Unchecked on purpose: `found_inf` and `scale` are float32 0-dim or undefined.
bool skipped_on_host(const at::Tensor& found_inf) {
  return found_inf.defined() && found_inf.to(at::kCPU).item<float>() != 0.0f;
}

double inv_scale_on_host(const at::Tensor& scale) {
  return scale.defined() ? 1.0 / static_cast<double>(scale.to(at::kCPU).item<float>()) : 1.0;
}

// Table entries. Args as in detail::FusedOptimBackend; unchecked on purpose.
void table_adam_(const std::vector<std::vector<at::Tensor>>& lists, const detail::AdamHyper& hyper,
                 const at::Tensor& scale, const at::Tensor& found_inf) {
  if (!skipped_on_host(found_inf)) {
    fused_adam_(lists, hyper, inv_scale_on_host(scale));
  }
}

void table_sgd_(const std::vector<std::vector<at::Tensor>>& lists, const detail::SgdHyper& hyper,
                const at::Tensor& scale, const at::Tensor& found_inf) {
  if (!skipped_on_host(found_inf)) {
    fused_sgd_(lists, hyper, inv_scale_on_host(scale));
  }
}

}  // namespace

const detail::FusedOptimBackend& fused_backend() {
  static const detail::FusedOptimBackend table{"cpu", table_adam_, table_sgd_};
  return table;
}

}  // namespace cpu
}  // namespace optim
}  // namespace lucid
