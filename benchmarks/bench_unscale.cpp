// SPDX-License-Identifier: BSD-3-Clause
// Unscale-and-check bandwidth against a plain copy_ of the same bytes, in one run.
//
// Both move 8 bytes per float32 gradient element (read 4, write 4): the copy reads a
// source and writes a destination of the same total size in one flat copy_; the
// unscale reads and writes the gradients in place. The ratio unscale/copy is the goal
// (>= 0.90 on the CPU). The scale alternates between 2 and 1/2 so values stay
// bounded and never reach subnormals (which would slow the multiply, not the memory).
//
// Usage: bench_unscale [cpu|cuda] [million_params ...]   (default: cpu 16 116)

#include <lucid/amp.h>
#include <torch/torch.h>

#include "amp/kernel_routing.h"
#include "support/bench_support.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

// A transformer-like mix of tensor sizes.
std::vector<torch::Tensor> model_like_gradients(int64_t total, const torch::Device& device) {
  std::vector<torch::Tensor> grads;
  for (const int64_t n : lucid::bench::model_like_sizes(total)) {
    grads.push_back(torch::randn({n}, device));
  }
  return grads;
}

double median_seconds(const std::function<void()>& fn, const torch::Device& device, int reps) {
  return lucid::bench::median_ms(fn, device, reps) / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string where = argc > 1 ? argv[1] : "cpu";
  const torch::Device device = where == "cuda" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  std::vector<int64_t> millions;
  for (int i = 2; i < argc; ++i) {
    millions.push_back(std::stoll(argv[i]));
  }
  if (millions.empty()) {
    millions = {16, 116};
  }
  std::printf("device %s, threads %d\n", device.str().c_str(), at::get_num_threads());
  std::printf("%10s %8s %12s %14s %8s %16s %8s\n", "params", "tensors", "copy GB/s",
              "unscale GB/s", "ratio", "generic GB/s", "ratio");
  for (const int64_t m : millions) {
    const int64_t total = m * 1000 * 1000;
    std::vector<torch::Tensor> grads = model_like_gradients(total, device);
    torch::Tensor src = torch::randn({total}, device), dst = torch::empty({total}, device);
    const torch::Tensor scales[2] = {torch::full({}, 2.0f, device), torch::full({}, 0.5f, device)};
    torch::Tensor found_inf = torch::zeros({}, device);
    int flip = 0;
    auto unscale = [&] {
      lucid::amp::detail::unscale_grads_(grads, scales[flip ^= 1], found_inf);
    };
    const double bytes = 8.0 * static_cast<double>(total);
    const int reps = m > 100 ? 9 : 21;
    const double t_copy = median_seconds([&] { dst.copy_(src); }, device, reps);
    const double t_unscale = median_seconds(unscale, device, reps);
    double t_generic = 0;
    {
      lucid::amp::detail::ForceGenericBackendGuard generic;
      t_generic = median_seconds(unscale, device, reps);
    }
    std::printf("%9ldM %8zu %12.2f %14.2f %8.3f %16.2f %8.3f\n", static_cast<long>(m),
                grads.size(), bytes / t_copy / 1e9, bytes / t_unscale / 1e9, t_copy / t_unscale,
                bytes / t_generic / 1e9, t_copy / t_generic);
    if (found_inf.item<float>() != 0.0f) {
      std::printf("unexpected overflow flag\n");
      return 1;
    }
  }
  return 0;
}
