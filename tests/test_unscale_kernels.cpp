// SPDX-License-Identifier: BSD-3-Clause
// The unscale-and-check backends and the scale update, against float64 references:
// dtype x size x backend, with readable parameterised names.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "amp/backend.h"
#include "amp/cpu/amp_kernels.h"
#include "amp/kernel_routing.h"
#include "support/first_overflow_check.h"

#include <cfloat>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>

namespace {

using lucid::amp::detail::ForceGenericBackendGuard;

enum class Backend { kRouted, kGeneric };

struct Case {
  at::ScalarType dtype;
  int64_t numel;
  Backend backend;
};

// GoogleTest would otherwise print a Case as raw bytes, padding included (valgrind
// reports that as a use of uninitialised memory).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c10::toString(c.dtype) << " x " << c.numel
      << (c.backend == Backend::kRouted ? " routed" : " generic");
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(c10::toString(info.param.dtype)) + "_n" + std::to_string(info.param.numel) +
         (info.param.backend == Backend::kRouted ? "_Routed" : "_Generic");
}

// Unscales `grads` through the routing layer, with the generic path forced if asked.
at::Tensor run_unscale(std::vector<at::Tensor>& grads, const at::Tensor& scale, Backend backend) {
  at::Tensor found_inf = at::zeros({}, at::kFloat);
  if (backend == Backend::kGeneric) {
    ForceGenericBackendGuard guard;
    lucid::amp::detail::unscale_grads_(grads, scale, found_inf);
  } else {
    lucid::amp::detail::unscale_grads_(grads, scale, found_inf);
  }
  return found_inf;
}

// What the spec says one gradient must become: divided in its opmath type (float64 for
// float64, float32 otherwise) by the reciprocal PyTorch uses, rounded back once.
at::Tensor expected_unscaled(const at::Tensor& grad, float scale) {
  const double inv = 1.0 / static_cast<double>(scale);
  if (grad.scalar_type() == at::kDouble) {
    return grad * inv;
  }
  return (grad.to(at::kFloat) * at::full({}, static_cast<float>(inv), at::kFloat))
      .to(grad.scalar_type());
}

class UnscaleKernel : public testing::TestWithParam<Case> {};

TEST_P(UnscaleKernel, MatchesReferenceAndFindsNoOverflowInFiniteData) {
  const Case c = GetParam();
  const float scale_value = 3.0f;  // not a power of two: rounding differences would show
  auto grad = (at::randn({c.numel}, at::kDouble) * 1000).to(c.dtype);
  const at::Tensor expected = expected_unscaled(grad, scale_value);
  std::vector<at::Tensor> grads{grad};
  const at::Tensor found = run_unscale(grads, at::full({}, scale_value, at::kFloat), c.backend);
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_EQ(grad.scalar_type(), c.dtype);
  EXPECT_TRUE(at::equal(grad, expected)) << "max abs diff "
                                         << (grad.to(at::kDouble) - expected.to(at::kDouble))
                                                .abs()
                                                .max()
                                                .item<double>();
}

TEST_P(UnscaleKernel, FindsEachKindOfNonFiniteAtTheLastElementAndStillDividesAll) {
  const Case c = GetParam();
  for (const double bad : {std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()}) {
    auto grad = at::full({c.numel}, 8.0, at::TensorOptions().dtype(c.dtype));
    grad[c.numel - 1] = bad;  // the last element: a chunk's and a vector loop's tail
    std::vector<at::Tensor> grads{grad};
    const at::Tensor found = run_unscale(grads, at::full({}, 4.0f, at::kFloat), c.backend);
    EXPECT_EQ(found.item<float>(), 1.0f) << "value " << bad;
    EXPECT_TRUE(at::all(grad.slice(0, 0, c.numel - 1) == 2.0).item<bool>());
    const double last = grad[c.numel - 1].item<double>();
    EXPECT_TRUE(std::isnan(bad) ? std::isnan(last) : last == bad);
  }
}

TEST_P(UnscaleKernel, FlagsValuesThatOverflowOnlyAfterUnscaling) {
  const Case c = GetParam();
  // A scale < 1 multiplies: the largest power of two of the dtype, times 4, overflows.
  const int max_exponent = c.dtype == at::kDouble ? 1023 : 127;
  auto grad = at::full({c.numel}, 1.0, at::TensorOptions().dtype(c.dtype));
  grad[c.numel / 2] = std::ldexp(1.0, max_exponent);
  std::vector<at::Tensor> grads{grad};
  const at::Tensor found = run_unscale(grads, at::full({}, 0.25f, at::kFloat), c.backend);
  EXPECT_EQ(found.item<float>(), 1.0f);
  EXPECT_TRUE(std::isinf(grad[c.numel / 2].item<double>()));
}

// dtype x size x backend; sizes around the CPU kernel's 64 Ki-element chunks and the
// vector loop's tails.
std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    for (const int64_t numel : {1, 7, 65536, 65537, 200003}) {
      for (const Backend backend : {Backend::kRouted, Backend::kGeneric}) {
        cases.push_back({dtype, numel, backend});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(DtypeSizeBackend, UnscaleKernel, testing::ValuesIn(all_cases()),
                         case_name);

TEST(UnscaleRouting, ManyTensorsOfMixedDtypesAndLayoutsInOnePass) {
  std::vector<at::Tensor> grads;
  std::vector<at::Tensor> expected;
  for (int i = 0; i < 50; ++i) {
    const at::ScalarType dtype = (i % 3 == 0) ? at::kFloat : (i % 3 == 1) ? at::kDouble : at::kBFloat16;
    grads.push_back(at::randn({i * 37 + 1}, at::kDouble).to(dtype));
  }
  // A transposed (non-contiguous but dense) and a strided (not dense) view.
  grads.push_back(at::randn({64, 33}).t());
  grads.push_back(at::randn({64, 66}).slice(1, 0, 66, 2));
  for (const auto& g : grads) {
    expected.push_back(expected_unscaled(g, 8.0f));
  }
  const at::Tensor found = run_unscale(grads, at::full({}, 8.0f, at::kFloat), Backend::kRouted);
  EXPECT_EQ(found.item<float>(), 0.0f);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(at::equal(grads[i], expected[i])) << "tensor " << i;
  }
}

TEST(UnscaleRouting, StridedViewUnscalesOnlyItsOwnElements) {
  auto base = at::full({8, 8}, 16.0);
  auto view = base.slice(1, 0, 8, 2);  // every other column: not dense
  std::vector<at::Tensor> grads{view};
  run_unscale(grads, at::full({}, 16.0f, at::kFloat), Backend::kRouted);
  EXPECT_TRUE(at::all(view == 1.0).item<bool>());
  EXPECT_TRUE(at::all(base.slice(1, 1, 8, 2) == 16.0).item<bool>());
}

TEST(UnscaleRouting, BFloat16RoundsOnceToNearestEven) {
  // 1.0078125 (= 1 + 2^-7) is exactly representable in bfloat16. Divided by 3 in
  // float32 and rounded once it must equal c10's own float->bfloat16 rounding.
  auto grad = at::full({5}, 1.0078125, at::kBFloat16);
  std::vector<at::Tensor> grads{grad};
  run_unscale(grads, at::full({}, 3.0f, at::kFloat), Backend::kRouted);
  const float inv = static_cast<float>(1.0 / 3.0);
  const c10::BFloat16 expected(1.0078125f * inv);
  EXPECT_EQ(grad[0].item<c10::BFloat16>().x, expected.x);
}

TEST(UnscaleRouting, NaNInBFloat16StaysNaN) {
  auto grad = at::full({3}, std::numeric_limits<float>::quiet_NaN(), at::kBFloat16);
  std::vector<at::Tensor> grads{grad};
  const at::Tensor found = run_unscale(grads, at::full({}, 2.0f, at::kFloat), Backend::kRouted);
  EXPECT_EQ(found.item<float>(), 1.0f);
  EXPECT_TRUE(at::all(grad.isnan()).item<bool>());
}

TEST(UnscaleRouting, FoundInfIsOnlyRaisedNeverCleared) {
  auto grad = at::ones({4});
  std::vector<at::Tensor> grads{grad};
  at::Tensor found = at::ones({}, at::kFloat);
  lucid::amp::detail::unscale_grads_(grads, at::full({}, 2.0f, at::kFloat), found);
  EXPECT_EQ(found.item<float>(), 1.0f);
}

TEST(UnscaleRouting, EveryCheckRecordsTheSmallestKeyOfANonFiniteGradient) {
  for (const bool generic : {false, true}) {
    std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force;
    if (generic) {
      force = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
    for (const int count : {1, 7, 60}) {
      SCOPED_TRACE(generic ? "generic" : "cpu");
      lucid_test::expect_checks_record_the_first_overflow(at::kCPU, at::kCPU, count,
                                                          static_cast<unsigned>(count));
    }
  }
}

// --- the scale update: CPU twin, generic tensor ops and the host rule agree ---------

struct Schedule {
  float scale;
  int32_t tracker;
};

// PyTorch's rule: the three parameters, the guards off.
lucid::amp::detail::ScaleRule rule_without_guards(double growth, double backoff, int64_t interval) {
  lucid::amp::detail::ScaleRule rule;
  rule.growth_factor = growth;
  rule.backoff_factor = backoff;
  rule.growth_interval = interval;
  return rule;
}

Schedule run_update(bool generic, Schedule s, bool found, double growth, double backoff,
                    int64_t interval) {
  at::Tensor scale = at::full({}, s.scale, at::kFloat);
  at::Tensor tracker = at::full({}, s.tracker, at::kInt);
  const at::Tensor found_inf = at::full({}, found ? 1.0f : 0.0f, at::kFloat);
  at::Tensor no_overflow_tracker;
  const lucid::amp::detail::ScaleRule rule = rule_without_guards(growth, backoff, interval);
  if (generic) {
    lucid::amp::generic::amp_backend().update_scale_(scale, tracker, no_overflow_tracker, found_inf,
                                                     rule, lucid::amp::UpdateRecord());
  } else {
    lucid::amp::cpu::update_scale_(scale, tracker, no_overflow_tracker, found_inf, rule,
                                   lucid::amp::UpdateRecord());
  }
  return {scale.item<float>(), tracker.item<int32_t>()};
}

TEST(UpdateScale, CpuTwinAndGenericFollowTheSameSawtooth) {
  for (const bool generic : {false, true}) {
    Schedule s{1024.0f, 0};
    // interval 3: two clean updates count, the third grows; an overflow halves and resets.
    s = run_update(generic, s, false, 2.0, 0.5, 3);
    EXPECT_EQ(s.scale, 1024.0f);
    EXPECT_EQ(s.tracker, 1);
    s = run_update(generic, s, false, 2.0, 0.5, 3);
    EXPECT_EQ(s.tracker, 2);
    s = run_update(generic, s, false, 2.0, 0.5, 3);
    EXPECT_EQ(s.scale, 2048.0f);
    EXPECT_EQ(s.tracker, 0);
    s = run_update(generic, s, false, 2.0, 0.5, 3);
    s = run_update(generic, s, true, 2.0, 0.5, 3);
    EXPECT_EQ(s.scale, 1024.0f);
    EXPECT_EQ(s.tracker, 0);
  }
}

TEST(UpdateScale, NeverGrowsPastFloat32Max) {
  for (const bool generic : {false, true}) {
    const Schedule s = run_update(generic, {FLT_MAX / 1.5f, 0}, false, 2.0, 0.5, 1);
    EXPECT_EQ(s.scale, FLT_MAX / 1.5f) << (generic ? "generic" : "cpu");
    EXPECT_EQ(s.tracker, 0);
  }
}

// The generic path multiplies in float32 (devices such as MPS lack float64); the CPU
// twin, like ATen's CUDA kernel, in float64. Each must follow its own rule exactly.
lucid::amp::detail::ScaleState next_in_float32(lucid::amp::detail::ScaleState s, bool found,
                                               float growth, float backoff, int32_t interval) {
  if (found) {
    return {s.scale * backoff, 0};
  }
  if (s.growth_tracker + 1 == interval) {
    const float grown = s.scale * growth;
    return {std::isfinite(grown) ? grown : s.scale, 0};
  }
  return {s.scale, s.growth_tracker + 1};
}

TEST(UpdateScale, NonPowerOfTwoFactorsFollowEachBackendsRule) {
  for (const bool generic : {false, true}) {
    Schedule s{1000.0f, 0};
    lucid::amp::detail::ScaleState model{1000.0f, 0};
    for (int i = 0; i < 20; ++i) {
      const bool found = (i % 7 == 3);
      s = run_update(generic, s, found, 1.7, 0.3, 2);
      model = generic ? next_in_float32(model, found, 1.7f, 0.3f, 2)
                      : lucid::amp::detail::next_scale_state(model, found,
                                                             rule_without_guards(1.7, 0.3, 2));
      EXPECT_EQ(s.scale, model.scale) << (generic ? "generic" : "cpu") << ", iteration " << i;
      EXPECT_EQ(s.tracker, model.growth_tracker) << "iteration " << i;
    }
  }
}

}  // namespace
