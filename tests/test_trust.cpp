// SPDX-License-Identifier: BSD-3-Clause
// Trust under faults: the scale never dies, overflow streaks are never silent, hysteresis
// follows Megatron-LM and DeepSpeed, and nothing grows without evidence. The schedule is
// checked against reference models written from those projects' published rules.

#include "support/backend_fixture.h"
#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"
#include "support/warning_collector.h"

#include <cfloat>
#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>

namespace {

using namespace lucid_test;
using lucid::amp::HysteresisRefill;
using lucid::amp::MinScalePolicy;
using lucid::amp::OptimizerView;

// ---------------------------------------------------------------------------------------
// Backends: the CPU kernel, the generic ATen-ops path, and CUDA where there is a GPU.

class TrustBackends : public BackendTest {};

LUCID_TEST_INSTANTIATE_BACKENDS(TrustBackends);

// One parameter seen through an OptimizerView: the cheapest optimizer the scaler takes.
struct ViewParam {
  explicit ViewParam(torch::Device device)
      : param(torch::ones({4}, torch::TensorOptions().device(device))),
        clean(torch::full({4}, 8.0f, param.options())),
        bad(clean.clone()) {
    bad[0] = kFInf;
  }
  OptimizerView view() {
    OptimizerView v;
    v.key = this;
    v.param_groups.emplace_back(&param, 1);
    v.step = [this] { ++steps; };
    return v;
  }
  void grad_for(bool overflow) { param.mutable_grad() = (overflow ? bad : clean).clone(); }
  // One iteration: scale(), a gradient with or without an inf, step, update. Returns
  // whether the step ran.
  bool iterate(GradScaler& scaler, bool overflow) {
    scale_loss(scaler, param.device());
    grad_for(overflow);
    const bool ran = scaler.step(view());
    scaler.update();
    return ran;
  }
  torch::Tensor param, clean, bad;
  int steps = 0;
};

// ---------------------------------------------------------------------------------------
// The floor: no silent scale death.

TEST_P(TrustBackends, ThreeHundredNaNUpdatesThenCleanBatchesRecover) {
  GradScaler scaler(GradScalerOptions().growth_interval(10).overflow_warning_streak(0));
  ViewParam p(device());
  scaler.scale(torch::ones({}, torch::TensorOptions().device(device())));
  for (int i = 0; i < 300; ++i) {
    EXPECT_FALSE(p.iterate(scaler, /*overflow=*/true));
  }
  // 65536 * 0.5^k reaches float32's smallest normal value and stops there (PyTorch's
  // schedule would be exactly 0 after 166 backoffs).
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(FLT_MIN));
  EXPECT_EQ(scaler.counters().overflow_streak, 300);
  // Clean batches (gradients of the scaled loss: the scale times a true gradient of 0.5)
  // step again at once, and the scale grows back by the schedule.
  for (int i = 0; i < 40; ++i) {
    p.param.mutable_grad() = torch::full({4}, scaler.get_scale() * 0.5, p.param.options());
    EXPECT_TRUE(scaler.step(p.view())) << "clean iteration " << i;
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(FLT_MIN) * 16.0);
  EXPECT_EQ(scaler.counters().growths, 4);
  EXPECT_EQ(p.steps, 40);
}

TEST(TrustFloor, DefaultScheduleEqualsPyTorchsUntilTheFloor) {
  // Above the floor the rule is PyTorch's: each backoff exactly halves.
  GradScaler scaler(GradScalerOptions().overflow_warning_streak(0));
  ViewParam p(torch::kCPU);
  scaler.scale(torch::ones({}));
  float expected = 65536.0f;
  for (int i = 0; i < 200; ++i) {
    p.iterate(scaler, true);
    expected = std::max(static_cast<float>(expected * 0.5), FLT_MIN);
    ASSERT_EQ(scaler.get_scale(), static_cast<double>(expected)) << "backoff " << i + 1;
  }
}

// ---------------------------------------------------------------------------------------
// Overflow streaks are never silent.

TEST_P(TrustBackends, StreakWarningComesOncePerStreak) {
  GradScaler scaler(GradScalerOptions().overflow_warning_streak(5));
  ViewParam p(device());
  lucid_test::ScopedWarningCollector warnings;
  for (int i = 0; i < 12; ++i) {
    p.iterate(scaler, true);
  }
  ASSERT_EQ(warnings.messages.size(), 1u);
  EXPECT_NE(warnings.messages[0].find("5 consecutive updates saw inf/NaN"), std::string::npos)
      << warnings.messages[0];
  EXPECT_NE(warnings.messages[0].find("param group 0 index 0"), std::string::npos)
      << "the warning carries the overflow report: " << warnings.messages[0];
  p.iterate(scaler, false);  // the streak ends
  for (int i = 0; i < 5; ++i) {
    p.iterate(scaler, true);
  }
  EXPECT_EQ(warnings.messages.size(), 2u) << "a new streak warns again";
}

TEST(TrustStreak, WarningCanBeSilenced) {
  for (const int64_t threshold : {int64_t{0}, int64_t{1000}}) {
    GradScaler scaler(GradScalerOptions().overflow_warning_streak(threshold));
    ViewParam p(torch::kCPU);
    lucid_test::ScopedWarningCollector warnings;
    for (int i = 0; i < 150; ++i) {
      p.iterate(scaler, true);
    }
    EXPECT_TRUE(warnings.messages.empty()) << threshold;
  }
}

TEST(TrustStreak, DefaultWarningComesAfterOneHundredSkippedUpdates) {
  GradScaler scaler;
  ViewParam p(torch::kCPU);
  lucid_test::ScopedWarningCollector warnings;
  for (int i = 0; i < 99; ++i) {
    p.iterate(scaler, true);
  }
  EXPECT_TRUE(warnings.messages.empty());
  p.iterate(scaler, true);
  EXPECT_EQ(warnings.messages.size(), 1u);
}

TEST_P(TrustBackends, MaxOverflowStreakThrowsAtExactlyNAndAppliesNothing) {
  GradScaler scaler(GradScalerOptions().max_overflow_streak(3).overflow_warning_streak(0));
  ViewParam p(device());
  p.iterate(scaler, true);
  p.iterate(scaler, true);
  p.grad_for(true);
  scaler.step(p.view());
  const Observed before = Observed::of(scaler);
  EXPECT_TRUE(ThrowsError("3 consecutive updates saw inf/NaN", [&] { scaler.update(); }));
  EXPECT_EQ(Observed::of(scaler), before) << Observed::of(scaler).str() << " vs " << before.str();
  EXPECT_EQ(scaler.stage(&p), OptimizerStage::kStepped) << "stages as before the call";
  // A clean iteration ends the streak; the guard then counts afresh.
  scaler.update(scaler.get_scale());
  p.iterate(scaler, false);
  p.iterate(scaler, true);
  p.iterate(scaler, true);
  EXPECT_EQ(scaler.counters().overflow_streak, 2);
}

// ---------------------------------------------------------------------------------------
// min_scale: throw (today's guard) or clamp.

TEST_P(TrustBackends, ClampHoldsAtMinScaleKeepsSkippingAndCounts) {
  GradScaler scaler(GradScalerOptions()
                        .init_scale(16)
                        .min_scale(4)
                        .min_scale_policy(MinScalePolicy::kClamp)
                        .overflow_warning_streak(0));
  ViewParam p(device());
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(p.iterate(scaler, true));
  }
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.counters().backoffs, 5);
  EXPECT_EQ(scaler.counters().min_scale_holds, 3);  // 16 -> 8 -> 4, then held three times
  EXPECT_TRUE(p.iterate(scaler, false));
}

TEST_P(TrustBackends, ClampHoldsAtMinScaleBetweenTwoPowers) {
  GradScaler scaler(GradScalerOptions()
                        .init_scale(12)
                        .min_scale(5)
                        .min_scale_policy(MinScalePolicy::kClamp));
  ViewParam p(device());
  p.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 6.0);
  p.iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 5.0) << "held at min_scale, not left at 6 nor taken to 3";
}

TEST_P(TrustBackends, ThrowPolicyRefusesTheBackoffAndAppliesNothing) {
  GradScaler scaler(GradScalerOptions().init_scale(8).min_scale(4));
  EXPECT_EQ(scaler.options().min_scale_policy(), MinScalePolicy::kThrow);
  ViewParam p(device());
  p.iterate(scaler, true);
  p.grad_for(true);
  scaler.step(p.view());
  const Observed before = Observed::of(scaler);
  EXPECT_TRUE(ThrowsError("below min_scale", [&] { scaler.update(); }));
  EXPECT_EQ(Observed::of(scaler), before);
}

// ---------------------------------------------------------------------------------------
// No growth without evidence.

TEST_P(TrustBackends, IterationsWithoutGradientsLeaveTheScaleAndAreCounted) {
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(1));
  ViewParam p(device());
  scaler.scale(torch::ones({}, torch::TensorOptions().device(device())));
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(scaler.step(p.view())) << "an optimizer without gradients still steps";
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  EXPECT_EQ(scaler.counters().updates_without_checks, 5);
  EXPECT_EQ(scaler.counters().steps_without_gradients, 5);
  EXPECT_EQ(scaler.counters().growths, 0);
  EXPECT_EQ(p.steps, 5);
  p.iterate(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 2048.0) << "a checked clean iteration grows as before";
}

TEST_P(TrustBackends, StrictModeRaisesPyTorchsErrorsAndChangesNothing) {
  GradScaler scaler(GradScalerOptions().strict_inf_checks(true));
  ViewParam p(device());
  scaler.scale(torch::ones({}, torch::TensorOptions().device(device())));
  const Observed before = Observed::of(scaler);
  EXPECT_TRUE(ThrowsError("No inf checks were recorded for this optimizer",
                          [&] { scaler.step(p.view()); }));
  EXPECT_EQ(p.steps, 0);
  EXPECT_EQ(scaler.stage(&p), OptimizerStage::kReady);
  EXPECT_TRUE(ThrowsError("No inf checks were recorded prior to update", [&] { scaler.update(); }));
  EXPECT_EQ(Observed::of(scaler), before);
  // unscale_ of an optimizer without gradients is allowed; its step is not.
  scaler.unscale_(p.view());
  EXPECT_TRUE(ThrowsError("No inf checks were recorded for this optimizer",
                          [&] { scaler.step(p.view()); }));
  EXPECT_EQ(scaler.stage(&p), OptimizerStage::kUnscaled);
  // With a gradient everything works as usual.
  scaler.update(scaler.get_scale());
  EXPECT_TRUE(p.iterate(scaler, false));
}

// ---------------------------------------------------------------------------------------
// The float16 error names the parameter.

TEST(TrustFloat16, ErrorNamesTheRegisteredParameter) {
  torch::nn::Linear model(2, 1);
  model->to(torch::kHalf);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  scale_loss(scaler);
  scaler.set_parameter_names(model->named_parameters(), "head.");
  for (auto& param : model->parameters()) {
    param.mutable_grad() = torch::ones_like(param);
  }
  EXPECT_TRUE(ThrowsValueError("parameter 0 'head.weight' of param group 0",
                               [&] { scaler.unscale_(optimizer); }));
  EXPECT_EQ(scaler.stage(optimizer), OptimizerStage::kReady);
}

// ---------------------------------------------------------------------------------------
// The schedule against Megatron-LM's DynamicGradScaler and DeepSpeed's DynamicLossScaler,
// each written from its published update rule. Scales are powers of two so that each
// project's own arithmetic (float32 tensors, Python floats) gives the same values.

struct ReferenceStep {
  bool raised = false;     // the reference raised (DeepSpeed at its minimum)
  double scale = 0.0;
  int64_t growth_tracker = 0;
  int64_t hysteresis_left = 0;  // overflows the count can still absorb + 1 (>= 1)
};

// Megatron-LM DynamicGradScaler.update(found_inf).
struct MegatronModel {
  double scale, min_scale, growth_factor, backoff_factor;
  int64_t growth_interval, hysteresis;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker;
  MegatronModel(double init, double min, double growth, double backoff, int64_t interval,
                int64_t hyst)
      : scale(init), min_scale(min), growth_factor(growth), backoff_factor(backoff),
        growth_interval(interval), hysteresis(hyst), hysteresis_tracker(hyst) {}
  ReferenceStep update(bool found_inf) {
    if (found_inf) {
      growth_tracker = 0;
      hysteresis_tracker -= 1;
      if (hysteresis_tracker <= 0) {
        scale = std::max(scale * backoff_factor, min_scale);
      }
    } else {
      growth_tracker += 1;
      if (growth_tracker == growth_interval) {
        growth_tracker = 0;
        hysteresis_tracker = hysteresis;
        scale = scale * growth_factor;
      }
    }
    return {false, scale, growth_tracker, std::max<int64_t>(hysteresis_tracker, 1)};
  }
};

// DeepSpeed DynamicLossScaler.update_scale(overflow).
struct DeepSpeedModel {
  double cur_scale, min_scale, scale_factor;
  int64_t scale_window, delayed_shift, cur_hysteresis;
  bool consecutive_hysteresis, raise_error_at_min_scale;
  int64_t cur_iter = 0, last_overflow_iter = -1;
  ReferenceStep update(bool overflow) {
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale && raise_error_at_min_scale) {
          return {true, cur_scale, 0, cur_hysteresis};
        }
        cur_scale = std::max(cur_scale / scale_factor, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive_hysteresis) {
        cur_hysteresis = delayed_shift;
      }
      if ((cur_iter - last_overflow_iter) % scale_window == 0) {
        if (!consecutive_hysteresis) {
          cur_hysteresis = delayed_shift;
        }
        cur_scale *= scale_factor;
      }
    }
    cur_iter += 1;
    // DeepSpeed keeps no growth tracker: it is the clean iterations since the last
    // overflow or growth, modulo the window.
    return {false, cur_scale, (cur_iter - 1 - last_overflow_iter) % scale_window,
            cur_hysteresis};
  }
};

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

// Runs `sequences` random sequences of overflows through a scaler and a reference made by
// `make(rng, options&)`, comparing every update.
template <typename Make>
void run_against_reference(torch::Device device, uint64_t seed, Make make) {
  const int64_t sequences = env_int("LUCID_TRUST_SEQUENCES", 10000);
  std::mt19937_64 rng(seed);
  ViewParam p(device);
  for (int64_t n = 0; n < sequences; ++n) {
    GradScalerOptions options;
    auto reference = make(rng, options);
    options.overflow_warning_streak(0);
    GradScaler scaler(options);
    scale_loss(scaler, device);
    const int length = 5 + static_cast<int>(rng() % 25);
    const int overflow_percent = 20 + static_cast<int>(rng() % 60);
    for (int i = 0; i < length; ++i) {
      const bool found = static_cast<int>(rng() % 100) < overflow_percent;
      const ReferenceStep want = reference.update(found);
      p.grad_for(found);
      const bool ran = scaler.step(p.view());
      ASSERT_EQ(ran, !found) << "sequence " << n << " update " << i;
      if (want.raised) {
        ASSERT_TRUE(ThrowsError("below min_scale", [&] { scaler.update(); }))
            << "sequence " << n << " update " << i;
        break;  // the reference stops the run here
      }
      scaler.update();
      const auto state = scaler.state_dict();
      ASSERT_EQ(state.at("scale"), want.scale) << "sequence " << n << " update " << i;
      ASSERT_EQ(state.at("growth_tracker"), static_cast<double>(want.growth_tracker))
          << "sequence " << n << " update " << i;
      const double absorbed = state.count("overflow_tracker") ? state.at("overflow_tracker") : 0.0;
      const int64_t hysteresis = options.hysteresis();
      ASSERT_EQ(hysteresis - static_cast<int64_t>(absorbed), want.hysteresis_left)
          << "sequence " << n << " update " << i;
    }
  }
}

TEST_P(TrustBackends, ScheduleMatchesMegatronDynamicGradScaler) {
  run_against_reference(device(), 7, [](std::mt19937_64& rng, GradScalerOptions& o) {
    const double min_scale = std::ldexp(1.0, static_cast<int>(rng() % 6));
    const double init = min_scale * std::ldexp(1.0, static_cast<int>(rng() % 6));
    const double growth = rng() % 2 ? 2.0 : 4.0;
    const double backoff = rng() % 2 ? 0.5 : 0.25;
    const int64_t interval = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t hysteresis = 1 + static_cast<int64_t>(rng() % 4);
    o.init_scale(init)
        .min_scale(min_scale)
        .min_scale_policy(MinScalePolicy::kClamp)
        .growth_factor(growth)
        .backoff_factor(backoff)
        .growth_interval(interval)
        .hysteresis(hysteresis)
        .hysteresis_refill(HysteresisRefill::kOnGrowth);
    return MegatronModel(init, min_scale, growth, backoff, interval, hysteresis);
  });
}

TEST_P(TrustBackends, ScheduleMatchesDeepSpeedDynamicLossScaler) {
  run_against_reference(device(), 8, [](std::mt19937_64& rng, GradScalerOptions& o) {
    DeepSpeedModel m;
    m.min_scale = std::ldexp(1.0, static_cast<int>(rng() % 6));
    m.cur_scale = m.min_scale * std::ldexp(1.0, static_cast<int>(rng() % 6));
    m.scale_factor = 2.0;
    m.scale_window = 1 + static_cast<int64_t>(rng() % 5);
    m.delayed_shift = 1 + static_cast<int64_t>(rng() % 4);
    m.cur_hysteresis = m.delayed_shift;
    m.consecutive_hysteresis = rng() % 2 == 0;
    m.raise_error_at_min_scale = rng() % 2 == 0;
    o.init_scale(m.cur_scale)
        .min_scale(m.min_scale)
        .min_scale_policy(m.raise_error_at_min_scale ? MinScalePolicy::kThrow
                                                     : MinScalePolicy::kClamp)
        .growth_factor(m.scale_factor)
        .backoff_factor(1.0 / m.scale_factor)
        .growth_interval(m.scale_window)
        .hysteresis(m.delayed_shift)
        .hysteresis_refill(m.consecutive_hysteresis ? HysteresisRefill::kOnCleanUpdate
                                                    : HysteresisRefill::kOnGrowth);
    return m;
  });
}

}  // namespace
