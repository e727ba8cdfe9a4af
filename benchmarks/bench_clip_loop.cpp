// SPDX-License-Identifier: BSD-3-Clause
// The clipped training loop (unscale, clip by the total norm, step, update) two ways, in
// one run, beside the optimizer's bare step:
//   fused:  scaler.clip_grad_norm_(optimizer, max_norm), step, update
//   plain:  scaler.unscale_(optimizer), torch::nn::utils::clip_grad_norm_, step, update
// for lucid::optim::FusedAdamW, torch::optim::AdamW and torch::optim::SGD (momentum 0.9).
// Every call clips (torch's clip_grad_norm_ skips its multiply when nothing needs
// clipping, so a loop that stops clipping would time something else): the scale is held
// at 1/4 (update(new_scale)), so the unscaled gradients' norm is 4 each call while
// max_norm is 1; the non-fused loops leave norm 1 in memory, which the next unscale makes
// 4 again, and a scaler-aware optimizer leaves the gradients untouched.
// Each figure is the median wall time of `reps` calls after 3 warm-ups (the device is
// synchronised around each call on CUDA).
//
// Usage: bench_clip_loop [cpu|cuda] [million_params ...]   (default: cpu 16)

#include <lucid/amp.h>
#include <lucid/optim.h>
#include <torch/torch.h>

#include "support/bench_support.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

// A transformer-like mix of parameter sizes, each with a gradient.
std::vector<torch::Tensor> model_like_parameters(int64_t total, const torch::Device& device) {
  std::vector<torch::Tensor> params;
  for (const int64_t n : lucid::bench::model_like_sizes(total)) {
    auto p = torch::randn({n}, device).requires_grad_(true);
    p.mutable_grad() = torch::randn({n}, device) * 1e-3;
    params.push_back(p);
  }
  return params;
}

using lucid::bench::median_ms;

using MakeOptimizer =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

void run(const char* name, const MakeOptimizer& make, std::vector<torch::Tensor>& params,
         const torch::Device& device, int reps) {
  constexpr double kMaxNorm = 1.0;
  constexpr double kScale = 0.25;
  auto optimizer = make(params);
  lucid::amp::GradScaler scaler(
      lucid::amp::GradScalerOptions().init_scale(kScale).growth_interval(1 << 30));
  // One scale() places the scale on the device; the loops reuse it.
  scaler.scale(torch::ones({}, device));
  const double bare = median_ms([&] { optimizer->step(); }, device, reps);
  const double fused = median_ms(
      [&] {
        scaler.clip_grad_norm_(*optimizer, kMaxNorm);
        scaler.step(*optimizer);
        scaler.update(kScale);
      },
      device, reps);
  const double plain = median_ms(
      [&] {
        scaler.unscale_(*optimizer);
        torch::nn::utils::clip_grad_norm_(params, kMaxNorm);
        scaler.step(*optimizer);
        scaler.update(kScale);
      },
      device, reps);
  std::printf("  %-22s bare %9.3f ms | clip_grad_norm_ loop %9.3f ms (%.3fx) | unscale_+torch clip "
              "loop %9.3f ms (%.3fx) | fused/plain %.3f\n",
              name, bare, fused, fused / bare, plain, plain / bare, fused / plain);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string where = argc > 1 ? argv[1] : "cpu";
  const torch::Device device =
      where == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  std::vector<int64_t> millions;
  for (int i = 2; i < argc; ++i) {
    millions.push_back(std::stoll(argv[i]));
  }
  if (millions.empty()) {
    millions = {16};
  }
  std::printf("device %s, threads %d\n", device.str().c_str(), at::get_num_threads());
  for (const int64_t m : millions) {
    std::vector<torch::Tensor> params = model_like_parameters(m * 1000 * 1000, device);
    std::printf("%ldM parameters in %zu tensors\n", static_cast<long>(m), params.size());
    const int reps = device.is_cuda() ? 21 : 11;
    run(
        "lucid FusedAdamW",
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<lucid::optim::FusedAdamW>(p,
                                                            lucid::optim::FusedAdamWOptions(1e-6));
        },
        params, device, reps);
    run(
        "torch::optim::AdamW",
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-6));
        },
        params, device, reps);
    run(
        "torch::optim::SGD",
        [](std::vector<torch::Tensor> p) {
          return std::make_unique<torch::optim::SGD>(p,
                                                     torch::optim::SGDOptions(1e-6).momentum(0.9));
        },
        params, device, reps);
  }
  return 0;
}
