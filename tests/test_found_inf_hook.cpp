// SPDX-License-Identifier: BSD-3-Clause
// GradScaler::set_found_inf_hook (amp::FoundInfHook): the extension point a distributed
// binding uses to make every rank take the same step decision, and, for a hook that
// combines norms, lets ranks that each hold a shard of the gradients clip by the norm of
// all of them.

#include "support/scaler_fixtures.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace lucid_test;

TEST(FoundInfHook, SeesEachOptimizersFlagOnceBeforeTheDecision) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  std::vector<float> seen;
  scaler.set_found_inf_hook(hook_of([&](torch::Tensor& f) { seen.push_back(f.item<float>()); }));
  OneParam clean, bad;
  scaler.scale(torch::ones({}));
  clean.param.mutable_grad() = torch::full({4}, 8.0);
  bad.param.mutable_grad() = torch::full({4}, std::numeric_limits<float>::infinity());
  scaler.unscale_(clean.optimizer);
  EXPECT_TRUE(scaler.step(clean.optimizer).has_value());  // no second call: already unscaled
  EXPECT_FALSE(scaler.step(bad.optimizer).has_value());
  EXPECT_EQ(seen, (std::vector<float>{0.0f, 1.0f}));
}

TEST(FoundInfHook, RaisingTheFlagSkipsTheStepAndBacksOff) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  scaler.set_found_inf_hook(
      hook_of([](torch::Tensor& f) { f.fill_(1.0); }));  // "another rank overflowed"
  OneParam p;
  scaler.scale(torch::ones({}));
  p.param.mutable_grad() = torch::full({4}, 8.0);
  const auto before = p.param.detach().clone();
  EXPECT_FALSE(scaler.step(p.optimizer).has_value());
  EXPECT_TRUE(torch::equal(p.param.detach(), before));
  EXPECT_TRUE(torch::equal(p.param.grad(), torch::ones({4})));  // still unscaled
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

// A hook may leave any non-zero value for an overflow (a sum over ranks, a negative
// number): the flag becomes exactly 1, which the step log reads as that optimizer's bit.
TEST(FoundInfHook, AnyNonZeroFlagItLeavesBecomesOne) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  const std::vector<float> left = {2.0f, 0.0f, -3.0f};
  size_t call = 0;
  scaler.set_found_inf_hook(hook_of([&](torch::Tensor& f) { f.fill_(left.at(call++)); }));
  OneParam a, b, c;
  scaler.scale(torch::ones({}));
  for (OneParam* p : {&a, &b, &c}) {
    p->param.mutable_grad() = torch::full({4}, 8.0);
    scaler.step(p->optimizer);
  }
  EXPECT_EQ(scaler.found_inf(a.optimizer).item<float>(), 1.0f);
  EXPECT_EQ(scaler.found_inf(b.optimizer).item<float>(), 0.0f);
  EXPECT_EQ(scaler.found_inf(c.optimizer).item<float>(), 1.0f);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  const std::vector<lucid::amp::StepRecord> log = scaler.history(/*wait=*/true);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].overflowed_optimizers, (std::vector<int>{0, 2}));
}

// A hook that throws (a collective that failed) after the flag was raised leaves no
// overflow behind: the optimizer is still ready, and neither a second attempt nor the
// update sees the raised flag.
TEST(FoundInfHook, AThrowingHookLeavesNoOverflowBehind) {
  for (const bool clip : {false, true}) {
    GradScaler scaler(GradScalerOptions().init_scale(8.0));
    scaler.set_found_inf_hook(hook_of([](torch::Tensor& f) {
      f.fill_(1.0);
      throw std::runtime_error("the collective failed");
    }));
    OneParam p;
    scaler.scale(torch::ones({}));
    p.param.mutable_grad() = torch::full({4}, 8.0);
    EXPECT_THROW(
        clip ? (void)scaler.clip_grad_norm_(p.optimizer, 100.0) : scaler.unscale_(p.optimizer),
        std::runtime_error);
    EXPECT_EQ(scaler.stage(p.optimizer), lucid::amp::OptimizerStage::kReady);
    scaler.set_found_inf_hook(nullptr);
    p.param.mutable_grad() = torch::full({4}, 8.0);
    EXPECT_TRUE(scaler.step(p.optimizer).has_value()) << "clip " << clip;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 8.0);
    const std::vector<lucid::amp::StepRecord> log = scaler.history(/*wait=*/true);
    ASSERT_EQ(log.size(), 1u);
    EXPECT_FALSE(log[0].found_inf) << "clip " << clip;
  }
}

TEST(FoundInfHook, RunsForAnOptimizerWithoutGradientsOnceTheScaleExists) {
  GradScaler scaler;
  int calls = 0;
  scaler.set_found_inf_hook(hook_of([&](torch::Tensor&) { ++calls; }));
  OneParam p;  // no gradient at all
  scaler.scale(torch::ones({}));
  EXPECT_TRUE(scaler.step(p.optimizer).has_value());
  EXPECT_EQ(calls, 1);
}

TEST(FoundInfHook, RemovedWithNullptr) {
  GradScaler scaler;
  int calls = 0;
  scaler.set_found_inf_hook(hook_of([&](torch::Tensor&) { ++calls; }));
  scaler.set_found_inf_hook(nullptr);
  OneParam p;
  scaler.scale(torch::ones({}));
  p.param.mutable_grad() = torch::ones({4});
  scaler.step(p.optimizer);
  EXPECT_EQ(calls, 0);
}

// ---- The norm hook (clip_grad_norm_) -------------------------------------------------

// The partial of `grads` for `norm_type`, as a rank holding them would contribute it.
float partial_of(const std::vector<torch::Tensor>& grads, double norm_type) {
  if (std::isinf(norm_type)) {
    float largest = 0.0f;
    for (const auto& g : grads) {
      largest = std::max(largest, g.abs().max().item<float>());
    }
    return largest;
  }
  double sum = 0.0;
  for (const auto& g : grads) {
    sum += g.abs().pow(norm_type).sum().item<double>();
  }
  return static_cast<float>(sum);
}

TEST(FoundInfHookNorm, ClipCallsItInsteadOfTheFlagHookWithTheExactPartial) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  int flag_calls = 0;
  std::vector<std::pair<float, double>> seen;  // (partial, norm_type)
  scaler.set_found_inf_hook(
      hook_of([&](torch::Tensor&) { ++flag_calls; },
              [&](torch::Tensor& f, torch::Tensor& partial, double norm_type) {
                EXPECT_EQ(f.item<float>(), 0.0f);
                EXPECT_EQ(partial.dim(), 0);
                EXPECT_EQ(partial.scalar_type(), torch::kFloat);
                seen.emplace_back(partial.item<float>(), norm_type);
              }));
  OneParam clipped(torch::zeros({2})), plain;
  scaler.scale(torch::ones({}));
  clipped.set_grad(torch::tensor({24.0f, 32.0f}));  // unscaled: {3, 4}
  plain.clean_grad();
  const torch::Tensor norm = scaler.clip_grad_norm_(clipped.optimizer, 100.0);
  EXPECT_EQ(norm.item<float>(), 5.0f);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].first, 25.0f);  // the sum of squares, not a norm squared again
  EXPECT_EQ(seen[0].second, 2.0);
  EXPECT_EQ(flag_calls, 0);
  EXPECT_TRUE(scaler.step(clipped.optimizer).has_value());  // unscaled already: no hook
  EXPECT_TRUE(scaler.step(plain.optimizer).has_value());    // unscale_ and step: the flag hook
  EXPECT_EQ(flag_calls, 1);
  EXPECT_EQ(seen.size(), 1u);
}

TEST(FoundInfHookNorm, WithoutOneClipCallsTheFlagHookAndKeepsItsOwnNorm) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  int flag_calls = 0;
  scaler.set_found_inf_hook(hook_of([&](torch::Tensor&) { ++flag_calls; }));
  OneParam p(torch::zeros({2}));
  scaler.scale(torch::ones({}));
  p.set_grad(torch::tensor({24.0f, 32.0f}));
  EXPECT_EQ(scaler.clip_grad_norm_(p.optimizer, 100.0).item<float>(), 5.0f);
  EXPECT_EQ(flag_calls, 1);
}

class FoundInfHookNormTypes : public ::testing::TestWithParam<double> {};

// One "rank" holds a's gradient, the hook brings in b's partial: the clip equals one
// scaler clipping a and b together.
TEST_P(FoundInfHookNormTypes, ACombinedPartialClipsLikeTheNormOfAllGradients) {
  const double norm_type = GetParam();
  torch::manual_seed(3);
  const torch::Tensor grad_a = torch::randn({5}) * 64.0, grad_b = torch::randn({7}) * 64.0;
  const double scale = 64.0, max_norm = 0.5;

  GradScaler whole(GradScalerOptions().init_scale(scale));
  torch::Tensor a1 = torch::zeros({5}, torch::requires_grad()),
                b1 = torch::zeros({7}, torch::requires_grad());
  torch::optim::SGD both({a1, b1}, torch::optim::SGDOptions(1.0));
  whole.scale(torch::ones({}));
  a1.mutable_grad() = grad_a.clone();
  b1.mutable_grad() = grad_b.clone();
  const torch::Tensor expected = whole.clip_grad_norm_(both, max_norm, norm_type);

  GradScaler shard(GradScalerOptions().init_scale(scale));
  const float other = partial_of({grad_b / scale}, norm_type);
  shard.set_found_inf_hook(
      hook_of([](torch::Tensor&) {},
              [&](torch::Tensor&, torch::Tensor& partial, double p) {
                partial.copy_(std::isinf(p) ? torch::maximum(partial, torch::tensor(other))
                                            : partial + other);
              }));
  OneParam a2(torch::zeros({5}), 1.0);
  shard.scale(torch::ones({}));
  a2.set_grad(grad_a);
  const torch::Tensor norm = shard.clip_grad_norm_(a2.optimizer, max_norm, norm_type);
  EXPECT_NEAR(norm.item<float>(), expected.item<float>(), 1e-5 * expected.item<float>());
  EXPECT_TRUE(torch::allclose(a2.param.grad(), a1.grad(), 1e-5, 1e-7));
  EXPECT_LT(a2.param.grad().abs().max().item<float>(), grad_a.abs().max().item<float>() / scale)
      << "clipped";
}

INSTANTIATE_TEST_SUITE_P(NormTypes, FoundInfHookNormTypes,
                         ::testing::Values(1.0, 2.0, 3.0, lucid_test::kInf), [](const auto& info) {
                           return std::isinf(info.param)
                                      ? std::string("inf")
                                      : "p" + std::to_string(static_cast<int>(info.param));
                         });

// Another "rank" overflowed: its partial is inf or NaN, the flag here clean.
TEST(FoundInfHookNorm, ANonFiniteCombinedPartialSkipsAndIsReturned) {
  for (const float other : {kFInf, kFNaN}) {
    GradScaler scaler(GradScalerOptions().init_scale(8.0));
    scaler.set_found_inf_hook(
        hook_of([](torch::Tensor&) {},
                [&](torch::Tensor&, torch::Tensor& partial, double) { partial.fill_(other); }));
    OneParam p;
    scaler.scale(torch::ones({}));
    p.clean_grad();
    const auto before = p.param.detach().clone();
    const float norm = scaler.clip_grad_norm_(p.optimizer, 1.0).item<float>();
    EXPECT_TRUE(std::isinf(other) ? std::isinf(norm) : std::isnan(norm)) << norm;
    EXPECT_TRUE(scaler.overflowed(p.optimizer));
    EXPECT_FALSE(scaler.step(p.optimizer).has_value());
    EXPECT_TRUE(torch::equal(p.param.detach(), before));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 4.0);
  }
}

// A hook that says it combines norms but agrees only flags: clip_grad_norm_ hands it the
// partial, the default agree_with_norm_ agrees the flag once and leaves the partial, and
// the clip is by this process's own norm, as without such a hook.
class FlagOnlyHook final : public lucid::amp::FoundInfHook {
 public:
  void agree_(torch::Tensor& found_inf) override {
    ++calls;
    found_inf.fill_(raise ? 1.0 : 0.0);
  }
  bool combines_norm() const override { return true; }
  int calls = 0;
  bool raise = false;
};

TEST(FoundInfHookNorm, TheDefaultNormAgreementAgreesTheFlagAndKeepsThisProcesssNorm) {
  for (const bool raise : {false, true}) {
    GradScaler scaler(GradScalerOptions().init_scale(8.0));
    auto hook = std::make_shared<FlagOnlyHook>();
    hook->raise = raise;
    scaler.set_found_inf_hook(hook);
    OneParam p(torch::zeros({2}));
    scaler.scale(torch::ones({}));
    p.set_grad(torch::tensor({24.0f, 32.0f}));
    EXPECT_EQ(scaler.clip_grad_norm_(p.optimizer, 100.0).item<float>(), 5.0f);
    EXPECT_EQ(hook->calls, 1);
    EXPECT_EQ(scaler.overflowed(p.optimizer), raise);
    EXPECT_EQ(scaler.step(p.optimizer).has_value(), !raise);
  }
}

TEST(FoundInfHookNorm, RemovedWithTheFlagHookByNullptr) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  int calls = 0;
  scaler.set_found_inf_hook(hook_of([&](torch::Tensor&) { ++calls; },
                                    [&](torch::Tensor&, torch::Tensor&, double) { ++calls; }));
  scaler.set_found_inf_hook(nullptr);
  OneParam p(torch::zeros({2}));
  scaler.scale(torch::ones({}));
  p.set_grad(torch::tensor({24.0f, 32.0f}));
  EXPECT_EQ(scaler.clip_grad_norm_(p.optimizer, 100.0).item<float>(), 5.0f);
  EXPECT_EQ(calls, 0);
}

}  // namespace
