// SPDX-License-Identifier: BSD-3-Clause
// The OptimizerView of a torch::optim::Optimizer (torch_optimizer_view.h).

#include "amp/torch_optimizer_view.h"

#include <lucid/optim/fused_optimizer.h>

namespace lucid {
namespace amp {
namespace detail {

OptimizerView view_of(const torch::optim::Optimizer& optimizer, std::function<void()> run_step) {
  OptimizerView view;
  view.key = &optimizer;
  const auto& groups = optimizer.param_groups();
  view.param_groups.reserve(groups.size());
  for (const auto& group : groups) {
    view.param_groups.emplace_back(group.params());
  }
  view.step = std::move(run_step);
  return view;
}

OptimizerView view_of(torch::optim::Optimizer& optimizer, std::function<void()> run_step) {
  OptimizerView view = view_of(static_cast<const torch::optim::Optimizer&>(optimizer),
                               std::move(run_step));
  if (auto* aware = dynamic_cast<lucid::optim::ScalerAware*>(&optimizer)) {
    view.set_grad_scaling = [aware](at::Tensor scale, at::Tensor found_inf) {
      aware->set_grad_scaling(std::move(scale), std::move(found_inf));
    };
  }
  return view;
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
