// SPDX-License-Identifier: BSD-3-Clause
// Diagnostics: the overflow report (which parameter, how many entries), counters, whether
// an optimizer's last step was skipped, and the backoff callback.

#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"

#include <torch/optim/schedulers/step_lr.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <tuple>
#include <vector>

namespace {

using namespace lucid_test;

// A two-layer model with named parameters 0.weight [3,4], 0.bias [3], 1.weight [1,3], 1.bias [1].
struct Model {
  Model() {
    net->push_back(torch::nn::Linear(4, 3));
    net->push_back(torch::nn::Linear(3, 1));
    for (auto& p : net->parameters()) {
      p.mutable_grad() = torch::ones_like(p) * 8.0;
    }
  }
  // By value: named_parameters() returns a temporary dict (a reference into it dangles;
  // found by AddressSanitizer, docs/RELIABILITY.md). The copy shares the parameter.
  torch::Tensor param(const std::string& name) const { return net->named_parameters()[name]; }
  torch::nn::Sequential net;
};

TEST(OverflowReport, NamesTheParameterAndCountsItsNonFiniteEntries) {
  Model m;
  torch::optim::SGD opt(m.net->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  scaler.set_parameter_names(m.net->named_parameters());
  scaler.scale(torch::ones({}));
  auto g = torch::full({1, 3}, 8.0f);
  g[0][0] = kFNaN;
  g[0][1] = kFNaN;
  g[0][2] = -kFInf;
  m.param("1.weight").mutable_grad() = g;
  EXPECT_FALSE(scaler.step(opt).has_value());

  ASSERT_TRUE(scaler.last_overflow().has_value());
  const auto& report = *scaler.last_overflow();
  EXPECT_EQ(report.iteration, 0);
  EXPECT_EQ(report.scale, 8.0);
  EXPECT_EQ(report.optimizers, 1);
  ASSERT_EQ(report.gradients.size(), 1u);
  const NonFiniteGradient& e = report.gradients[0];
  EXPECT_EQ(e.optimizer, &opt);
  EXPECT_EQ(e.param_group, 0u);
  EXPECT_EQ(e.index, 2u);
  EXPECT_EQ(e.name, "1.weight");
  EXPECT_EQ(e.nan_count, 2);
  EXPECT_EQ(e.inf_count, 1);
  EXPECT_EQ(e.numel, 3);
  EXPECT_EQ(e.sizes, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(e.dtype, at::kFloat);
  EXPECT_TRUE(e.device.is_cpu());
  const std::string text = report.to_string();
  EXPECT_NE(text.find("'1.weight'"), std::string::npos) << text;
  EXPECT_NE(text.find("2 NaN and 1 inf of 3 entries"), std::string::npos) << text;
}

TEST(OverflowReport, IndexesWithinEachParamGroupAndWorksWithoutNames) {
  auto a = torch::ones({2}, torch::requires_grad());
  auto b = torch::ones({5}, torch::requires_grad());
  auto c = torch::ones({2, 2}, torch::requires_grad());
  torch::optim::SGD opt(std::vector<torch::optim::OptimizerParamGroup>{
                            torch::optim::OptimizerParamGroup({a}),
                            torch::optim::OptimizerParamGroup({b, c})},
                        torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  scale_loss(scaler);
  a.mutable_grad() = torch::ones({2});
  b.mutable_grad() = torch::full({5}, kFInf);
  c.mutable_grad() = torch::tensor({{1.0f, kFNaN}, {kFInf, 2.0f}});
  scaler.step(opt);
  const auto& r = *scaler.last_overflow();
  ASSERT_EQ(r.gradients.size(), 2u);
  EXPECT_EQ(r.gradients[0].param_group, 1u);
  EXPECT_EQ(r.gradients[0].index, 0u);
  EXPECT_EQ(r.gradients[0].inf_count, 5);
  EXPECT_EQ(r.gradients[0].name, "");
  EXPECT_EQ(r.gradients[1].param_group, 1u);
  EXPECT_EQ(r.gradients[1].index, 1u);
  EXPECT_EQ(r.gradients[1].nan_count, 1);
  EXPECT_EQ(r.gradients[1].inf_count, 1);
}

TEST(OverflowReport, CountsValuesThatOverflowOnlyWhenUnscaled) {
  // A small scale divides a large finite gradient into inf: that is what the flag saw.
  GradScaler scaler(GradScalerOptions().init_scale(0.25));
  scale_loss(scaler);
  OneParam p(3);
  p.set_grad(torch::tensor({FLT_MAX, 1.0f, -FLT_MAX}));
  EXPECT_FALSE(scaler.step(p.optimizer).has_value());
  const auto& e = scaler.last_overflow()->gradients.at(0);
  EXPECT_EQ(e.inf_count, 2);
  EXPECT_EQ(e.nan_count, 0);
}

TEST(OverflowReport, SparseAndBFloat16GradientsAreCounted) {
  auto s = torch::ones({4, 2}, torch::requires_grad());
  auto h = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt(std::vector<torch::Tensor>{s, h}, torch::optim::SGDOptions(0.1));
  s.mutable_grad() = torch::sparse_coo_tensor(torch::tensor({{0, 3}}),
                                              torch::tensor({{1.0f, kFNaN}, {kFInf, kFInf}}), {4, 2});
  h.mutable_grad() = torch::tensor({1.0f, kFNaN, 2.0f}).to(torch::kBFloat16);
  GradScaler scaler;
  scale_loss(scaler);
  scaler.step(opt);
  const auto& r = *scaler.last_overflow();
  ASSERT_EQ(r.gradients.size(), 2u);
  EXPECT_EQ(r.gradients[0].nan_count, 1);
  EXPECT_EQ(r.gradients[0].inf_count, 2);
  EXPECT_EQ(r.gradients[0].numel, 4);  // stored values
  EXPECT_EQ(r.gradients[1].dtype, at::kBFloat16);
  EXPECT_EQ(r.gradients[1].nan_count, 1);
}

TEST(OverflowReport, AHookRaisedFlagGivesAnEmptyListThatSaysSo) {
  GradScaler scaler;
  scale_loss(scaler);
  scaler.set_found_inf_hook(hook_of([](torch::Tensor& f) { f.fill_(1.0); }));
  OneParam p;
  p.clean_grad();
  EXPECT_FALSE(scaler.step(p.optimizer).has_value());
  ASSERT_TRUE(scaler.last_overflow().has_value());
  EXPECT_TRUE(scaler.last_overflow()->gradients.empty());
  EXPECT_NE(scaler.last_overflow()->to_string().find("found_inf hook"), std::string::npos);
}

TEST(OverflowReport, CleanIterationsBuildNoReport) {
  GradScaler scaler;
  OneParam p;
  for (int i = 0; i < 3; ++i) {
    iterate(scaler, p, false);
  }
  EXPECT_FALSE(scaler.last_overflow().has_value());
}

TEST(OverflowReport, OneReportPerIterationKeptUntilTheNextOverflow) {
  GradScaler scaler;
  scale_loss(scaler);
  OneParam a, b;
  a.inf_grad();
  b.inf_grad();
  scaler.step(a.optimizer);
  scaler.step(b.optimizer);
  EXPECT_EQ(scaler.last_overflow()->optimizers, 2);
  EXPECT_EQ(scaler.last_overflow()->gradients.size(), 2u);
  EXPECT_EQ(scaler.last_overflow()->gradients[1].optimizer, &b.optimizer);
  scaler.update();
  iterate(scaler, a, false);
  EXPECT_EQ(scaler.last_overflow()->iteration, 0) << "kept across clean iterations";
  iterate(scaler, a, true);
  EXPECT_EQ(scaler.last_overflow()->iteration, 2);
  EXPECT_EQ(scaler.last_overflow()->optimizers, 1);
}

TEST(OverflowReport, OverflowedReadsAnUnscaleOnlyOptimizerAndBuildsTheReport) {
  GradScaler scaler;
  scale_loss(scaler);
  OneParam p;
  EXPECT_FALSE(scaler.overflowed(p.optimizer)) << "not unscaled yet";
  p.inf_grad();
  scaler.unscale_(p.optimizer);
  EXPECT_FALSE(scaler.last_overflow().has_value()) << "unscale_ reads nothing";
  EXPECT_TRUE(scaler.overflowed(p.optimizer));
  ASSERT_TRUE(scaler.last_overflow().has_value());
  EXPECT_EQ(scaler.last_overflow()->gradients.at(0).inf_count, 1);
  EXPECT_TRUE(scaler.overflowed(p.optimizer));
  EXPECT_EQ(scaler.last_overflow()->optimizers, 1) << "read once";
  EXPECT_FALSE(scaler.step(p.optimizer).has_value());
}

TEST(OverflowReport, UpdateNeverTouchesAnOptimizerThatMayBeGone) {
  // An optimizer unscale_'d and destroyed before update(): a guarded update reads its
  // flag (ours) but must not look at the optimizer (ASan would catch it).
  GradScaler scaler(GradScalerOptions().init_scale(8).min_scale(1));
  scale_loss(scaler);
  {
    OneParam p;
    p.inf_grad();
    scaler.unscale_(p.optimizer);
  }
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.last_overflow()->uninspected_optimizers, 1);
}

TEST(ParameterNames, AreHeldWeakly) {
  GradScaler scaler;
  scale_loss(scaler);
  {
    Model gone;
    scaler.set_parameter_names(gone.net->named_parameters(), "old.");
  }
  Model m;  // may reuse addresses: the old names must not show
  scaler.set_parameter_names(torch::OrderedDict<std::string, torch::Tensor>());
  torch::optim::SGD opt(m.net->parameters(), torch::optim::SGDOptions(0.1));
  m.param("0.bias").mutable_grad() = torch::full({3}, kFNaN);
  scaler.step(opt);
  EXPECT_EQ(scaler.last_overflow()->gradients.at(0).name, "");
  scaler.set_parameter_name(m.param("0.bias"), "encoder.bias");
  scaler.update();
  m.param("0.bias").mutable_grad() = torch::full({3}, kFNaN);
  scaler.step(opt);
  EXPECT_EQ(scaler.last_overflow()->gradients.at(0).name, "encoder.bias");
  EXPECT_TRUE(ThrowsValueError("undefined", [&] {
    scaler.set_parameter_name(torch::Tensor(), "x");
  }));
}

// ---------------------------------------------------------------------------------------
// Counters.

TEST(Counters, CountStepsUpdatesBackoffsAndGrowths) {
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
  OneParam p;
  const std::vector<bool> overflows = {false, false, true, true, false, false, false};
  for (bool o : overflows) {
    iterate(scaler, p, o);
  }
  EXPECT_TRUE(CountersAre(scaler.counters(), {/*taken*/ 5, /*skipped*/ 2, /*updates*/ 7,
                                              /*overflow_updates*/ 2, /*backoffs*/ 2,
                                              /*growths*/ 2, /*overflow_streak*/ 0}));
  scaler.update(4.0);  // counts as an update, changes no schedule counter
  EXPECT_EQ(scaler.counters().updates, 8);
  EXPECT_EQ(scaler.counters().growths, 2);
}

TEST(Counters, StreakRisesWhileEveryStepIsSkipped) {
  GradScaler scaler;
  OneParam p;
  for (int i = 1; i <= 5; ++i) {
    iterate(scaler, p, true);
    EXPECT_EQ(scaler.counters().overflow_streak, i);
  }
  iterate(scaler, p, false);
  EXPECT_EQ(scaler.counters().overflow_streak, 0);
}

TEST(Counters, AnUnscaleOnlyOptimizerIsCountedWhenAsked) {
  // Its flag was never read by step(); counters() reads it (NOTE: [Diagnostics without
  // host synchronisation]).
  GradScaler scaler(GradScalerOptions().growth_interval(3));
  scale_loss(scaler);
  OneParam p;
  const std::vector<bool> overflows = {true, false, false, false, true, false};
  for (bool o : overflows) {
    p.grad_for(o);
    scaler.unscale_(p.optimizer);
    scaler.update();
  }
  const ScalerCounters c = scaler.counters();
  EXPECT_EQ(c.steps_taken + c.steps_skipped, 0);
  EXPECT_EQ(c.updates, 6);
  EXPECT_EQ(c.overflow_updates, 2);
  EXPECT_EQ(c.backoffs, 2);
  EXPECT_EQ(c.growths, 1);
  EXPECT_EQ(c.overflow_streak, 0);
  EXPECT_EQ(scaler.get_scale(), 65536.0 / 2 * 2 / 2);
}

TEST(Counters, ManyUnreadUpdatesStayExact) {
  GradScaler scaler(GradScalerOptions().growth_interval(7));
  scale_loss(scaler);
  OneParam p;
  int64_t overflows = 0;
  for (int i = 0; i < 2600; ++i) {  // more than the queue bound (1024)
    const bool o = i % 13 == 5;
    overflows += o;
    p.grad_for(o);
    scaler.unscale_(p.optimizer);
    if (i % 2 == 0) {
      scaler.step(p.optimizer);  // mixes read and unread updates
    }
    scaler.update();
  }
  const ScalerCounters c = scaler.counters();
  EXPECT_EQ(c.updates, 2600);
  EXPECT_EQ(c.overflow_updates, overflows);
  EXPECT_EQ(c.backoffs, overflows);
  // Between overflows there are 12 clean updates: one growth each (interval 7), plus the
  // run before the first overflow (5 clean: none) and after the last.
  int64_t growths = 0;
  int run = 0;
  for (int i = 0; i < 2600; ++i) {
    if (i % 13 == 5) {
      run = 0;
    } else if (++run == 7) {
      ++growths;
      run = 0;
    }
  }
  EXPECT_EQ(c.growths, growths);
}

TEST(Counters, DisabledScalerCountsNothing) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  OneParam p;
  p.inf_grad();
  scaler.step(p.optimizer);
  scaler.update();
  const ScalerCounters c = scaler.counters();
  EXPECT_EQ(c.steps_taken + c.steps_skipped + c.updates, 0);
  EXPECT_FALSE(scaler.step_skipped(p.optimizer));
  EXPECT_FALSE(scaler.last_overflow().has_value());
  EXPECT_FALSE(scaler.overflowed(p.optimizer));
}

// ---------------------------------------------------------------------------------------
// step_skipped: what a training loop or LR scheduler asks.

TEST(StepSkipped, AnswersPerOptimizerAndSurvivesUpdate) {
  GradScaler scaler;
  scale_loss(scaler);
  OneParam a, b;
  EXPECT_FALSE(scaler.step_skipped(a.optimizer)) << "never stepped";
  a.inf_grad();
  b.clean_grad();
  scaler.step(a.optimizer);
  scaler.step(b.optimizer);
  EXPECT_TRUE(scaler.step_skipped(a.optimizer));
  EXPECT_FALSE(scaler.step_skipped(b.optimizer));
  scaler.update();
  EXPECT_TRUE(scaler.step_skipped(a.optimizer)) << "still answers after update()";
  a.clean_grad();
  scaler.step(a.optimizer);
  EXPECT_FALSE(scaler.step_skipped(a.optimizer));
}

TEST(StepSkipped, KeepsAnLrSchedulerInStepWithTheOptimizer) {
  GradScaler scaler;
  OneParam p(4, 1.0);
  torch::optim::StepLR scheduler(p.optimizer, /*step_size=*/1, /*gamma=*/0.5);
  const std::vector<bool> overflows = {false, true, true, false, false};
  int real_steps = 0;
  for (bool o : overflows) {
    iterate(scaler, p, o);
    if (!scaler.step_skipped(p.optimizer)) {
      scheduler.step();
      ++real_steps;
    }
  }
  EXPECT_EQ(real_steps, 3);
  // The same schedule as a run that only ever took those three steps.
  OneParam control(4, 1.0);
  torch::optim::StepLR control_scheduler(control.optimizer, 1, 0.5);
  for (int i = 0; i < 3; ++i) {
    control_scheduler.step();
  }
  EXPECT_EQ(p.optimizer.param_groups()[0].options().get_lr(),
            control.optimizer.param_groups()[0].options().get_lr());
  EXPECT_LT(p.optimizer.param_groups()[0].options().get_lr(), 1.0);
}

// ---------------------------------------------------------------------------------------
// Backoff callback.

TEST(BackoffCallback, CalledOncePerBackoffWithTheScalesAndTheReport) {
  GradScaler scaler(GradScalerOptions().init_scale(64).growth_interval(2).hysteresis(2));
  scale_loss(scaler);
  std::vector<BackoffEvent> events;
  std::vector<std::string> reports;
  scaler.set_backoff_callback([&](const BackoffEvent& e) {
    events.push_back(e);
    reports.push_back(e.report != nullptr ? e.report->to_string() : "");
  });
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  scaler.set_parameter_names(model->named_parameters());
  const auto iteration = [&](bool overflow) {
    model->weight.mutable_grad() = torch::full({1, 2}, overflow ? kFInf : 1.0f);
    model->bias.mutable_grad() = torch::ones({1});
    scaler.step(opt);
    scaler.update();
  };
  iteration(true);   // absorbed: no call
  EXPECT_TRUE(events.empty());
  iteration(true);   // backoff 64 -> 32
  iteration(true);   // backoff 32 -> 16
  iteration(false);
  iteration(false);  // growth: no call
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].iteration, 1);
  EXPECT_EQ(events[0].old_scale, 64.0);
  EXPECT_EQ(events[0].new_scale, 32.0);
  EXPECT_EQ(events[0].overflow_streak, 2);
  EXPECT_EQ(events[1].old_scale, 32.0);
  EXPECT_EQ(events[1].new_scale, 16.0);
  EXPECT_EQ(events[1].overflow_streak, 3);
  EXPECT_NE(reports[1].find("'weight'"), std::string::npos) << reports[1];
  EXPECT_EQ(scaler.get_scale(), 32.0);

  scaler.set_backoff_callback(nullptr);
  iteration(true);
  iteration(true);
  EXPECT_EQ(events.size(), 2u);
}

TEST(BackoffCallback, SeesAnUnscaleOnlyOptimizer) {
  GradScaler scaler(GradScalerOptions().init_scale(8));
  scale_loss(scaler);
  int calls = 0;
  scaler.set_backoff_callback([&](const BackoffEvent& e) {
    ++calls;
    ASSERT_NE(e.report, nullptr);
    EXPECT_EQ(e.report->optimizers, 1);
    EXPECT_EQ(e.report->uninspected_optimizers, 1);  // update() does not touch the optimizer
    EXPECT_TRUE(e.report->gradients.empty());
    EXPECT_NE(e.report->to_string().find("not inspected"), std::string::npos);
  });
  OneParam p;
  p.inf_grad();
  scaler.unscale_(p.optimizer);
  scaler.update();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

TEST(BackoffCallback, AThrowingCallbackLeavesTheUpdateApplied) {
  GradScaler scaler(GradScalerOptions().init_scale(8));
  scale_loss(scaler);
  scaler.set_backoff_callback([](const BackoffEvent&) { TORCH_CHECK(false, "stop training"); });
  OneParam p;
  p.inf_grad();
  scaler.step(p.optimizer);
  EXPECT_TRUE(ThrowsError("stop training", [&] { scaler.update(); }));
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.stage(p.optimizer), lucid::amp::OptimizerStage::kReady);
  EXPECT_EQ(scaler.counters().backoffs, 1);
}

}  // namespace

namespace {

using lucid::amp::kStepLogCapacity;
using lucid::amp::kStepLogOptimizers;
using lucid::amp::MinScalePolicy;
using lucid::amp::ScaleChange;
using lucid::amp::StepRecord;

// The step log, read with wait (every update so far).
std::vector<StepRecord> history_of(const GradScaler& scaler) {
  return scaler.history(/*wait=*/true);
}

}  // namespace

TEST(StepLog, RecordsEachUpdatesScalesOverflowAndChange) {
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(2));
  EXPECT_TRUE(history_of(scaler).empty());  // nothing before the first scale()
  OneParam p;
  for (const bool o : {false, false, true, false}) {
    iterate(scaler, p, o);
  }
  scaler.update(64.0);  // update(new_scale) runs no schedule: not logged
  const std::vector<StepRecord> log = history_of(scaler);
  ASSERT_EQ(log.size(), 4u);
  const std::vector<std::tuple<double, double, bool, ScaleChange>> expected = {
      {1024, 1024, false, ScaleChange::kNone},
      {1024, 2048, false, ScaleChange::kGrowth},
      {2048, 1024, true, ScaleChange::kBackoff},
      {1024, 1024, false, ScaleChange::kNone}};
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(log[i].update, static_cast<int64_t>(i));
    EXPECT_EQ(log[i].scale, std::get<0>(expected[i])) << i;
    EXPECT_EQ(log[i].new_scale, std::get<1>(expected[i])) << i;
    EXPECT_EQ(log[i].found_inf, std::get<2>(expected[i])) << i;
    EXPECT_EQ(log[i].change, std::get<3>(expected[i])) << i;
    EXPECT_FALSE(log[i].grad_norm.has_value()) << "no clip in iteration " << i;
  }
}

TEST(StepLog, RecordsTheClipNormEvenWhenItIsNotFinite) {
  GradScaler scaler(GradScalerOptions().init_scale(4));
  OneParam p;
  for (const bool overflow : {false, true}) {
    scale_loss(scaler);
    p.grad_for(overflow);
    const double norm = scaler.clip_grad_norm_(p.optimizer, 1.0).item<double>();
    scaler.step(p.optimizer);
    scaler.update();
    const StepRecord last = history_of(scaler).back();
    ASSERT_TRUE(last.grad_norm.has_value());
    if (overflow) {
      EXPECT_FALSE(std::isfinite(*last.grad_norm));
      EXPECT_TRUE(last.found_inf);
    } else {
      EXPECT_DOUBLE_EQ(*last.grad_norm, norm);  // clean grads of 8 / 4 = 2 each: norm 4
      EXPECT_DOUBLE_EQ(norm, 4.0);
    }
  }
}

TEST(StepLog, HysteresisAndAHeldMinScaleAreLoggedAsApplied) {
  GradScaler scaler(GradScalerOptions()
                        .init_scale(8)
                        .backoff_factor(0.25)
                        .hysteresis(2)
                        .min_scale(1)
                        .min_scale_policy(MinScalePolicy::kClamp));
  OneParam p;
  for (int i = 0; i < 3; ++i) {
    iterate(scaler, p, true);
  }
  const std::vector<StepRecord> log = history_of(scaler);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0].change, ScaleChange::kAbsorbed);
  EXPECT_EQ(log[0].new_scale, 8.0);
  EXPECT_EQ(log[1].change, ScaleChange::kBackoff);
  EXPECT_EQ(log[1].new_scale, 2.0);
  EXPECT_EQ(log[2].change, ScaleChange::kBackoff);
  EXPECT_EQ(log[2].new_scale, 1.0) << "0.5 would be below min_scale: held at 1";
  EXPECT_EQ(log[2].new_scale, scaler.get_scale());
}

TEST(StepLog, KeepsTheLatestCapacityUpdates) {
  GradScaler scaler(GradScalerOptions().growth_interval(1000000));
  OneParam p;
  const int64_t n = kStepLogCapacity + 6;
  for (int64_t i = 0; i < n; ++i) {
    iterate(scaler, p, i == n - 1);
  }
  const std::vector<StepRecord> log = history_of(scaler);
  ASSERT_EQ(static_cast<int64_t>(log.size()), kStepLogCapacity);
  EXPECT_EQ(log.front().update, 6);
  EXPECT_EQ(log.back().update, n - 1);
  EXPECT_TRUE(log.back().found_inf);
  EXPECT_FALSE(log[log.size() - 2].found_inf);
}

TEST(StepLog, ALoadedCheckpointClearsItAndNumbersOnFromItsUpdates) {
  GradScaler scaler;
  OneParam p;
  for (int i = 0; i < 3; ++i) {
    iterate(scaler, p, false);
  }
  torch::serialize::OutputArchive archive;
  scaler.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  iterate(scaler, p, true);
  ASSERT_EQ(history_of(scaler).size(), 4u);

  std::istringstream in(out.str());
  torch::serialize::InputArchive input;
  input.load_from(in);
  scaler.load(input);
  EXPECT_TRUE(history_of(scaler).empty());
  iterate(scaler, p, false);
  const std::vector<StepRecord> log = history_of(scaler);
  ASSERT_EQ(log.size(), 1u);
  EXPECT_EQ(log[0].update, 3);
  EXPECT_FALSE(log[0].found_inf);
}

TEST(StepLog, ADisabledScalerLogsNothing) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  iterate(scaler, false);
  EXPECT_TRUE(history_of(scaler).empty());
  EXPECT_TRUE(scaler.history().empty());
}

// More optimizers than the log tells apart, stepped in a new order each iteration, a
// random few overflowing: each record names them by their place in that iteration's
// order, the ones past the last place as the last, on the CPU table and the generic one.
TEST(StepLog, NamesTheOptimizersThatOverflowedByTheirPlaceInTheIteration) {
  for (const bool generic : {false, true}) {
    std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force;
    if (generic) {
      force = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
    constexpr int kOptimizers = kStepLogOptimizers + 2;
    std::vector<std::unique_ptr<OneParam>> ps;
    for (int i = 0; i < kOptimizers; ++i) {
      ps.push_back(std::make_unique<OneParam>());
    }
    GradScaler scaler(GradScalerOptions().init_scale(1 << 20));
    std::mt19937 rng(7);
    std::vector<int> order(kOptimizers);
    std::iota(order.begin(), order.end(), 0);
    std::vector<std::vector<int>> expected;
    for (int it = 0; it < 40; ++it) {
      std::shuffle(order.begin(), order.end(), rng);
      scale_loss(scaler);
      std::vector<int> places;
      for (int place = 0; place < kOptimizers; ++place) {
        const bool overflow = rng() % 5 == 0;
        OneParam& p = *ps[order[place]];
        p.grad_for(overflow);
        if (place % 3 == 0) {
          scaler.unscale_(p.optimizer);  // first use by unscale_: the place is taken there
        }
        scaler.step(p.optimizer);
        const int named = std::min(place, kStepLogOptimizers - 1);
        if (overflow && (places.empty() || places.back() != named)) {
          places.push_back(named);
        }
      }
      scaler.update();
      expected.push_back(places);
    }
    const std::vector<StepRecord> log = history_of(scaler);
    ASSERT_EQ(log.size(), expected.size());
    for (size_t i = 0; i < log.size(); ++i) {
      EXPECT_EQ(log[i].overflowed_optimizers, expected[i])
          << "iteration " << i << " generic " << generic;
      EXPECT_EQ(log[i].found_inf, !expected[i].empty()) << i;
    }
  }
}

namespace {

using lucid::amp::GradientPlace;

// One optimizer of the first-overflow test: two param groups of float32 and float64
// parameters, one of more elements than a CPU chunk (64 Ki) so that a tensor spans chunks.
struct GroupedOptimizer {
  explicit GroupedOptimizer(std::mt19937& rng) {
    std::vector<torch::optim::OptimizerParamGroup> groups;
    for (int g = 0; g < 2; ++g) {
      std::vector<torch::Tensor> group;
      for (int i = 0; i < 3; ++i) {
        const int64_t n = rng() % 4 == 0 ? 70000 : 1 + rng() % 40;
        group.push_back(
            torch::zeros({n}, rng() % 3 == 0 ? torch::kDouble : torch::kFloat).requires_grad_());
        params.push_back(group.back());
      }
      groups.emplace_back(group);
    }
    optimizer = std::make_unique<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.0));
  }
  std::vector<torch::Tensor> params;  // param groups concatenated
  std::unique_ptr<torch::optim::SGD> optimizer;
};

}  // namespace

TEST(StepLog, NamesTheFirstNonFiniteGradientAndCountsTheNaNAndInfEntries) {
  for (const bool generic : {false, true}) {
    std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force;
    if (generic) {
      force = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
    std::mt19937 rng(generic ? 5 : 4);
    std::vector<std::unique_ptr<GroupedOptimizer>> opts;
    for (int j = 0; j < 3; ++j) {
      opts.push_back(std::make_unique<GroupedOptimizer>(rng));
    }
    GradScaler scaler(GradScalerOptions().init_scale(1 << 10));
    std::vector<std::optional<std::pair<int, int64_t>>> expected;
    std::vector<std::pair<int64_t, int64_t>> counts;  // NaN and inf entries per iteration
    std::vector<int> order{0, 1, 2};
    for (int it = 0; it < 60; ++it) {
      std::shuffle(order.begin(), order.end(), rng);
      scale_loss(scaler);
      std::optional<std::pair<int, int64_t>> first;
      std::pair<int64_t, int64_t> met{0, 0};
      for (int place = 0; place < 3; ++place) {
        GroupedOptimizer& o = *opts[order[place]];
        for (size_t k = 0; k < o.params.size(); ++k) {
          torch::Tensor& p = o.params[k];
          const uint32_t roll = rng() % 10;
          if (roll == 0) {
            p.mutable_grad() = torch::Tensor();  // took no part: it keeps its position
            continue;
          }
          p.mutable_grad() = torch::ones_like(p);
          if (roll == 1) {  // an inf or a NaN, anywhere in the tensor
            const bool nan = rng() % 2 == 0;
            p.mutable_grad()[static_cast<int64_t>(rng() % p.numel())] = nan ? kFNaN : kFInf;
            (nan ? met.first : met.second) += 1;
            if (!first.has_value()) {
              first = std::make_pair(place, static_cast<int64_t>(k));
            }
          }
        }
        switch (rng() % 3) {  // the three checks: unscale_, clip_grad_norm_, step's own
          case 0:
            scaler.unscale_(*o.optimizer);
            break;
          case 1:
            scaler.clip_grad_norm_(*o.optimizer, 1.0);
            break;
          default:
            break;
        }
        scaler.step(*o.optimizer);
      }
      scaler.update();
      expected.push_back(first);
      counts.push_back(met);
    }
    const std::vector<StepRecord> log = history_of(scaler);
    ASSERT_EQ(log.size(), expected.size());
    int named = 0;
    for (size_t i = 0; i < log.size(); ++i) {
      EXPECT_EQ(log[i].nan_count, counts[i].first) << "iteration " << i << " generic " << generic;
      EXPECT_EQ(log[i].inf_count, counts[i].second) << "iteration " << i << " generic " << generic;
      ASSERT_EQ(log[i].first_overflow.has_value(), expected[i].has_value())
          << "iteration " << i << " generic " << generic;
      if (expected[i].has_value()) {
        ++named;
        EXPECT_EQ(log[i].first_overflow->optimizer, expected[i]->first) << i;
        EXPECT_EQ(log[i].first_overflow->parameter, expected[i]->second) << i;
      }
    }
    EXPECT_GT(named, 20);  // most iterations overflow somewhere, and are named
  }
}

TEST(StepLog, NamesNoGradientForAHooksFlagOrAnIterationEndedByUpdateNewScale) {
  // A flag raised by a hook (another rank's overflow) names no local gradient.
  struct Raise : lucid::amp::FoundInfHook {
    void agree_(at::Tensor& found_inf) override { found_inf.fill_(1.0); }
  };
  GradScaler scaler(GradScalerOptions().init_scale(8));
  scaler.set_found_inf_hook(std::make_shared<Raise>());
  OneParam p;
  scale_loss(scaler);
  p.clean_grad();
  scaler.step(p.optimizer);
  scaler.update();
  scaler.set_found_inf_hook(nullptr);
  // An overflow whose iteration update(new_scale) ends logs nothing; the next iteration,
  // clean, names nothing either.
  scale_loss(scaler);
  p.inf_grad();
  scaler.step(p.optimizer);
  scaler.update(4.0);
  scale_loss(scaler);
  p.clean_grad();
  scaler.step(p.optimizer);
  scaler.update();
  scale_loss(scaler);
  p.inf_grad();
  scaler.step(p.optimizer);
  scaler.update();
  const std::vector<StepRecord> log = history_of(scaler);
  ASSERT_EQ(log.size(), 3u);
  EXPECT_TRUE(log[0].found_inf);
  EXPECT_FALSE(log[0].first_overflow.has_value());
  EXPECT_EQ(log[0].nan_count + log[0].inf_count, 0);
  EXPECT_FALSE(log[1].found_inf);
  EXPECT_FALSE(log[1].first_overflow.has_value());
  ASSERT_TRUE(log[2].first_overflow.has_value());
  EXPECT_EQ(log[2].first_overflow->optimizer, 0);
  EXPECT_EQ(log[2].first_overflow->parameter, 0);
  EXPECT_EQ(log[2].inf_count, 1);  // update(new_scale) set the site back: only this one
  EXPECT_EQ(log[2].nan_count, 0);
}
