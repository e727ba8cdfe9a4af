// SPDX-License-Identifier: BSD-3-Clause
// The host time of one C++ optimizer step, where the kernels' own work is negligible: the
// C++ twin of benchmarks/python/bench_host_step.py.
//
// N one-element float32 parameters (144 by default, the tensor count of the 116M model of
// the loop benchmarks; the host-time goal is stated at 288) on one device, the time of one
// call of
//   * lucid::optim::FusedAdamW::step(),
//   * GradScaler::step + update with that optimizer, in the default and graph_safe modes,
//   * torch::optim::AdamW::step() beside them,
//   * and the stages a default-mode step + update is made of, each alone, through the
//     internal entry points the scaler calls: the flag's zero fill, the check over the
//     gradients, the flag's copy to the host with its event and its landed() query, the
//     scale update, the scaler-aware step. What the whole call costs beyond their sum
//     is the scaler's own bookkeeping.
// as the best of 5 runs of `iters` back-to-back calls, in microseconds per call. On a GPU
// the calls are asynchronous and this is the host's time to enqueue them; on the CPU it
// includes the kernels, which for one-element tensors cost little.
//
// Usage: bench_host_step [cpu|cuda] [tensors] [iters]

#include <lucid/amp.h>
#include <lucid/optim.h>
#include <torch/torch.h>

#include "amp/kernel_routing.h"
#include "amp/scale_schedule.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

double per_call_us(const std::function<void()>& fn, int iters, const torch::Device& device) {
  auto wait = [&] {
    if (device.is_cuda()) {
      torch::cuda::synchronize();
    }
  };
  for (int i = 0; i < std::max(iters / 10, 10); ++i) {
    fn();
  }
  double best = std::numeric_limits<double>::infinity();
  for (int run = 0; run < 5; ++run) {
    wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      fn();
    }
    wait();
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        iters;
    best = std::min(best, us);
  }
  return best;
}

std::vector<torch::Tensor> make_params(int n, const torch::Device& device) {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int i = 0; i < n; ++i) {
    torch::Tensor p = torch::randn({1}).to(device).requires_grad_(true);
    p.mutable_grad() = torch::randn({1}).to(device);
    params.push_back(p);
  }
  return params;
}

}  // namespace

int main(int argc, char** argv) {
  const torch::Device device(argc > 1 ? argv[1] : "cpu");
  const int n = argc > 2 ? std::atoi(argv[2]) : 144;
  const int iters = argc > 3 ? std::atoi(argv[3]) : 2000;
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::printf("bench_host_step: no CUDA device\n");
    return 1;
  }
  torch::NoGradGuard no_grad;
  std::printf("LibTorch %d.%d, device %s, %d one-element parameters, best of 5 runs of %d calls\n",
              TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR, device.str().c_str(), n, iters);

  namespace amp = lucid::amp;
  const auto fused_options = lucid::optim::FusedAdamOptions(1e-3).weight_decay(1e-2);
  const torch::Tensor one = torch::ones({}, torch::TensorOptions().device(device));
  lucid::optim::FusedAdamW fused(make_params(n, device), fused_options);
  lucid::optim::FusedAdamW scaled(make_params(n, device), fused_options);
  lucid::optim::FusedAdamW scaled_graph_safe(make_params(n, device), fused_options);
  lucid::optim::FusedAdamW aware(make_params(n, device), fused_options);
  for (auto* o : {&fused, &scaled, &scaled_graph_safe, &aware}) {
    o->step();
  }
  amp::GradScaler scaler(amp::GradScalerOptions().init_scale(1.0));
  amp::GradScaler graph_safe(amp::GradScalerOptions().init_scale(1.0).graph_safe(true));
  scaler.scale(one);  // makes the scale
  graph_safe.scale(one);
  torch::optim::AdamW reference(make_params(n, device),
                                torch::optim::AdamWOptions(1e-3).weight_decay(1e-2));
  reference.step();

  // The stages' operands, as the scaler holds them.
  std::vector<at::Tensor> grads;
  for (const auto& p : aware.param_groups().front().params()) {
    grads.push_back(p.grad());
  }
  const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  at::Tensor scale = at::ones({}, f32);
  at::Tensor growth_tracker = at::zeros({}, f32.dtype(at::kInt));
  at::Tensor overflow_tracker;
  const at::Tensor flag = at::zeros({}, f32);
  const amp::detail::ScaleRule rule = amp::detail::rule_of(amp::GradScalerOptions());

  struct Row {
    const char* name;
    std::function<void()> fn;
  };
  const std::vector<Row> rows = {
      {"lucid::optim::FusedAdamW: step()", [&] { fused.step(); }},
      {"GradScaler step + update, FusedAdamW",
       [&] {
         scaler.step(scaled);
         scaler.update();
       }},
      {"the same, graph_safe",
       [&] {
         graph_safe.step(scaled_graph_safe);
         graph_safe.update();
       }},
      {"torch::optim::AdamW: step()", [&] { reference.step(); }},
      {"stage: the check over the gradients",
       [&] {
         at::Tensor f = flag;
         amp::detail::check_grads_finite_(grads, scale, f);
       }},
      {"stage: the flag's copy to the host + event", [&] { amp::detail::start_flag_read_(flag); }},
      {"stage: that copy's landed() query",
       [&, read = amp::detail::start_flag_read_(flag)] { (void)read.landed(); }},
      {"stage: the scale update",
       [&] { amp::detail::update_scale_(scale, growth_tracker, overflow_tracker, flag, rule); }},
      {"stage: the scaler-aware FusedAdamW step",
       [&] {
         aware.set_grad_scaling(scale, flag);
         aware.step();
       }},
  };
  for (const Row& row : rows) {
    std::printf("  %-48s %9.2f us per call\n", row.name, per_call_us(row.fn, iters, device));
  }
  return 0;
}
