// SPDX-License-Identifier: BSD-3-Clause
// Graph mode: GradScaler's graph_safe counters and step_skipped (counted on the device),
// found_inf(optimizer), the fused optimizers' device copies of their schedulable
// hyper-parameters, and a whole training step captured in a CUDA graph that follows an
// LR schedule over 100 replays with injected overflows (CUDA cases skip without a GPU).

#include "support/scaler_fixtures.h"

#include "amp/scale_rule.h"

#ifdef LUCID_AMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "support/syncs_are_errors.h"
#endif

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using namespace lucid_test;
using lucid::optim::FusedAdamW;
using lucid::optim::FusedAdamWOptions;
using lucid::optim::FusedSGD;
using lucid::optim::FusedSGDOptions;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Whether iteration `i` of a run gets an inf in its input: isolated overflows, and a
// streak of three that outlasts a hysteresis of 2.
bool overflows_at(int i) { return i % 7 == 3 || (i >= 40 && i < 43); }

// Zeroes the gradients in place, as a captured step needs (they must stay where the graph
// reads them).
void zero_grads_in_place(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) {
      p.mutable_grad().zero_();
    }
  }
}

// One small model, optimizer and scaler, stepped by the same recipe in every test.
struct Trainer {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<GradScaler> scaler;
  torch::Tensor x, y, bad_x;

  Trainer(const torch::Device& device, bool graph_safe, bool adam) {
    torch::manual_seed(7);
    model = torch::nn::Linear(16, 8);
    model->to(device);
    optimizer =
        adam ? std::unique_ptr<torch::optim::Optimizer>(
                   std::make_unique<FusedAdamW>(model->parameters(), FusedAdamWOptions(1e-2)))
             : std::make_unique<FusedSGD>(model->parameters(), FusedSGDOptions(0.05).momentum(0.9));
    scaler = std::make_unique<GradScaler>(GradScalerOptions()
                                              .graph_safe(graph_safe)
                                              .init_scale(1024.0)
                                              .growth_interval(5)
                                              .hysteresis(2));
    x = torch::randn({4, 16}).to(device);
    y = torch::randn({4, 8}).to(device);
    bad_x = x.clone();
    bad_x[0][0] = kInf;
  }

  // One iteration on whatever `x` holds.
  void iterate() {
    optimizer->zero_grad();
    scaler->scale((model->forward(x) - y).pow(2).mean()).backward();
    scaler->step(*optimizer);
    scaler->update();
  }
};

// The counters and skip decisions of graph_safe mode, counted on the device, equal those
// the host counts when it reads every flag; so do the parameters.
void expect_graph_safe_counts_like_eager(const torch::Device& device, bool adam) {
  Trainer eager(device, /*graph_safe=*/false, adam);
  Trainer graph(device, /*graph_safe=*/true, adam);
  const torch::Tensor clean_x = eager.x.clone();
  for (int i = 0; i < 60; ++i) {
    for (Trainer* t : {&eager, &graph}) {
      t->x.copy_(overflows_at(i) ? t->bad_x : clean_x);
      t->iterate();
    }
    ASSERT_EQ(graph.scaler->step_skipped(*graph.optimizer), overflows_at(i)) << "iteration " << i;
    ASSERT_EQ(eager.scaler->step_skipped(*eager.optimizer), overflows_at(i)) << "iteration " << i;
  }
  const ScalerCounters want = eager.scaler->counters();
  EXPECT_GT(want.backoffs, 0);
  EXPECT_GT(want.growths, 0);
  EXPECT_LT(want.backoffs, want.overflow_updates) << "hysteresis absorbs some overflows";
  EXPECT_TRUE(CountersAre(graph.scaler->counters(), want));
  EXPECT_EQ(graph.scaler->get_scale(), eager.scaler->get_scale());
  EXPECT_TRUE(torch::equal(graph.model->weight, eager.model->weight));
}

TEST(GraphSafeCpu, CountersAndStepSkippedEqualTheEagerRunsWithFusedAdamW) {
  expect_graph_safe_counts_like_eager(torch::kCPU, /*adam=*/true);
}

TEST(GraphSafeCpu, CountersAndStepSkippedEqualTheEagerRunsWithFusedSgd) {
  expect_graph_safe_counts_like_eager(torch::kCPU, /*adam=*/false);
}

TEST(GraphSafeCpu, LoadingAStateDictFoldsTheDeviceTallyIntoTheCountersAndCountingGoesOn) {
  Trainer eager(torch::kCPU, /*graph_safe=*/false, /*adam=*/true);
  Trainer graph(torch::kCPU, /*graph_safe=*/true, /*adam=*/true);
  const torch::Tensor clean_x = eager.x.clone();
  for (int i = 0; i < 20; ++i) {
    for (Trainer* t : {&eager, &graph}) {
      t->x.copy_(overflows_at(i) ? t->bad_x : clean_x);
      t->iterate();
      if (i == 9) {
        // Keeps counting (no counters in a state_dict): what the device counted stays.
        t->scaler->load_state_dict(t->scaler->state_dict());
      }
    }
    ASSERT_TRUE(CountersAre(graph.scaler->counters(), eager.scaler->counters()))
        << "iteration " << i;
  }
  EXPECT_EQ(graph.scaler->counters().updates, 20);
}

// A backoff callback makes the host decide each update; unset, graph_safe mode counts on
// the device again. Switching either way, the host continues from the trackers and streak
// the device counted, so counters, scale, step_skipped and the callback's events are those
// of an eager run. Iteration i overflows when overflows(i); the callback is set from the
// iterations where callback_on(i) turns true, and unset where it turns false.
void expect_callback_switches_to_count_like_eager(int iterations,
                                                  const std::function<bool(int)>& overflows,
                                                  const std::function<bool(int)>& callback_on) {
  Trainer eager(torch::kCPU, /*graph_safe=*/false, /*adam=*/false);
  Trainer graph(torch::kCPU, /*graph_safe=*/true, /*adam=*/false);
  using Event = std::tuple<int64_t, double, double, int64_t>;
  std::vector<Event> eager_events, graph_events;
  const auto record_into = [](std::vector<Event>& events) {
    return [&events](const BackoffEvent& e) {
      events.emplace_back(e.iteration, e.old_scale, e.new_scale, e.overflow_streak);
    };
  };
  const torch::Tensor clean_x = eager.x.clone();
  bool on = false;
  for (int i = 0; i < iterations; ++i) {
    if (callback_on(i) != on) {
      on = !on;
      eager.scaler->set_backoff_callback(on ? record_into(eager_events)
                                            : lucid::amp::BackoffCallback());
      graph.scaler->set_backoff_callback(on ? record_into(graph_events)
                                            : lucid::amp::BackoffCallback());
    }
    for (Trainer* t : {&eager, &graph}) {
      t->x.copy_(overflows(i) ? t->bad_x : clean_x);
      t->iterate();
    }
    ASSERT_TRUE(CountersAre(graph.scaler->counters(), eager.scaler->counters()))
        << "iteration " << i;
    ASSERT_EQ(graph.scaler->step_skipped(*graph.optimizer), overflows(i)) << "iteration " << i;
    ASSERT_EQ(graph.scaler->get_scale(), eager.scaler->get_scale()) << "iteration " << i;
  }
  EXPECT_EQ(graph_events, eager_events);
}

TEST(GraphSafeCpu, ABackoffCallbackSetMidGrowthIntervalContinuesFromTheDeviceTrackers) {
  expect_callback_switches_to_count_like_eager(50, overflows_at, [](int i) { return i >= 22; });
}

TEST(GraphSafeCpu, ABackoffCallbackSetMidOverflowStreakContinuesFromTheDeviceStreak) {
  // Iteration 40 overflowed, counted on the device, and hysteresis absorbed it: 41 backs off.
  expect_callback_switches_to_count_like_eager(50, overflows_at, [](int i) { return i >= 41; });
}

TEST(GraphSafeCpu, RandomOverflowsAndCallbackSwitchesCountLikeEager) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::bernoulli_distribution overflow(0.3), flip(0.15);
    std::vector<bool> overflows(60), callback_on(60);
    // Off at first: the first update counted on the device starts the streak from the
    // tally's, not from the host's (NOTE: [Counting on the device]).
    bool on = false;
    for (size_t i = 0; i < overflows.size(); ++i) {
      overflows[i] = overflow(rng);
      on = i > 0 && flip(rng) ? !on : on;
      callback_on[i] = on;
    }
    expect_callback_switches_to_count_like_eager(
        60, [&](int i) { return static_cast<bool>(overflows[i]); },
        [&](int i) { return static_cast<bool>(callback_on[i]); });
    if (HasFatalFailure()) {
      return;
    }
  }
}

// Several optimizers, a random subset stepping in a random order each iteration, so that
// an optimizer's place in its iteration (the entry whose outcome the update keeps) is taken
// over by another while the first one is idle; some iterations end with update(new_scale).
// graph_safe mode counts on the device what the default mode reads on the host: every
// optimizer's step_skipped (asked between step and update, and after, stepped in this
// iteration or not) and the counters, also in the middle of an iteration.
TEST(GraphSafeCpu, StepSkippedOfEveryOptimizerSurvivesItsPlaceBeingTakenOver) {
  constexpr int kOptimizers = 5;
  struct Run {
    std::vector<torch::nn::Linear> models;
    std::vector<std::unique_ptr<FusedSGD>> optimizers;
    std::unique_ptr<GradScaler> scaler;
  };
  const auto make = [](bool graph_safe) {
    torch::manual_seed(3);
    Run run;
    for (int k = 0; k < kOptimizers; ++k) {
      run.models.emplace_back(4, 2);
      run.optimizers.push_back(
          std::make_unique<FusedSGD>(run.models.back()->parameters(), FusedSGDOptions(0.1)));
    }
    run.scaler = std::make_unique<GradScaler>(
        GradScalerOptions().graph_safe(graph_safe).init_scale(256.0).growth_interval(3));
    return run;
  };
  Run eager = make(false);
  Run graph = make(true);
  std::mt19937 rng(5);
  std::bernoulli_distribution overflow(0.35), steps(0.6), set_scale(0.1);
  const torch::Tensor x = torch::randn({3, 4});
  const torch::Tensor bad_x = x.clone().index_put_({0, 0}, kInf);
  int counted_mid_iteration = 0;
  for (int i = 0; i < 80; ++i) {
    SCOPED_TRACE("iteration " + std::to_string(i));
    std::vector<int> order(kOptimizers);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int> stepping;
    std::vector<bool> bad;
    for (const int k : order) {
      if (steps(rng)) {
        stepping.push_back(k);
        bad.push_back(overflow(rng));
      }
    }
    const bool new_scale = set_scale(rng);
    for (Run* run : {&eager, &graph}) {
      for (size_t n = 0; n < stepping.size(); ++n) {
        const int k = stepping[n];
        run->optimizers[k]->zero_grad();
        run->scaler->scale(run->models[k]->forward(bad[n] ? bad_x : x).sum()).backward();
        run->scaler->step(*run->optimizers[k]);
      }
    }
    if (!stepping.empty()) {
      const int k = stepping.back();
      ASSERT_EQ(graph.scaler->step_skipped(*graph.optimizers[k]), static_cast<bool>(bad.back()));
      ASSERT_TRUE(CountersAre(graph.scaler->counters(), eager.scaler->counters()));
      ++counted_mid_iteration;
    }
    for (Run* run : {&eager, &graph}) {
      if (new_scale) {
        run->scaler->update(64.0);
      } else if (!stepping.empty()) {
        run->scaler->update();
      }
    }
    for (int k = 0; k < kOptimizers; ++k) {
      ASSERT_EQ(graph.scaler->step_skipped(*graph.optimizers[k]),
                eager.scaler->step_skipped(*eager.optimizers[k]))
          << "optimizer " << k;
    }
    ASSERT_TRUE(CountersAre(graph.scaler->counters(), eager.scaler->counters()));
    ASSERT_EQ(graph.scaler->get_scale(), eager.scaler->get_scale());
  }
  EXPECT_GT(counted_mid_iteration, 40);
  EXPECT_GT(eager.scaler->counters().steps_skipped, 20);
  for (int k = 0; k < kOptimizers; ++k) {
    EXPECT_TRUE(torch::equal(graph.models[k]->weight, eager.models[k]->weight)) << k;
  }
}

// The update counts the steps of at most kMaxSteppedOrdinals optimizers per iteration on
// the device; the next one is refused before it changes anything.
TEST(GraphSafeCpu, MoreOptimizersPerIterationThanTheUpdateCountsAreRefused) {
  GradScaler scaler(GradScalerOptions().graph_safe(true));
  std::vector<torch::Tensor> params;
  std::vector<std::unique_ptr<FusedSGD>> optimizers;
  for (int k = 0; k <= lucid::amp::detail::kMaxSteppedOrdinals; ++k) {
    params.push_back(torch::ones({1}, torch::requires_grad()));
    optimizers.push_back(std::make_unique<FusedSGD>(std::vector<torch::Tensor>{params.back()},
                                                    FusedSGDOptions(0.1)));
  }
  scaler.scale(torch::stack(params).sum()).backward();
  for (int k = 0; k < lucid::amp::detail::kMaxSteppedOrdinals; ++k) {
    scaler.step(*optimizers[k]);
  }
  const torch::Tensor last_before = params.back().detach().clone();
  EXPECT_TRUE(ThrowsExactly<c10::Error>("at most 256 optimizers per iteration",
                                        [&] { scaler.step(*optimizers.back()); }));
  EXPECT_TRUE(torch::equal(params.back(), last_before));
  EXPECT_EQ(scaler.stage(*optimizers.back()), lucid::amp::OptimizerStage::kReady);
  scaler.update();
  EXPECT_EQ(scaler.counters().steps_taken, lucid::amp::detail::kMaxSteppedOrdinals);
}

TEST(FoundInf, IsTheOptimizersDeviceFlagBetweenItsCheckAndUpdate) {
  OneParam p;
  GradScaler scaler;
  EXPECT_TRUE(ThrowsError("no overflow check was recorded for this optimizer",
                          [&] { scaler.found_inf(p.optimizer); }));
  p.inf_grad();
  scaler.scale(torch::ones({1}));
  scaler.unscale_(p.optimizer);
  const torch::Tensor flag = scaler.found_inf(p.optimizer);
  EXPECT_EQ(flag.dim(), 0);
  EXPECT_EQ(flag.scalar_type(), torch::kFloat);
  EXPECT_NE(flag.item<float>(), 0.0f);
  scaler.step(p.optimizer);
  EXPECT_NE(scaler.found_inf(p.optimizer).item<float>(), 0.0f);
  scaler.update();
  EXPECT_EQ(flag.item<float>(), 0.0f) << "update() sets the flag back for the next iteration";
  EXPECT_TRUE(
      ThrowsError("update() starts a new iteration", [&] { scaler.found_inf(p.optimizer); }));
  p.clean_grad();
  scaler.scale(torch::ones({1}));
  scaler.step(p.optimizer);
  EXPECT_EQ(scaler.found_inf(p.optimizer).item<float>(), 0.0f);
}

TEST(LiveHyperParameters, SettersAndSetLrWriteTheCopiesAndACopyOfTheOptionsOwnsNone) {
  FusedSGDOptions options(0.1);
  options.momentum(0.9).weight_decay(1e-4);
  const torch::Tensor copy =
      options.live().on(torch::kCPU, options.lr(), options.weight_decay(), options.momentum());
  EXPECT_TRUE(torch::equal(copy, torch::tensor({0.1, 1e-4, 0.9}, torch::kDouble)));
  options.set_lr(0.05);  // what an LR scheduler calls
  options.weight_decay(0.0);
  options.momentum(0.5);
  EXPECT_TRUE(torch::equal(copy, torch::tensor({0.05, 0.0, 0.5}, torch::kDouble)));

  FusedSGDOptions other = options;  // e.g. a group's clone of the defaults
  other.lr(1.0);
  EXPECT_EQ(copy[0].item<double>(), 0.05) << "a copy of the options shares no device copy";
  const torch::Tensor other_copy =
      other.live().on(torch::kCPU, other.lr(), other.weight_decay(), other.momentum());
  EXPECT_EQ(other_copy[0].item<double>(), 1.0);
  EXPECT_FALSE(other_copy.is_same(copy));

  // An eager step rewrites a copy that differs from the values it is given.
  const torch::Tensor again = options.live().on(torch::kCPU, 0.2, 0.0, 0.5);
  EXPECT_TRUE(again.is_same(copy));
  EXPECT_EQ(copy[0].item<double>(), 0.2);
  EXPECT_THROW(options.live().write(3, 1.0), c10::IndexError);
}

TEST(LiveHyperParameters, AnLrSchedulerDrivesTheFusedOptimizersLikeTorchOptim) {
  torch::manual_seed(1);
  auto w = torch::randn({8}, torch::requires_grad());
  auto w_ref = w.detach().clone().requires_grad_(true);
  FusedSGD fused({w}, FusedSGDOptions(0.1).momentum(0.9));
  torch::optim::SGD ref({w_ref}, torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::StepLR fused_schedule(fused, /*step_size=*/3, /*gamma=*/0.5);
  torch::optim::StepLR ref_schedule(ref, /*step_size=*/3, /*gamma=*/0.5);
  for (int i = 0; i < 10; ++i) {
    for (auto& [param, optimizer] : std::vector<std::pair<torch::Tensor, torch::optim::Optimizer*>>{
             {w, &fused}, {w_ref, &ref}}) {
      optimizer->zero_grad();
      param.pow(2).sum().backward();
      optimizer->step();
    }
    fused_schedule.step();
    ref_schedule.step();
  }
  EXPECT_DOUBLE_EQ(fused.param_groups()[0].options().get_lr(),
                   ref.param_groups()[0].options().get_lr());
  EXPECT_TRUE(torch::allclose(w, w_ref, /*rtol=*/1e-6, /*atol=*/1e-7));
}

#ifdef LUCID_AMP_WITH_CUDA
class GraphModeCuda : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device visible";
    }
  }
  const torch::Device gpu{torch::kCUDA, 0};
};

using lucid_test::SyncsAreErrors;

TEST_F(GraphModeCuda, CountersAndStepSkippedEqualTheEagerRuns) {
  expect_graph_safe_counts_like_eager(gpu, /*adam=*/true);
  expect_graph_safe_counts_like_eager(gpu, /*adam=*/false);
}

// 100 replays of one captured training step, with overflows injected through the static
// input and a StepLR schedule that the host steps after each clean replay, equal an eager
// run whose scheduler steps only on clean steps: parameters, scale, learning rate,
// counters and step_skipped; a device-side count of clean steps built on found_inf()
// inside the graph agrees; nothing in the replay loop synchronises with the host.
void expect_captured_run_follows_schedule(const torch::Device& gpu, bool adam) {
  constexpr int kWarmup = 3;
  constexpr int kReplays = 100;
  Trainer eager(gpu, /*graph_safe=*/false, adam);
  Trainer graph(gpu, /*graph_safe=*/true, adam);
  torch::optim::StepLR eager_schedule(*eager.optimizer, /*step_size=*/10, /*gamma=*/0.7);
  torch::optim::StepLR graph_schedule(*graph.optimizer, /*step_size=*/10, /*gamma=*/0.7);
  const torch::Tensor clean_x = eager.x.clone();
  auto clean_steps = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(gpu));
  auto graph_iteration = [&] {
    zero_grads_in_place(*graph.model);
    graph.scaler->scale((graph.model->forward(graph.x) - graph.y).pow(2).mean()).backward();
    graph.scaler->step(*graph.optimizer);
    clean_steps.add_(graph.scaler->found_inf(*graph.optimizer).eq(0));
    graph.scaler->update();
  };

  // Warm-up, eagerly and alike in both runs (the graph run on a side stream, as capture
  // wants): state, scale and device copies are made here.
  auto side = c10::cuda::getStreamFromPool();
  for (int i = 0; i < kWarmup; ++i) {
    zero_grads_in_place(*eager.model);
    eager.scaler->scale((eager.model->forward(eager.x) - eager.y).pow(2).mean()).backward();
    eager.scaler->step(*eager.optimizer);
    eager.scaler->update();
    eager_schedule.step();
  }
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < kWarmup; ++i) {
      graph_iteration();
      graph_schedule.step();
    }
  }
  torch::cuda::synchronize();
  at::cuda::CUDAGraph captured;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    captured.capture_begin();
    graph_iteration();
    captured.capture_end();
  }
  torch::cuda::synchronize();

  int clean = kWarmup;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    SyncsAreErrors no_syncs;
    for (int i = 0; i < kReplays; ++i) {
      graph.x.copy_(overflows_at(i) ? graph.bad_x : clean_x);
      captured.replay();
      if (!overflows_at(i)) {
        graph_schedule.step();  // set_lr: the device copy is written on the stream
        ++clean;
      }
    }
  }
  for (int i = 0; i < kReplays; ++i) {
    eager.x.copy_(overflows_at(i) ? eager.bad_x : clean_x);
    zero_grads_in_place(*eager.model);
    eager.scaler->scale((eager.model->forward(eager.x) - eager.y).pow(2).mean()).backward();
    eager.scaler->step(*eager.optimizer);
    eager.scaler->update();
    if (!eager.scaler->step_skipped(*eager.optimizer)) {
      eager_schedule.step();
    }
  }
  torch::cuda::synchronize();

  const double eager_lr = eager.optimizer->param_groups()[0].options().get_lr();
  EXPECT_LT(eager_lr, 0.01) << "the schedule decayed the learning rate";
  EXPECT_DOUBLE_EQ(graph.optimizer->param_groups()[0].options().get_lr(), eager_lr);
  EXPECT_EQ(clean_steps.item<int64_t>(), clean);
  EXPECT_EQ(graph.scaler->get_scale(), eager.scaler->get_scale());
  EXPECT_TRUE(
      torch::allclose(graph.model->weight, eager.model->weight, /*rtol=*/1e-6, /*atol=*/1e-7))
      << (graph.model->weight - eager.model->weight).abs().max().item<float>();
  EXPECT_TRUE(torch::allclose(graph.model->bias, eager.model->bias, /*rtol=*/1e-6, /*atol=*/1e-7));
  EXPECT_EQ(graph.scaler->step_skipped(*graph.optimizer), overflows_at(kReplays - 1));
  // The eager run counts its warm-ups and replays; the graph run's host ran its warm-ups
  // and the capture, the device counted warm-ups and replays.
  EXPECT_TRUE(CountersAre(graph.scaler->counters(), eager.scaler->counters()));
}

TEST_F(GraphModeCuda, CapturedFusedAdamWFollowsAnLrScheduleOver100ReplaysWithOverflows) {
  expect_captured_run_follows_schedule(gpu, /*adam=*/true);
}

TEST_F(GraphModeCuda, CapturedFusedSgdFollowsAnLrScheduleOver100ReplaysWithOverflows) {
  expect_captured_run_follows_schedule(gpu, /*adam=*/false);
}

// An optimizer's last step counted by the update keeps its outcome at its place in the
// iteration until another optimizer's step takes that place; a captured step cannot copy
// it aside first (the copy would run at each replay, after the entry was overwritten), so
// that outcome is reported unknown rather than answered wrong.
TEST_F(GraphModeCuda, AnOutcomeWhosePlaceACapturedStepTookIsReportedUnknown) {
  torch::manual_seed(1);
  torch::nn::Linear a_model(8, 8), k_model(8, 8);
  a_model->to(gpu);
  k_model->to(gpu);
  FusedSGD a(a_model->parameters(), FusedSGDOptions(0.1));
  FusedSGD k(k_model->parameters(), FusedSGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().graph_safe(true));
  const torch::Tensor x = torch::randn({2, 8}, gpu);
  const auto iterate = [&](torch::nn::Linear& model, FusedSGD& optimizer) {
    optimizer.zero_grad();
    scaler.scale(model->forward(x).pow(2).mean()).backward();
    scaler.step(optimizer);
    scaler.update();
  };
  torch::cuda::synchronize();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    iterate(k_model, k);  // k at place 0
    iterate(a_model, a);  // a takes place 0 eagerly: k's outcome is copied aside
    EXPECT_FALSE(scaler.step_skipped(k));
    EXPECT_FALSE(scaler.step_skipped(a));
    at::cuda::CUDAGraph captured;
    captured.capture_begin();
    iterate(k_model, k);  // k takes place 0 back while capturing
    captured.capture_end();
    captured.replay();
    captured.replay();
  }
  torch::cuda::synchronize();
  EXPECT_FALSE(scaler.step_skipped(k));
  EXPECT_TRUE(ThrowsExactly<c10::Error>("is not known", [&] { scaler.step_skipped(a); }));
  iterate(a_model, a);  // a steps again: its outcome is known again
  EXPECT_FALSE(scaler.step_skipped(a));
}

// The overflow flags are made eagerly, 4 at first, and grow for an iteration with more
// optimizers; they cannot grow inside a capture (the copy of the old ones would replay
// from a store no update sets back), so a captured iteration with more optimizers than
// any before it is refused before anything is queued; after an eager iteration with all
// of them the same capture runs.
TEST_F(GraphModeCuda, ACaptureThatWouldGrowTheFlagsIsRefusedUntilAnEagerIterationGrewThem) {
  constexpr int kOptimizers = 5;
  torch::manual_seed(2);
  std::vector<torch::nn::Linear> models;
  std::vector<std::unique_ptr<FusedSGD>> optimizers;
  for (int j = 0; j < kOptimizers; ++j) {
    models.emplace_back(4, 4);
    models.back()->to(gpu);
    optimizers.push_back(
        std::make_unique<FusedSGD>(models.back()->parameters(), FusedSGDOptions(0.1)));
  }
  GradScaler scaler;
  const torch::Tensor x = torch::randn({2, 4}, gpu);
  const auto iterate = [&](int count) {
    for (int j = 0; j < count; ++j) {
      optimizers[j]->zero_grad();
      scaler.scale(models[j]->forward(x).sum()).backward();
      scaler.step(*optimizers[j]);
    }
    scaler.update();
  };
  torch::cuda::synchronize();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard on_side(side);
  // Every optimizer steps once eagerly (a fused optimizer's first step must), one per
  // iteration: the flags keep their 4 entries.
  for (int j = 0; j < kOptimizers; ++j) {
    optimizers[j]->zero_grad();
    scaler.scale(models[j]->forward(x).sum()).backward();
    scaler.step(*optimizers[j]);
    scaler.update();
  }
  {
    at::cuda::CUDAGraph captured;
    captured.capture_begin();
    const std::string message = message_of([&] { iterate(kOptimizers); });
    try {
      captured.capture_end();
    } catch (const c10::Error&) {
    }
    EXPECT_NE(message.find("cannot grow inside a capture"), std::string::npos) << message;
  }
  side.synchronize();
  scaler.update(scaler.get_scale());  // ends the refused iteration
  iterate(kOptimizers);               // grows the flags eagerly
  const auto before = models[4]->weight.detach().clone();
  at::cuda::CUDAGraph captured;
  captured.capture_begin();
  iterate(kOptimizers);
  captured.capture_end();
  captured.replay();
  side.synchronize();
  EXPECT_FALSE(torch::equal(models[4]->weight.detach(), before)) << "the replay stepped";
  EXPECT_FALSE(scaler.step_skipped(*optimizers[4]));
}

TEST_F(GraphModeCuda, AFirstStepInsideACaptureIsRefused) {
  torch::nn::Linear model(8, 8);
  model->to(gpu);
  FusedAdamW optimizer(model->parameters(), FusedAdamWOptions(1e-3));
  model->forward(torch::randn({2, 8}, gpu)).sum().backward();
  torch::cuda::synchronize();
  auto side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(side);
  at::cuda::CUDAGraph captured;
  captured.capture_begin();
  const std::string message = message_of([&] { optimizer.step(); });
  // End the capture whatever happened, so that the process stays usable.
  try {
    captured.capture_end();
  } catch (const c10::Error&) {
  }
  EXPECT_NE(message.find("Run at least one step before capturing"), std::string::npos) << message;
}
#endif

}  // namespace
