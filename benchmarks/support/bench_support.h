// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// What the CPU/CUDA benchmarks share: a transformer-like list of tensor sizes and a
// median wall-time timer that synchronises the device around each call.

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace lucid {
namespace bench {

// Element counts of a transformer-like mix of tensors (d=768: attention and MLP weights
// with their biases and norms), repeated until `total` elements; the last one is cut to
// fit.
inline std::vector<int64_t> model_like_sizes(int64_t total) {
  const std::vector<int64_t> shapes = {768 * 768 * 3, 768 * 3,    768 * 768, 768,        768,
                                       768,           768 * 3072, 3072,      3072 * 768, 768};
  std::vector<int64_t> sizes;
  int64_t placed = 0;
  for (size_t i = 0; placed < total; ++i) {
    sizes.push_back(std::min(shapes[i % shapes.size()], total - placed));
    placed += sizes.back();
  }
  return sizes;
}

// The median wall time of `reps` calls of `fn` in milliseconds, after 3 warm-ups; the
// device is synchronised after each call on CUDA, so a call's time includes its kernels.
inline double median_ms(const std::function<void()>& fn, const torch::Device& device, int reps) {
  auto sync = [&] {
    if (device.is_cuda()) {
      torch::cuda::synchronize();
    }
  };
  for (int i = 0; i < 3; ++i) {
    fn();
  }
  sync();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    sync();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace bench
}  // namespace lucid
