// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [Scaler-aware optimizers]
// PyTorch's scaler unscales every gradient in a pass of its own (read and write 8 bytes
// per float32 element), then the optimizer reads them again. A fused optimizer can
// instead multiply each gradient by 1/scale as it reads it, so GradScaler only runs a
// read-only finiteness check (4 bytes per element) and hands the optimizer the scale and
// the overflow flag, both device tensors. The kernel returns at once when the flag is
// set, step counters included, so a skipped step costs no host read: the flag is read
// back only to tell the caller (and not at all in GradScaler's graph_safe mode).

#include <lucid/optim/fused_optimizer.h>

#include "optim/fused_launch.h"

namespace lucid {
namespace optim {

FusedOptimizer::~FusedOptimizer() = default;
FusedOptimizer::FusedOptimizer(FusedOptimizer&& other) noexcept = default;
FusedOptimizer& FusedOptimizer::operator=(FusedOptimizer&& other) noexcept = default;

void FusedOptimizer::set_grad_scaling(torch::Tensor scale, torch::Tensor found_inf) {
  pending_ = {std::move(scale), std::move(found_inf)};
}

detail::KeptGroups& FusedOptimizer::kept_groups() {
  if (!kept_) {
    kept_ = std::make_unique<detail::KeptGroups>();
  }
  return *kept_;
}

FusedOptimizer::Scaling FusedOptimizer::take_scaling() {
  Scaling scaling = std::move(pending_);
  pending_ = {};
  return scaling;
}

}  // namespace optim
}  // namespace lucid
