// SPDX-License-Identifier: BSD-3-Clause
// GradScaler::set_found_inf_hook: the extension point a distributed binding uses to make
// every rank take the same step decision.

#include "support/scaler_fixtures.h"

namespace {

using namespace lucid_test;

TEST(FoundInfHook, SeesEachOptimizersFlagOnceBeforeTheDecision) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  std::vector<float> seen;
  scaler.set_found_inf_hook([&](torch::Tensor& f) { seen.push_back(f.item<float>()); });
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
  scaler.set_found_inf_hook([](torch::Tensor& f) { f.fill_(1.0); });  // "another rank overflowed"
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

TEST(FoundInfHook, RunsForAnOptimizerWithoutGradientsOnceTheScaleExists) {
  GradScaler scaler;
  int calls = 0;
  scaler.set_found_inf_hook([&](torch::Tensor&) { ++calls; });
  OneParam p;  // no gradient at all
  scaler.scale(torch::ones({}));
  EXPECT_TRUE(scaler.step(p.optimizer).has_value());
  EXPECT_EQ(calls, 1);
}

TEST(FoundInfHook, RemovedWithNullptr) {
  GradScaler scaler;
  int calls = 0;
  scaler.set_found_inf_hook([&](torch::Tensor&) { ++calls; });
  scaler.set_found_inf_hook(nullptr);
  OneParam p;
  scaler.scale(torch::ones({}));
  p.param.mutable_grad() = torch::ones({4});
  scaler.step(p.optimizer);
  EXPECT_EQ(calls, 0);
}

}  // namespace
