#include "cuda/amp_aten_bridge.h"

namespace lucid {
namespace amp {
namespace cuda {

void unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf) {
  if (grads.empty()) {
    return;
  }
  // PyTorch's rule: the reciprocal in float64, then rounded to float32 for the kernel.
  const at::Tensor inv_scale =
      scale.to(grads.front().device(), at::kDouble).reciprocal().to(at::kFloat);
  std::vector<at::Tensor> float_views;
  std::vector<std::pair<at::Tensor, at::Tensor>> widened;  // (bf16 grad, float32 copy)
  for (const auto& g : grads) {
    if (g.scalar_type() == at::kBFloat16) {
      widened.emplace_back(g, g.to(at::kFloat));
      float_views.push_back(widened.back().second);
    } else {
      float_views.push_back(g);
    }
  }
  at::_amp_foreach_non_finite_check_and_unscale_(float_views, found_inf, inv_scale);
  for (auto& [grad, copy] : widened) {
    grad.copy_(copy);
  }
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                         growth_interval);
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
