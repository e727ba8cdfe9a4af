// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The checks' record of where gradients held inf/NaN (NOTE: [Overflow site] in
// src/amp/scale_rule.h), exercised through the routing on one device: test_unscale_kernels
// runs it on the CPU (its own table and the generic one), test_cuda on the GPU.

#include "amp/kernel_routing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace lucid_test {

// Lists of `count` gradients of mixed dtypes and sizes (empty ones, ones of several
// chunks, the others `min_size` to `min_size` + 299 elements) on `device`, a few of them
// holding infs and NaNs; every check must record in a site on `slot_device` the smallest
// key among those and their NaN and inf entries, and nothing for clean lists.
inline void expect_checks_record_the_first_overflow(const torch::Device& device,
                                                    const torch::Device& slot_device, int count,
                                                    unsigned seed, int64_t min_size = 1) {
  namespace detail = lucid::amp::detail;
  std::mt19937 rng(seed);
  std::vector<at::Tensor> grads;
  lucid::amp::OverflowSite site;
  int64_t position = 0;
  for (int i = 0; i < count; ++i) {
    const at::ScalarType dtype =
        i % 3 == 0 ? at::kFloat : (i % 3 == 1 ? at::kDouble : at::kBFloat16);
    const int64_t n = i % 11 == 5 ? 0 : (i % 17 == 3 ? 70001 : min_size + rng() % 300);
    grads.push_back(torch::ones({n}, torch::TensorOptions().dtype(dtype).device(device)));
    position += 1 + rng() % 3;  // parameters without a gradient leave gaps
    site.keys.push_back(detail::overflow_key(static_cast<int>(seed % 5), position));
  }
  const at::Tensor scale = torch::full({}, 2.0f, torch::TensorOptions().device(device));
  site.slot = torch::empty({detail::kOverflowSiteFields},
                           torch::TensorOptions().dtype(at::kLong).device(slot_device));
  struct Expected {
    int64_t first = detail::kNoOverflowKey;
    int64_t nan = 0;
    int64_t inf = 0;
  };
  auto run_every_check = [&](const std::vector<at::Tensor>& list, const Expected& expected,
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
      site.slot.zero_();
      site.slot[detail::kSiteFirstKey].fill_(detail::kNoOverflowKey);
      at::Tensor flag = torch::zeros({}, scale.options());
      check.second(flag);
      const at::Tensor got = site.slot.cpu();
      const std::string where =
          std::string(check.first) + ", " + what + ", " + std::to_string(count) + " tensors";
      EXPECT_EQ(got[detail::kSiteFirstKey].item<int64_t>(), expected.first) << where;
      EXPECT_EQ(got[detail::kSiteNanCount].item<int64_t>(), expected.nan) << where;
      EXPECT_EQ(got[detail::kSiteInfCount].item<int64_t>(), expected.inf) << where;
      EXPECT_EQ(flag.item<float>(), expected.first == detail::kNoOverflowKey ? 0.0f : 1.0f)
          << where;
    }
  };
  run_every_check(grads, Expected(), "clean");
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<at::Tensor> list = grads;
    std::map<std::pair<size_t, int64_t>, bool> planted;  // (tensor, entry) -> is NaN
    for (int b = 0; b < 2 + 3 * trial; ++b) {
      const size_t i = rng() % list.size();
      if (list[i].numel() == 0) {
        continue;
      }
      if (list[i].is_same(grads[i])) {
        list[i] = list[i].clone();
      }
      const auto entry = static_cast<int64_t>(rng() % list[i].numel());
      const bool nan = rng() % 2 == 0;
      list[i][entry] =
          nan ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
      planted[{i, entry}] = nan;
    }
    Expected expected;
    for (const auto& p : planted) {
      expected.first = std::min(expected.first, site.keys[p.first.first]);
      (p.second ? expected.nan : expected.inf) += 1;
    }
    run_every_check(list, expected, "trial " + std::to_string(trial));
  }
}

}  // namespace lucid_test
