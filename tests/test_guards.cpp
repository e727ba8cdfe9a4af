// SPDX-License-Identifier: BSD-3-Clause
// Guards (all off by default): min_scale, max_scale, hysteresis; their validation, their
// schedule on every backend, and that the defaults change nothing.

#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"
#include "amp/cpu/amp_kernels.h"
#include "amp/backend.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

using namespace lucid_test;

// ---------------------------------------------------------------------------------------
// Options.

TEST(GuardOptions, DefaultsAreOff) {
  const GradScalerOptions o;
  EXPECT_EQ(o.min_scale(), 0.0);
  EXPECT_EQ(o.max_scale(), kInf);
  EXPECT_EQ(o.hysteresis(), 1);
}

TEST(GuardOptions, AreChainable) {
  const auto o = GradScalerOptions().min_scale(1.0).max_scale(1e6).hysteresis(3);
  EXPECT_EQ(o.min_scale(), 1.0);
  EXPECT_EQ(o.max_scale(), 1e6);
  EXPECT_EQ(o.hysteresis(), 3);
}

TEST(GuardOptions, MinScaleMustBeFiniteAndNonNegative) {
  for (const double bad : {-1.0, -1e-30, kInf, -kInf, kNaN}) {
    EXPECT_TRUE(ThrowsValueError("min_scale", [&] { GradScaler(GradScalerOptions().min_scale(bad)); }))
        << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().min_scale(0.0)));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().min_scale(1e-30)));
}

TEST(GuardOptions, MaxScaleMustBePositiveAndFitFloat32OrBeInfinite) {
  for (const double bad : {0.0, -0.0, -1.0, -kInf, kNaN, 1e39, 1e300, 1e-50}) {
    EXPECT_TRUE(ThrowsValueError("max_scale", [&] { GradScaler(GradScalerOptions().max_scale(bad)); }))
        << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().max_scale(kInf)));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().max_scale(FLT_MAX)));
}

TEST(GuardOptions, HysteresisMustBeInInt32Range) {
  for (const int64_t bad : {int64_t{0}, int64_t{-1}, int64_t{1} << 31,
                            std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
    EXPECT_TRUE(ThrowsValueError("hysteresis must be in [1, 2147483647] (1 turns it off)", [&] {
      GradScaler(GradScalerOptions().hysteresis(bad));
    })) << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().hysteresis(2147483647)));
  // The growth interval is no guard: nothing turns it off.
  EXPECT_TRUE(ThrowsValueError("growth_interval must be in [1, 2147483647], got 0",
                               [] { GradScaler(GradScalerOptions().growth_interval(0)); }));
}

TEST(GuardOptions, MinAboveMaxIsRefused) {
  EXPECT_TRUE(ThrowsValueError("above max_scale", [] {
    GradScaler(GradScalerOptions().init_scale(10).min_scale(100).max_scale(50));
  }));
}

TEST(GuardOptions, InitScaleMustLieBetweenTheGuards) {
  EXPECT_TRUE(ThrowsValueError("init_scale", [] {
    GradScaler(GradScalerOptions().init_scale(4.0).min_scale(8.0));
  }));
  EXPECT_TRUE(ThrowsValueError("init_scale", [] {
    GradScaler(GradScalerOptions().init_scale(65536.0).max_scale(1024.0));
  }));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().init_scale(8.0).min_scale(8.0).max_scale(8.0)));
}

TEST(GuardOptions, DisabledScalerStillValidatesGuards) {
  EXPECT_TRUE(ThrowsValueError("hysteresis", [] {
    GradScaler(GradScalerOptions().enabled(false).hysteresis(0));
  }));
}

// ---------------------------------------------------------------------------------------
// Defaults change nothing: the same random run with guards explicitly off.

TEST(GuardDefaults, GuardsOffFollowPyTorchsScheduleExactly) {
  for (const bool generic : {false, true}) {
    std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force;
    if (generic) {
      force = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
    GradScaler plain(GradScalerOptions().init_scale(1024).growth_interval(3));
    GradScaler off(
        GradScalerOptions().init_scale(1024).growth_interval(3).min_scale(0).max_scale(kInf).hysteresis(1));
    OneParam a, b;
    std::mt19937 rng(7);
    for (int i = 0; i < 200; ++i) {
      const bool overflow = rng() % 4 == 0;
      iterate(plain, a, overflow);
      iterate(off, b, overflow);
      ASSERT_EQ(plain.state_dict(), off.state_dict()) << "iteration " << i;
    }
    EXPECT_EQ(plain.state_dict().size(), 5u);
    EXPECT_TRUE(torch::equal(a.param, b.param));
  }
}

// ---------------------------------------------------------------------------------------
// max_scale.

class GuardBackends : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      force_ = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
  }
  std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force_;
};

INSTANTIATE_TEST_SUITE_P(, GuardBackends, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Generic" : "Routed"; });

TEST_P(GuardBackends, MaxScaleCapsGrowth) {
  GradScaler scaler(GradScalerOptions().init_scale(256).growth_interval(1).max_scale(1000));
  scaler.scale(torch::ones({}));  // the tensors exist: the device path
  OneParam p;
  const std::vector<double> want = {512, 1000, 1000, 1000};
  for (double w : want) {
    iterate(scaler, p, false);
    EXPECT_EQ(scaler.get_scale(), w);
  }
  EXPECT_EQ(scaler.counters().growths, 4);  // reaching the interval counts, capped or not
  iterate(scaler, p, true);
  EXPECT_EQ(scaler.get_scale(), 500.0);
  iterate(scaler, p, false);
  EXPECT_EQ(scaler.get_scale(), 1000.0);
}

TEST(GuardMaxScale, UpdatesWithoutChecksNeitherGrowNorCap) {
  GradScaler scaler(GradScalerOptions().init_scale(256).growth_interval(1).max_scale(300));
  scale_loss(scaler);
  scaler.update();
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 256.0);
  EXPECT_EQ(scaler.counters().updates_without_checks, 2);
}

TEST(GuardMaxScale, AtFloat32MaxTheScaleStays) {
  GradScaler scaler(GradScalerOptions().init_scale(FLT_MAX / 1.5).growth_interval(1).max_scale(FLT_MAX));
  scaler.scale(torch::ones({}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(FLT_MAX / 1.5f));  // PyTorch's rule: kept
}

TEST(GuardMaxScale, ExplicitScalesAboveItAreRefused) {
  GradScaler scaler(GradScalerOptions().init_scale(256).max_scale(1000));
  scale_loss(scaler);
  EXPECT_TRUE(ThrowsValueError("max_scale", [&] { scaler.update(2000.0); }));
  EXPECT_EQ(scaler.get_scale(), 256.0);
  auto state = scaler.state_dict();
  EXPECT_EQ(state.at("max_scale"), 1000.0);
  state["scale"] = 4096;
  EXPECT_TRUE(ThrowsValueError("max_scale", [&] { scaler.load_state_dict(state); }));
  EXPECT_EQ(scaler.get_scale(), 256.0);
}

// ---------------------------------------------------------------------------------------
// Hysteresis.

TEST_P(GuardBackends, ConsecutiveHysteresisBacksOffOnlyAfterNConsecutiveOverflows) {
  // HysteresisRefill::kOnCleanUpdate (DeepSpeed's consecutive_hysteresis=True).
  GradScaler scaler(GradScalerOptions()
                        .init_scale(1024)
                        .growth_interval(2)
                        .hysteresis(3)
                        .hysteresis_refill(lucid::amp::HysteresisRefill::kOnCleanUpdate));
  scaler.scale(torch::ones({}));
  OneParam p;
  const auto run = [&](bool overflow) {
    p.grad_for(overflow);
    const bool stepped = scaler.step(p.optimizer).has_value();
    EXPECT_EQ(stepped, !overflow) << "an overflowing step is skipped whatever the hysteresis";
    scaler.update();
    return scaler.get_scale();
  };
  EXPECT_EQ(run(true), 1024.0);  // absorbed (1 of 3)
  EXPECT_EQ(scaler.state_dict().at("overflow_tracker"), 1.0);
  EXPECT_EQ(run(true), 1024.0);  // absorbed (2 of 3)
  EXPECT_EQ(run(true), 512.0);   // third consecutive: back off
  EXPECT_EQ(run(true), 256.0);   // and each further consecutive one
  EXPECT_EQ(run(false), 256.0);  // clean: the count starts again
  EXPECT_EQ(scaler.state_dict().at("overflow_tracker"), 0.0);
  EXPECT_EQ(run(true), 256.0);   // absorbed, and the growth tracker was reset
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  EXPECT_EQ(run(false), 256.0);
  EXPECT_EQ(run(false), 512.0);  // two clean updates: growth
  // Every counter: eight step + update iterations, the last one clean.
  EXPECT_TRUE(CountersAre(scaler.counters(), {/*taken*/ 3, /*skipped*/ 5, /*updates*/ 8,
                                              /*overflow_updates*/ 5, /*backoffs*/ 2,
                                              /*growths*/ 1, /*overflow_streak*/ 0}));
}

TEST_P(GuardBackends, HysteresisIsRefilledOnlyByGrowthByDefault) {
  // HysteresisRefill::kOnGrowth (Megatron-LM, DeepSpeed's default): overflows separated by
  // clean updates use the count up too.
  GradScaler scaler(GradScalerOptions().init_scale(1024).growth_interval(3).hysteresis(2));
  EXPECT_EQ(scaler.options().hysteresis_refill(), lucid::amp::HysteresisRefill::kOnGrowth);
  scaler.scale(torch::ones({}));
  OneParam p;
  const auto run = [&](bool overflow) {
    p.grad_for(overflow);
    scaler.step(p.optimizer);
    scaler.update();
    return scaler.get_scale();
  };
  EXPECT_EQ(run(true), 1024.0);   // absorbed (1 of 2)
  EXPECT_EQ(run(false), 1024.0);  // clean, but no growth: the count stays used
  EXPECT_EQ(scaler.state_dict().at("overflow_tracker"), 1.0);
  EXPECT_EQ(run(true), 512.0);    // the count is used up: back off
  EXPECT_EQ(run(false), 512.0);
  EXPECT_EQ(run(false), 512.0);
  EXPECT_EQ(run(false), 1024.0);  // three clean updates: growth refills the count
  EXPECT_EQ(scaler.state_dict().at("overflow_tracker"), 0.0);
  EXPECT_EQ(run(true), 1024.0);   // absorbed again
}

TEST_P(GuardBackends, AlternatingOverflowsBackOffFourTimesInFiveOnlyUnderRefillOnGrowth) {
  // hysteresis 2, five overflows each followed by a clean update (growth interval far).
  for (const auto refill :
       {lucid::amp::HysteresisRefill::kOnGrowth, lucid::amp::HysteresisRefill::kOnCleanUpdate}) {
    GradScaler scaler(
        GradScalerOptions().init_scale(1 << 20).growth_interval(100).hysteresis(2).hysteresis_refill(refill));
    scaler.scale(torch::ones({}));
    OneParam p;
    for (int i = 0; i < 5; ++i) {
      for (const bool overflow : {true, false}) {
        p.grad_for(overflow);
        scaler.step(p.optimizer);
        scaler.update();
      }
    }
    const bool on_growth = refill == lucid::amp::HysteresisRefill::kOnGrowth;
    EXPECT_EQ(scaler.counters().backoffs, on_growth ? 4 : 0);
    EXPECT_EQ(scaler.get_scale(), on_growth ? (1 << 16) : (1 << 20));
  }
}

TEST(GuardHysteresis, StateDictCarriesTheOverflowTrackerAndRoundTrips) {
  GradScaler a(GradScalerOptions().init_scale(64).hysteresis(4));
  OneParam p;
  iterate(a, p, true);
  iterate(a, p, true);
  const auto state = a.state_dict();
  EXPECT_EQ(state.at("hysteresis"), 4.0);
  EXPECT_EQ(state.at("overflow_tracker"), 2.0);
  GradScaler b;  // defaults: no hysteresis until loaded
  b.scale(torch::ones({}));
  b.load_state_dict(state);
  EXPECT_EQ(b.options().hysteresis(), 4);
  EXPECT_EQ(b.state_dict(), state);
  OneParam q;
  iterate(a, p, true);  // 3rd: absorbed
  iterate(b, q, true);
  EXPECT_EQ(b.state_dict(), a.state_dict());
  iterate(a, p, true);  // 4th: back off
  iterate(b, q, true);
  EXPECT_EQ(a.get_scale(), 32.0);
  EXPECT_EQ(b.state_dict(), a.state_dict());
}

TEST(GuardHysteresis, APyTorchMapKeepsTheScalersOwnGuards) {
  GradScaler scaler(GradScalerOptions().hysteresis(2).min_scale(1.0).max_scale(1e6));
  scaler.load_state_dict({{"scale", 4096.0},
                          {"growth_factor", 2.0},
                          {"backoff_factor", 0.5},
                          {"growth_interval", 100.0},
                          {"_growth_tracker", 7.0}});
  EXPECT_EQ(scaler.options().hysteresis(), 2);
  EXPECT_EQ(scaler.options().min_scale(), 1.0);
  EXPECT_EQ(scaler.options().max_scale(), 1e6);
  EXPECT_EQ(scaler.state_dict().at("overflow_tracker"), 0.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 7.0);
}

TEST(GuardHysteresis, InvalidGuardValuesInAMapAreRefusedAndChangeNothing) {
  struct Case {
    const char* key;
    double value;
  };
  const std::vector<Case> cases = {
      {"min_scale", kNaN},       {"min_scale", -1.0},        {"min_scale", kInf},
      {"min_scale", 1e9},        {"max_scale", kNaN},        {"max_scale", 0.0},
      {"max_scale", -5.0},       {"max_scale", 1e40},        {"max_scale", 16.0},
      {"hysteresis", 0.0},       {"hysteresis", 1.5},        {"hysteresis", kNaN},
      {"hysteresis", 3e9},       {"overflow_tracker", 3.0},  {"overflow_tracker", -1.0},
      {"overflow_tracker", 0.5}, {"overflow_tracker", kInf},
  };
  for (const bool with_tensors : {false, true}) {
    for (const Case& c : cases) {
      GradScaler scaler(GradScalerOptions().init_scale(1024).hysteresis(3).growth_interval(5));
      if (with_tensors) {
        scaler.scale(torch::ones({}));
      }
      OneParam p;
      iterate(scaler, p, true);  // overflow_tracker 1
      const Observed before = Observed::of(scaler);
      auto map = scaler.state_dict();
      map["scale"] = 512.0;
      map[c.key] = c.value;
      EXPECT_TRUE(ThrowsValueError(std::string(c.key).substr(0, 8), [&] { scaler.load_state_dict(map); }))
          << c.key << " = " << c.value;
      EXPECT_EQ(Observed::of(scaler), before) << c.key << " = " << c.value;
    }
  }
}

// ---------------------------------------------------------------------------------------
// min_scale: divergence is an error, not an endless loop of skipped steps.

TEST_P(GuardBackends, FallingBelowMinScaleThrowsAndChangesNothing) {
  GradScaler scaler(GradScalerOptions().init_scale(4).min_scale(1));
  torch::nn::Linear model(3, 1);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  scaler.set_parameter_names(model->named_parameters(), "model.");
  scaler.scale(torch::ones({}));
  const auto overflow_step = [&] {
    model->weight.mutable_grad() = torch::full({1, 3}, std::numeric_limits<float>::quiet_NaN());
    model->bias.mutable_grad() = torch::ones({1});
    EXPECT_FALSE(scaler.step(opt).has_value());
  };
  overflow_step();
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 2.0);
  overflow_step();
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);  // == min_scale: allowed
  overflow_step();
  const Observed before = Observed::of(scaler);
  const auto err = ThrowsError("the loss is diverging", [&] { scaler.update(); });
  EXPECT_TRUE(err);
  EXPECT_EQ(Observed::of(scaler), before);
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kStepped) << "a refused update keeps the stages";
  // The message says what happened and which tensor.
  try {
    scaler.update();
    ADD_FAILURE() << "no throw";
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    EXPECT_NE(msg.find("below min_scale 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 consecutive"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'model.weight'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("3 NaN"), std::string::npos) << msg;
  }
  ASSERT_TRUE(scaler.last_overflow().has_value());
  EXPECT_EQ(scaler.last_overflow()->gradients.at(0).name, "model.weight");
  // The loop can recover by setting a scale.
  scaler.update(8.0);
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
}

TEST(GuardMinScale, AnUnscaleOnlyOptimizerIsReadByUpdate) {
  GradScaler scaler(GradScalerOptions().init_scale(2).min_scale(2));
  scale_loss(scaler);
  OneParam p;
  p.inf_grad();
  scaler.unscale_(p.optimizer);  // never stepped: update() must read its flag itself
  EXPECT_TRUE(ThrowsError("diverging", [&] { scaler.update(); }));
  EXPECT_EQ(scaler.get_scale(), 2.0);
  EXPECT_EQ(scaler.counters().overflow_updates, 0);
}

TEST(GuardMinScale, CleanUpdatesAndGrowthNeverThrow) {
  GradScaler scaler(GradScalerOptions().init_scale(2).min_scale(2).growth_interval(1));
  OneParam p;
  for (int i = 0; i < 5; ++i) {
    iterate(scaler, p, false);
  }
  EXPECT_EQ(scaler.get_scale(), 64.0);
}

TEST(GuardMinScale, HysteresisAbsorbsBeforeTheCheck) {
  GradScaler scaler(GradScalerOptions().init_scale(2).min_scale(2).hysteresis(2));
  OneParam p;
  iterate(scaler, p, true);  // absorbed: no backoff, no error
  EXPECT_EQ(scaler.get_scale(), 2.0);
  p.inf_grad();
  scaler.step(p.optimizer);
  EXPECT_TRUE(ThrowsError("diverging", [&] { scaler.update(); }));
}

TEST(GuardMinScale, ExplicitScalesBelowItAreRefused) {
  GradScaler scaler(GradScalerOptions().init_scale(256).min_scale(16));
  scale_loss(scaler);
  EXPECT_TRUE(ThrowsValueError("min_scale", [&] { scaler.update(8.0); }));
  EXPECT_EQ(scaler.get_scale(), 256.0);
  EXPECT_NO_THROW(scaler.update(16.0));
}

TEST(GuardMinScale, WithoutTheGuardTheScaleKeepsFalling) {
  // PyTorch's GradScaler behaviour: no guard, no error (the scale halves every time).
  GradScaler scaler(GradScalerOptions().init_scale(4));
  OneParam p;
  for (int i = 0; i < 10; ++i) {
    iterate(scaler, p, true);
  }
  EXPECT_EQ(scaler.get_scale(), 4.0 / 1024.0);
  EXPECT_EQ(scaler.counters().overflow_streak, 10);
}

// ---------------------------------------------------------------------------------------
// The kernels: CPU twin, routed CPU tensors and the generic ATen ops agree, and so do the
// counts each adds of what its updates did.

TEST(GuardKernels, CpuTwinRoutedAndGenericFollowOneScheduleAndCountIt) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    const int64_t interval = 1 + rng() % 4;
    const int64_t hysteresis = 1 + rng() % 4;
    const double max_scale = (rng() % 2) ? kInf : std::ldexp(1.0, 8 + rng() % 8);
    lucid::amp::detail::ScaleRule rule;
    rule.growth_interval = interval;
    rule.hysteresis = hysteresis;
    rule.refill_on_clean = trial % 2 == 1;
    rule.max_scale = static_cast<float>(max_scale);
    lucid::amp::detail::ScaleState model{256.0f, 0, 0};
    std::array<int64_t, lucid::amp::detail::kUpdateCountFields> model_counts{};
    using lucid::amp::detail::kStepLogFields;
    using lucid::amp::detail::kStepLogRows;
    std::vector<double> model_log((1 + kStepLogRows) * kStepLogFields, 0.0);
    // Every other update logs a clip norm; the rest log none.
    const at::Tensor norm = at::full({}, 3.5f);
    auto make = [] {
      return std::vector<at::Tensor>{
          at::full({}, 256.0f),
          at::zeros({}, at::kInt),
          at::zeros({}, at::kInt),
          at::zeros({lucid::amp::detail::kUpdateCountFields}, at::kLong),
          at::zeros({1 + kStepLogRows, kStepLogFields}, at::kDouble),
          at::zeros({lucid::amp::detail::kOverflowSiteFields}, at::kLong)};
    };
    auto routed = make();
    auto generic = make();
    for (int i = 0; i < 60; ++i) {
      // The iteration's flags, one per optimizer (past the bits the log tells apart, at
      // times), raised at random; the update takes them all and sets them back.
      std::vector<float> flags(1 + rng() % 30, 0.0f);
      for (float& f : flags) {
        f = rng() % (3 * flags.size()) == 0 ? 1.0f : 0.0f;
      }
      const at::Tensor routed_flags = at::tensor(flags);
      const at::Tensor generic_flags = at::tensor(flags);
      // Half of the optimizers stepped on their flag without the host reading it: the
      // update counts those steps and keeps their outcomes; the other entries stay.
      lucid::amp::detail::SteppedOrdinals stepped;
      for (size_t j = 0; j < flags.size(); ++j) {
        if (rng() % 2 == 0) {
          stepped.add(static_cast<int>(j));
        }
      }
      std::vector<float> outcomes(flags.size(), 0.5f);
      const at::Tensor routed_outcomes = at::tensor(outcomes);
      const at::Tensor generic_outcomes = at::tensor(outcomes);
      lucid::amp::detail::count_steps(model_counts.data(), outcomes.data(), flags.data(),
                                      static_cast<int64_t>(flags.size()), stepped);
      const float found_bits =
          lucid::amp::detail::take_found_inf(flags.data(), static_cast<int64_t>(flags.size()));
      ASSERT_TRUE(std::all_of(flags.begin(), flags.end(), [](float f) { return f == 0.0f; }));
      const bool found = found_bits != 0.0f;
      lucid::amp::detail::ScaleEvent event;
      const float old_scale = model.scale;
      const float clip_norm = 3.5f;
      const bool clipped = i % 2 == 1;
      // Overflowing iterations name a gradient and count entries, most of the time (a
      // hook's flag names none).
      const bool named = found && rng() % 4 != 0;
      std::array<int64_t, lucid::amp::detail::kOverflowSiteFields> site{
          named ? lucid::amp::detail::overflow_key(rng() % 30, rng() % 1000)
                : lucid::amp::detail::kNoOverflowKey,
          named ? static_cast<int64_t>(rng() % 5) : 0,
          named ? 1 + static_cast<int64_t>(rng() % 5) : 0};
      for (auto* t : {&routed, &generic}) {
        (*t)[5].copy_(at::tensor(c10::ArrayRef<int64_t>(site.data(), site.size())));
      }
      model = lucid::amp::detail::next_scale_state(model, found, rule, &event);
      lucid::amp::detail::count_update(model_counts.data(), found, event);
      lucid::amp::detail::log_update(model_log.data(), old_scale, model.scale, found_bits, event,
                                     clipped ? &clip_norm : nullptr, site.data());
      ASSERT_EQ(site[0], lucid::amp::detail::kNoOverflowKey);
      ASSERT_EQ(site[1] + site[2], 0);
      const at::Tensor logged_norm = clipped ? norm : at::Tensor();
      lucid::amp::detail::update_scale_(routed[0], routed[1], routed[2], routed_flags, rule,
                                        {routed[3], routed[4], logged_norm, routed[5],
                                         routed_outcomes, stepped});
      lucid::amp::generic::amp_backend().update_scale_(
          generic[0], generic[1], generic[2], generic_flags, rule,
          {generic[3], generic[4], logged_norm, generic[5], generic_outcomes, stepped});
      for (const at::Tensor& got : {routed_outcomes, generic_outcomes}) {
        ASSERT_TRUE(at::equal(got, at::tensor(outcomes))) << "trial " << trial << " step " << i;
      }
      ASSERT_EQ(routed_flags.count_nonzero().item<int64_t>(), 0) << "the update takes the flags";
      ASSERT_EQ(generic_flags.count_nonzero().item<int64_t>(), 0) << "trial " << trial;
      for (const auto* t : {&routed, &generic}) {
        ASSERT_EQ((*t)[5][0].item<int64_t>(), lucid::amp::detail::kNoOverflowKey)
            << "the update sets the overflow site back, trial " << trial;
        ASSERT_EQ((*t)[5].narrow(0, 1, 2).sum().item<int64_t>(), 0) << "trial " << trial;
        ASSERT_EQ((*t)[0].item<float>(), model.scale) << "trial " << trial << " step " << i;
        ASSERT_EQ((*t)[1].item<int32_t>(), model.growth_tracker) << "trial " << trial;
        ASSERT_EQ((*t)[2].item<int32_t>(), model.overflow_tracker) << "trial " << trial;
        for (int f = 0; f < lucid::amp::detail::kUpdateCountFields; ++f) {
          ASSERT_EQ((*t)[3][f].item<int64_t>(), model_counts[f])
              << "count " << f << ", trial " << trial << " step " << i;
        }
        const at::Tensor log = (*t)[4].contiguous();
        ASSERT_TRUE(std::equal(model_log.begin(), model_log.end(), log.data_ptr<double>()))
            << "step log, trial " << trial << " step " << i;
      }
    }
    EXPECT_EQ(model_counts[lucid::amp::detail::kCountUpdates], 60);
    EXPECT_GT(model_counts[lucid::amp::detail::kCountStepsTaken], 0);
    EXPECT_GT(model_counts[lucid::amp::detail::kCountStepsSkipped], 0);
  }
}

TEST(GuardKernels, GuardsOffTwinIsPyTorchsRule) {
  // next_scale_state with the guards off == PyTorch's two-field rule (above the floor).
  std::mt19937 rng(3);
  lucid::amp::detail::ScaleRule rule;
  rule.growth_factor = 1.7;
  rule.backoff_factor = 0.3;
  rule.growth_interval = 3;
  lucid::amp::detail::ScaleState s{1000.0f, 0};
  float scale = 1000.0f;
  int32_t tracker = 0;
  for (int i = 0; i < 500; ++i) {
    const bool found = rng() % 5 == 0;
    s = lucid::amp::detail::next_scale_state(s, found, rule);
    if (found) {
      scale = static_cast<float>(scale * 0.3);
      tracker = 0;
    } else if (tracker + 1 == 3) {
      const float grown = static_cast<float>(scale * 1.7);
      scale = std::isfinite(grown) ? grown : scale;
      tracker = 0;
    } else {
      ++tracker;
    }
    ASSERT_EQ(s.scale, scale);
    ASSERT_EQ(s.growth_tracker, tracker);
    ASSERT_EQ(s.overflow_tracker, 0);
  }
}

}  // namespace
