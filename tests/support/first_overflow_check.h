// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The checks' record of the first non-finite gradient (NOTE: [First overflow] in
// src/amp/scale_rule.h), exercised through the routing on one device: test_unscale_kernels
// runs it on the CPU (its own table and the generic one), test_cuda on the GPU.

#include "amp/kernel_routing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

namespace lucid_test {

// Lists of `count` gradients of mixed dtypes and sizes (empty ones, ones of several
// chunks) on `device`, a few of them holding an inf or a NaN; every check must lower a
// slot on `slot_device` to the smallest key among those, and leave it be on clean lists.
inline void expect_checks_record_the_first_overflow(const torch::Device& device,
                                                    const torch::Device& slot_device, int count,
                                                    unsigned seed) {
  namespace detail = lucid::amp::detail;
  std::mt19937 rng(seed);
  std::vector<at::Tensor> grads;
  lucid::amp::OverflowSite site;
  int64_t position = 0;
  for (int i = 0; i < count; ++i) {
    const at::ScalarType dtype =
        i % 3 == 0 ? at::kFloat : (i % 3 == 1 ? at::kDouble : at::kBFloat16);
    const int64_t n = i % 11 == 5 ? 0 : (i % 17 == 3 ? 70001 : 1 + rng() % 300);
    grads.push_back(torch::ones({n}, torch::TensorOptions().dtype(dtype).device(device)));
    position += 1 + rng() % 3;  // parameters without a gradient leave gaps
    site.keys.push_back(detail::overflow_key(static_cast<int>(seed % 5), position));
  }
  const at::Tensor scale = torch::full({}, 2.0f, torch::TensorOptions().device(device));
  const at::TensorOptions long_options =
      torch::TensorOptions().dtype(at::kLong).device(slot_device);
  site.slot = torch::full({}, detail::kNoOverflowKey, long_options);
  auto run_every_check = [&](const std::vector<at::Tensor>& list, int64_t expected,
                             const std::string& what) {
    using Check = std::function<void(at::Tensor&)>;
    const std::vector<std::pair<const char*, Check>> checks = {
        {"check", [&](at::Tensor& flag) { detail::check_grads_finite_(list, scale, flag, site); }},
        {"unscale",
         [&](at::Tensor& flag) {
           std::vector<at::Tensor> copies;
           for (const auto& g : list) copies.push_back(g.clone());
           detail::unscale_grads_(copies, scale, flag, site);
         }},
        {"norm 2",
         [&](at::Tensor& flag) { detail::check_grads_and_norm_(list, scale, flag, 2.0, site); }},
        {"norm inf",
         [&](at::Tensor& flag) {
           detail::check_grads_and_norm_(list, scale, flag, std::numeric_limits<double>::infinity(),
                                         site);
         }},
    };
    for (const auto& check : checks) {
      site.slot.fill_(detail::kNoOverflowKey);
      at::Tensor flag = torch::zeros({}, scale.options());
      check.second(flag);
      EXPECT_EQ(site.slot.item<int64_t>(), expected)
          << check.first << ", " << what << ", " << count << " tensors on " << device;
      EXPECT_EQ(flag.item<float>(), expected == detail::kNoOverflowKey ? 0.0f : 1.0f)
          << check.first << ", " << what;
    }
  };
  run_every_check(grads, detail::kNoOverflowKey, "clean");
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<at::Tensor> list = grads;
    int64_t expected = detail::kNoOverflowKey;
    for (int b = 0; b < 1 + trial; ++b) {
      const size_t i = rng() % list.size();
      if (list[i].numel() == 0) {
        continue;
      }
      list[i] = list[i].clone();
      list[i][static_cast<int64_t>(rng() % list[i].numel())] =
          rng() % 2 ? std::numeric_limits<float>::infinity()
                    : std::numeric_limits<float>::quiet_NaN();
      expected = std::min(expected, site.keys[i]);
    }
    run_every_check(list, expected, "trial " + std::to_string(trial));
  }
}

}  // namespace lucid_test
