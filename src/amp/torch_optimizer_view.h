// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the OptimizerView of a torch::optim::Optimizer, the one place the scaler
// meets LibTorch's optimizer class (and lucid::optim's scaler-aware ones).

#include <lucid/amp/optimizer_view.h>

#include <torch/optim/optimizer.h>

#include <functional>

namespace lucid {
namespace amp {
namespace detail {

// The view of `optimizer` (key: its address). `run_step` becomes view.step; leave it
// empty for calls that never step. A lucid::optim::ScalerAware optimizer gets
// set_grad_scaling.
OptimizerView view_of(const torch::optim::Optimizer& optimizer,
                      std::function<void()> run_step = {});
OptimizerView view_of(torch::optim::Optimizer& optimizer, std::function<void()> run_step);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
