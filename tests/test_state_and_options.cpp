// SPDX-License-Identifier: BSD-3-Clause
// GradScalerOptions (defaults and validation) and GradScaler's state: get_scale,
// state_dict and load_state_dict (docs/behaviour.md).

#include "support/scaler_fixtures.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace {

using namespace lucid_test;
using State = std::map<std::string, double>;

// ---------------------------------------------------------------------------------------
// Options.

TEST(GradScalerOptionsTest, DefaultsMatchTheReferenceAPI) {
  const GradScalerOptions options;
  EXPECT_EQ(options.init_scale(), 65536.0);
  EXPECT_EQ(options.growth_factor(), 2.0);
  EXPECT_EQ(options.backoff_factor(), 0.5);
  EXPECT_EQ(options.growth_interval(), 2000);
  EXPECT_TRUE(options.enabled());
}

TEST(GradScalerOptionsTest, DefaultScalerUsesTheDefaults) {
  const GradScaler scaler;
  EXPECT_TRUE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 65536.0);
  EXPECT_EQ(scaler.options().growth_interval(), 2000);
  const State state = scaler.state_dict();
  EXPECT_EQ(state.at("scale"), 65536.0);
  EXPECT_EQ(state.at("growth_factor"), 2.0);
  EXPECT_EQ(state.at("backoff_factor"), 0.5);
  EXPECT_EQ(state.at("growth_interval"), 2000.0);
  EXPECT_EQ(state.at("growth_tracker"), 0.0);
}

TEST(GradScalerOptionsTest, OptionsAreChainable) {
  const auto options = GradScalerOptions()
                           .init_scale(128.0)
                           .growth_factor(4.0)
                           .backoff_factor(0.125)
                           .growth_interval(7)
                           .enabled(false);
  EXPECT_EQ(options.init_scale(), 128.0);
  EXPECT_EQ(options.growth_factor(), 4.0);
  EXPECT_EQ(options.backoff_factor(), 0.125);
  EXPECT_EQ(options.growth_interval(), 7);
  EXPECT_FALSE(options.enabled());
}

TEST(GradScalerOptionsTest, InitScaleMustBeFiniteAndPositive) {
  for (const double bad : {0.0, -0.0, -1.0, kInf, -kInf, kNaN}) {
    EXPECT_TRUE(ThrowsValueError("init_scale", [&] { GradScaler(GradScalerOptions().init_scale(bad)); }))
        << "init_scale " << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().init_scale(1e-3)));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().init_scale(1.0)));
}

TEST(GradScalerOptionsTest, GrowthFactorMustBeFiniteAndAboveOne) {
  for (const double bad : {1.0, 0.5, 0.0, -2.0, kInf, kNaN}) {
    EXPECT_TRUE(ThrowsValueError("growth_factor",
                                 [&] { GradScaler(GradScalerOptions().growth_factor(bad)); }))
        << "growth_factor " << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().growth_factor(1.0001)));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().growth_factor(10.0)));
}

TEST(GradScalerOptionsTest, BackoffFactorMustBeInOpenUnitInterval) {
  for (const double bad : {0.0, 1.0, 1.5, -0.5, kInf, kNaN}) {
    EXPECT_TRUE(ThrowsValueError("backoff_factor",
                                 [&] { GradScaler(GradScalerOptions().backoff_factor(bad)); }))
        << "backoff_factor " << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().backoff_factor(0.001)));
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().backoff_factor(0.999)));
}

TEST(GradScalerOptionsTest, GrowthIntervalMustBeAtLeastOne) {
  for (const int64_t bad : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
    EXPECT_TRUE(ThrowsValueError("growth_interval",
                                 [&] { GradScaler(GradScalerOptions().growth_interval(bad)); }))
        << "growth_interval " << bad;
  }
  EXPECT_NO_THROW(GradScaler(GradScalerOptions().growth_interval(1)));
}

TEST(GradScalerOptionsTest, DisabledScalerStillValidatesOptions) {
  // Options are validated once, by the constructor, whatever `enabled` says.
  EXPECT_TRUE(ThrowsValueError(
      "growth_factor", [] { GradScaler(GradScalerOptions().enabled(false).growth_factor(0.5)); }));
}

// ---------------------------------------------------------------------------------------
// get_scale.

TEST(GradScalerState, GetScaleReturnsTheCurrentScale) {
  GradScaler scaler(GradScalerOptions().init_scale(300.0).growth_interval(2));
  EXPECT_EQ(scaler.get_scale(), 300.0);
  scaler.scale(torch::ones({}));
  EXPECT_EQ(scaler.get_scale(), 300.0);
  iterate(scaler, true);
  EXPECT_EQ(scaler.get_scale(), 150.0);
  iterate(scaler, false);
  iterate(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 300.0);
  scaler.update(5.0);
  EXPECT_EQ(scaler.get_scale(), 5.0);
}

TEST(GradScalerState, GetScaleIsOneWhenDisabled) {
  const GradScaler scaler(GradScalerOptions().init_scale(300.0).enabled(false));
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

// ---------------------------------------------------------------------------------------
// state_dict.

TEST(GradScalerState, StateDictHasExactlyTheFiveKeys) {
  GradScaler scaler;
  const std::set<std::string> want = {"scale", "growth_factor", "backoff_factor",
                                      "growth_interval", "growth_tracker"};
  std::set<std::string> keys;
  for (const auto& kv : scaler.state_dict()) {
    keys.insert(kv.first);
  }
  EXPECT_EQ(keys, want);
  scaler.scale(torch::ones({}));
  keys.clear();
  for (const auto& kv : scaler.state_dict()) {
    keys.insert(kv.first);
  }
  EXPECT_EQ(keys, want) << "after scale() created the state tensors";
}

TEST(GradScalerState, StateDictValuesBeforeScaleWasCalled) {
  const GradScaler scaler(
      GradScalerOptions().init_scale(1024.0).growth_factor(3.0).backoff_factor(0.25).growth_interval(5));
  const State want = {{"scale", 1024.0},
                      {"growth_factor", 3.0},
                      {"backoff_factor", 0.25},
                      {"growth_interval", 5.0},
                      {"growth_tracker", 0.0}};
  EXPECT_EQ(scaler.state_dict(), want) << describe(scaler.state_dict());
}

TEST(GradScalerState, StateDictValuesAfterScaleCreatedTheTensors) {
  GradScaler scaler(
      GradScalerOptions().init_scale(1024.0).growth_factor(3.0).backoff_factor(0.25).growth_interval(5));
  scaler.scale(torch::ones({2}));
  const State want = {{"scale", 1024.0},
                      {"growth_factor", 3.0},
                      {"backoff_factor", 0.25},
                      {"growth_interval", 5.0},
                      {"growth_tracker", 0.0}};
  EXPECT_EQ(scaler.state_dict(), want) << describe(scaler.state_dict());
}

TEST(GradScalerState, StateDictFollowsUpdates) {
  GradScaler scaler(
      GradScalerOptions().init_scale(1024.0).growth_factor(3.0).backoff_factor(0.25).growth_interval(3));
  scaler.scale(torch::ones({}));
  iterate(scaler, false);
  iterate(scaler, false);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 2.0);
  EXPECT_EQ(scaler.state_dict().at("scale"), 1024.0);
  iterate(scaler, true);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  EXPECT_EQ(scaler.state_dict().at("scale"), 256.0);
  for (int i = 0; i < 3; ++i) {
    iterate(scaler, false);
  }
  EXPECT_EQ(scaler.state_dict().at("scale"), 768.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  iterate(scaler, false);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 1.0);
  EXPECT_EQ(scaler.state_dict().at("growth_factor"), 3.0);
  EXPECT_EQ(scaler.state_dict().at("backoff_factor"), 0.25);
  EXPECT_EQ(scaler.state_dict().at("growth_interval"), 3.0);
}

TEST(GradScalerState, UpdatesBeforeAnyCheckLeaveTheStateDict) {
  GradScaler scaler(GradScalerOptions().init_scale(16.0).growth_interval(3));
  scale_loss(scaler);
  const auto before = scaler.state_dict();
  for (int i = 0; i < 4; ++i) {
    scaler.update();  // no gradient was ever checked: no evidence of a clean step
  }
  EXPECT_EQ(scaler.state_dict(), before);
  EXPECT_EQ(scaler.counters().updates_without_checks, 4);
}

// ---------------------------------------------------------------------------------------
// load_state_dict.

// A scaler with a non-trivial history: scale backed off and grown, tracker mid-way.
void give_history(GradScaler& scaler) {
  iterate(scaler, true);
  for (int i = 0; i < 4; ++i) {
    iterate(scaler, false);
  }
}

TEST(GradScalerLoad, RoundTripReproducesTheSchedule) {
  for (const bool target_has_tensors : {false, true}) {
    GradScaler source(
        GradScalerOptions().init_scale(4096.0).growth_factor(3.0).backoff_factor(0.25).growth_interval(3));
    give_history(source);
    const State saved = source.state_dict();
    ASSERT_EQ(saved.at("scale"), 4096.0 * 0.25 * 3.0);
    ASSERT_EQ(saved.at("growth_tracker"), 1.0);

    GradScaler target;  // defaults: every field differs from the source's
    if (target_has_tensors) {
      target.scale(torch::ones({}));
    }
    target.load_state_dict(saved);
    EXPECT_EQ(target.state_dict(), saved) << describe(target.state_dict());
    EXPECT_EQ(target.get_scale(), source.get_scale());
    EXPECT_EQ(target.options().growth_factor(), 3.0);
    EXPECT_EQ(target.options().backoff_factor(), 0.25);
    EXPECT_EQ(target.options().growth_interval(), 3);

    // Both follow the same schedule from here.
    const std::vector<bool> overflows = {false, false, false, true, false, false, false, false};
    for (size_t i = 0; i < overflows.size(); ++i) {
      iterate(source, overflows[i]);
      iterate(target, overflows[i]);
      EXPECT_EQ(target.state_dict(), source.state_dict())
          << "iteration " << i << (target_has_tensors ? " (tensors existed)" : "") << ": "
          << describe(target.state_dict()) << " vs " << describe(source.state_dict());
    }
    EXPECT_EQ(source.get_scale(), 4096.0 * 0.25 * 3.0 * 3.0 * 0.25 * 3.0);
  }
}

TEST(GradScalerLoad, LoadedScaleIsUsedByScale) {
  GradScaler scaler;
  State state = scaler.state_dict();
  state["scale"] = 8.0;
  scaler.load_state_dict(state);
  EXPECT_EQ(scaler.scale(torch::scalar_tensor(3.0)).item<float>(), 24.0f);
}

// The scaler the failing loads are tried on, and a valid map whose every entry differs
// from its state, so that a partly applied load would show.
struct LoadFixture {
  static GradScaler make(bool with_tensors) {
    GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(4));
    if (with_tensors) {
      scaler.scale(torch::ones({}));
    }
    iterate(scaler, false);  // growth_tracker 1
    return scaler;
  }
  static State valid_map() {
    return {{"scale", 8.0},
            {"growth_factor", 3.0},
            {"backoff_factor", 0.25},
            {"growth_interval", 7.0},
            {"growth_tracker", 2.0}};
  }
};

TEST(GradScalerLoad, ValidMapOfTheFixtureLoads) {
  // Guards the failure tests below: their map is valid but for the one broken entry.
  GradScaler scaler = LoadFixture::make(true);
  EXPECT_NO_THROW(scaler.load_state_dict(LoadFixture::valid_map()));
  EXPECT_EQ(scaler.state_dict(), LoadFixture::valid_map());
}

TEST(GradScalerLoad, MissingKeyThrowsValueErrorAndChangesNothing) {
  for (const bool with_tensors : {false, true}) {
    for (const std::string key :
         {"scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker"}) {
      GradScaler scaler = LoadFixture::make(with_tensors);
      const State before = scaler.state_dict();
      State map = LoadFixture::valid_map();
      map.erase(key);
      EXPECT_TRUE(ThrowsValueError(key, [&] { scaler.load_state_dict(map); }))
          << "without '" << key << "'";
      EXPECT_EQ(scaler.state_dict(), before)
          << "a map without '" << key << "' changed the scaler"
          << (with_tensors ? " (tensors existed)" : "") << ": " << describe(scaler.state_dict());
    }
  }
}

TEST(GradScalerLoad, EmptyMapThrowsValueError) {
  GradScaler scaler;
  const State before = scaler.state_dict();
  EXPECT_TRUE(ThrowsValueError("load_state_dict", [&] { scaler.load_state_dict({}); }));
  EXPECT_EQ(scaler.state_dict(), before);
}

TEST(GradScalerLoad, InvalidValueThrowsValueErrorAndChangesNothing) {
  struct Case {
    const char* key;
    double value;
  };
  const std::vector<Case> cases = {
      {"scale", kNaN},           {"scale", 0.0},           {"scale", -4.0},
      {"scale", kInf},           {"growth_factor", 0.5},   {"growth_factor", 1.0},
      {"growth_factor", kNaN},   {"backoff_factor", 1.5},  {"backoff_factor", 0.0},
      {"backoff_factor", kNaN},  {"growth_interval", 0.0}, {"growth_interval", 2.5},
      {"growth_interval", -3.0}, {"growth_interval", kNaN}, {"growth_tracker", -1.0},
      {"growth_tracker", 1.5},   {"growth_tracker", kNaN},
  };
  for (const bool with_tensors : {false, true}) {
    for (const Case& c : cases) {
      GradScaler scaler = LoadFixture::make(with_tensors);
      const State before = scaler.state_dict();
      State map = LoadFixture::valid_map();
      map[c.key] = c.value;
      EXPECT_TRUE(ThrowsValueError(c.key, [&] { scaler.load_state_dict(map); }))
          << c.key << " = " << c.value << (with_tensors ? " (tensors existed)" : "");
      EXPECT_EQ(scaler.state_dict(), before)
          << c.key << " = " << c.value << " changed the scaler: "
          << describe(scaler.state_dict());
      EXPECT_EQ(scaler.options().growth_factor(), 2.0);
      EXPECT_EQ(scaler.options().growth_interval(), 4);
    }
  }
}

TEST(GradScalerLoad, FailedLoadLeavesTheScheduleIntact) {
  GradScaler scaler = LoadFixture::make(true);  // scale 1024, interval 4, tracker 1
  State map = LoadFixture::valid_map();
  map["growth_tracker"] = -1.0;
  EXPECT_TRUE(ThrowsValueError("growth_tracker", [&] { scaler.load_state_dict(map); }));
  iterate(scaler, false);
  iterate(scaler, false);
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  iterate(scaler, false);  // the fourth clean update since construction
  EXPECT_EQ(scaler.get_scale(), 2048.0);
}

}  // namespace
