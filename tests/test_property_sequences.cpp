// SPDX-License-Identifier: BSD-3-Clause
// Property test: thousands of random sequences of API calls on a GradScaler with a few
// optimizers, each call mirrored on a small reference model of the stage machine, the
// scale schedule (guards included), the counters and the overflow report. After every
// call every observable is compared: the exception type, the return value, the scale,
// state_dict, counters, each optimizer's stage and step_skipped, the last overflow
// report, and every parameter and gradient value.
//
// LUCID_PROPERTY_SEQUENCES (default 3000) and LUCID_PROPERTY_SEED (default 20240611) set
// the number of sequences and the random seed; a failure prints both to replay it.

#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>

namespace {

using namespace lucid_test;

constexpr int kOptimizers = 3;
constexpr int kParams = 2;  // per optimizer; optimizer 2 has them in two param groups
constexpr int kEntries = 3;

enum class Outcome { kOk, kError, kValueError };

const char* name(Outcome o) {
  return o == Outcome::kOk ? "ok" : o == Outcome::kError ? "c10::Error" : "c10::ValueError";
}

template <typename F>
Outcome run(F&& f) {
  try {
    f();
  } catch (const c10::ValueError&) {
    return Outcome::kValueError;
  } catch (const c10::Error&) {
    return Outcome::kError;
  }
  return Outcome::kOk;
}

bool same_float(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

// ---------------------------------------------------------------------------------------
// The reference model: plain C++ over floats, written from the contract (the reference
// API, docs/behaviour.md), not from the implementation.

struct ModelOptions {
  bool enabled = true;
  double growth_factor = 2.0, backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 0.0, max_scale = kInf;
  int64_t hysteresis = 1;
  bool refill_on_clean = false;  // HysteresisRefill::kOnCleanUpdate
};

struct ModelReportEntry {
  int opt, group, index;
  int64_t nan, inf;
  bool operator<(const ModelReportEntry& o) const {
    return std::tie(opt, group, index) < std::tie(o.opt, o.group, o.index);
  }
  bool operator==(const ModelReportEntry& o) const {
    return opt == o.opt && group == o.group && index == o.index && nan == o.nan && inf == o.inf;
  }
};

struct ModelReport {
  int64_t iteration = 0;
  double scale = 0;
  int64_t optimizers = 0;
  int64_t uninspected = 0;
  std::vector<ModelReportEntry> entries;
};

struct ModelEvent {
  int64_t iteration;
  double old_scale, new_scale;
  int64_t streak;
};

struct Model {
  ModelOptions o;
  float scale = 65536.0f;
  bool scaled = false;  // scale() has made the scale; unscale_, step and update need it
  int32_t growth_tracker = 0, overflow_tracker = 0;
  struct Opt {
    OptimizerStage stage = OptimizerStage::kReady;
    bool flag = false, flag_read = false;
    bool checked = false;  // unscale_/step saw at least one gradient in this iteration
    bool grad_defined[kParams] = {false, false};
    float grad[kParams][kEntries] = {};
    float param[kParams][kEntries] = {};
    int last_skipped = -1;  // -1 never stepped
  } opt[kOptimizers];
  ScalerCounters counters;
  std::optional<ModelReport> report;
  bool callback = false;
  std::vector<ModelEvent> events;

  static int group_of(int k, int i) { return k == 2 ? i : 0; }
  static int index_in_group(int k, int i) { return k == 2 ? 0 : i; }

  void build_report(int k, bool inspect) {
    if (!report.has_value() || report->iteration != counters.updates) {
      report = ModelReport{counters.updates, static_cast<double>(scale), 0, 0, {}};
    }
    ++report->optimizers;
    if (!inspect) {
      ++report->uninspected;
      return;
    }
    for (int i = 0; i < kParams; ++i) {
      if (!opt[k].grad_defined[i]) {
        continue;
      }
      int64_t nan = 0, inf = 0;
      for (float v : opt[k].grad[i]) {
        nan += std::isnan(v);
        inf += std::isinf(v);
      }
      if (nan + inf > 0) {
        report->entries.push_back({k, group_of(k, i), index_in_group(k, i), nan, inf});
      }
    }
  }

  bool read_flag(int k, bool inspect = true) {
    if (!opt[k].flag_read) {
      opt[k].flag_read = true;
      if (opt[k].flag) {
        build_report(k, inspect);
      }
    }
    return opt[k].flag;
  }

  // Divides every defined gradient by the scale (1/s in float64, rounded to float32, as
  // PyTorch's rule) and sets the flag when a value is non-finite afterwards.
  void unscale_grads(int k) {
    const float inv = static_cast<float>(1.0 / static_cast<double>(scale));
    bool found = false;
    for (int i = 0; i < kParams; ++i) {
      if (!opt[k].grad_defined[i]) {
        continue;
      }
      for (float& v : opt[k].grad[i]) {
        v = v * inv;
        found = found || !std::isfinite(v);
      }
    }
    opt[k].flag = found;
    opt[k].flag_read = false;
    opt[k].checked = false;
    for (int i = 0; i < kParams; ++i) {
      opt[k].checked = opt[k].checked || opt[k].grad_defined[i];
    }
    opt[k].stage = OptimizerStage::kUnscaled;
  }

  Outcome unscale_(int k) {
    if (!o.enabled) {
      return Outcome::kOk;
    }
    if (!scaled || opt[k].stage != OptimizerStage::kReady) {
      return Outcome::kError;
    }
    unscale_grads(k);
    return Outcome::kOk;
  }

  void sgd_step(int k) {  // SGD, lr 1: p - g
    for (int i = 0; i < kParams; ++i) {
      if (opt[k].grad_defined[i]) {
        for (int j = 0; j < kEntries; ++j) {
          opt[k].param[i][j] = opt[k].param[i][j] - opt[k].grad[i][j];
        }
      }
    }
  }

  // Returns the outcome and whether optimizer.step() ran.
  std::pair<Outcome, bool> step(int k) {
    if (!o.enabled) {
      sgd_step(k);
      return {Outcome::kOk, true};
    }
    if (!scaled || opt[k].stage == OptimizerStage::kStepped) {
      return {Outcome::kError, false};
    }
    if (opt[k].stage == OptimizerStage::kReady) {
      unscale_grads(k);
    }
    counters.steps_without_gradients += opt[k].checked ? 0 : 1;
    const bool overflow = read_flag(k);
    opt[k].stage = OptimizerStage::kStepped;
    opt[k].last_skipped = overflow ? 1 : 0;
    if (overflow) {
      ++counters.steps_skipped;
      return {Outcome::kOk, false};
    }
    sgd_step(k);
    ++counters.steps_taken;
    return {Outcome::kOk, true};
  }

  // One step of the schedule: (scale, growth tracker, overflow tracker, what happened).
  enum Event { kNone, kGrowth, kAbsorbed, kBackoff };
  std::tuple<float, int32_t, int32_t, Event> next(bool found) const {
    if (found) {
      if (overflow_tracker + 1 < o.hysteresis) {
        return {scale, 0, overflow_tracker + 1, kAbsorbed};
      }
      // A backoff never goes below float32's smallest normal value (nor below a scale
      // that is already smaller).
      const float backed_off = static_cast<float>(scale * o.backoff_factor);
      return {std::max(backed_off, std::min(scale, FLT_MIN)), 0, overflow_tracker, kBackoff};
    }
    if (growth_tracker + 1 == o.growth_interval) {
      float grown = static_cast<float>(scale * o.growth_factor);
      if (!std::isfinite(grown)) {
        grown = scale;
      }
      grown = std::min(grown, static_cast<float>(o.max_scale));
      return {grown, 0, 0, kGrowth};  // growth refills the hysteresis count (both modes)
    }
    // A clean update refills it only in DeepSpeed's consecutive mode.
    const int32_t refilled = o.refill_on_clean ? 0 : overflow_tracker;
    return {scale, growth_tracker + 1, refilled, kNone};
  }

  void finish_iteration() {
    for (auto& x : opt) {
      x.stage = OptimizerStage::kReady;
      x.flag = false;
      x.flag_read = false;
      x.checked = false;
    }
    ++counters.updates;
  }

  Outcome update() {
    if (!o.enabled) {
      return Outcome::kOk;
    }
    if (!scaled) {
      return Outcome::kError;
    }
    bool evidence = false;
    for (const auto& x : opt) {
      evidence = evidence || (x.stage != OptimizerStage::kReady && x.checked);
    }
    if (!evidence) {  // no growth (nor anything else) without an overflow check
      ++counters.updates_without_checks;
      finish_iteration();
      return Outcome::kOk;
    }
    // The host learns every flag of the update (now, or when its copy lands) and reports
    // the unread ones without touching their optimizers.
    for (int k = 0; k < kOptimizers; ++k) {
      if (opt[k].stage != OptimizerStage::kReady) {
        read_flag(k, /*inspect=*/false);
      }
    }
    bool found = false;
    for (const auto& x : opt) {
      found = found || (x.stage != OptimizerStage::kReady && x.flag);
    }
    const auto [new_scale, gt, ot, event] = next(found);
    if (event == kBackoff && o.min_scale > 0 && static_cast<double>(new_scale) < o.min_scale) {
      return Outcome::kError;
    }
    const float old_scale = scale;
    scale = new_scale;
    growth_tracker = gt;
    overflow_tracker = ot;
    counters.overflow_updates += found;
    counters.overflow_streak = found ? counters.overflow_streak + 1 : 0;
    counters.backoffs += event == kBackoff;
    counters.growths += event == kGrowth;
    if (event == kBackoff && callback) {
      events.push_back({counters.updates, old_scale, new_scale, counters.overflow_streak});
    }
    finish_iteration();
    return Outcome::kOk;
  }

  Outcome update(double value) {
    if (!o.enabled) {
      return Outcome::kOk;
    }
    if (!scaled) {
      return Outcome::kError;
    }
    if (!(std::isfinite(value) && value > 0 && value <= FLT_MAX) ||
        static_cast<float>(value) == 0.0f) {
      return Outcome::kValueError;
    }
    const float v = static_cast<float>(value);
    if (static_cast<double>(v) < o.min_scale || v > static_cast<float>(o.max_scale)) {
      return Outcome::kValueError;
    }
    scale = v;
    finish_iteration();
    return Outcome::kOk;
  }

  std::map<std::string, double> state_dict() const {
    if (!o.enabled) {
      return {};
    }
    std::map<std::string, double> s = {{"scale", scale},
                                       {"growth_factor", o.growth_factor},
                                       {"backoff_factor", o.backoff_factor},
                                       {"growth_interval", static_cast<double>(o.growth_interval)},
                                       {"growth_tracker", growth_tracker}};
    if (o.min_scale > 0) {
      s["min_scale"] = o.min_scale;
    }
    if (std::isfinite(o.max_scale)) {
      s["max_scale"] = o.max_scale;
    }
    if (o.hysteresis > 1) {
      s["hysteresis"] = static_cast<double>(o.hysteresis);
      s["overflow_tracker"] = overflow_tracker;
    }
    return s;
  }
};

// ---------------------------------------------------------------------------------------
// The system under test.

struct Real {
  std::unique_ptr<GradScaler> scaler;
  std::vector<torch::Tensor> params[kOptimizers];
  std::unique_ptr<torch::optim::SGD> opt[kOptimizers];
  std::vector<BackoffEvent> events;

  Real() {
    for (int k = 0; k < kOptimizers; ++k) {
      for (int i = 0; i < kParams; ++i) {
        params[k].push_back(torch::zeros({kEntries}, torch::requires_grad()));
      }
      if (k == 2) {
        opt[k] = std::make_unique<torch::optim::SGD>(
            std::vector<torch::optim::OptimizerParamGroup>{
                torch::optim::OptimizerParamGroup({params[k][0]}),
                torch::optim::OptimizerParamGroup({params[k][1]})},
            torch::optim::SGDOptions(1.0));
      } else {
        opt[k] = std::make_unique<torch::optim::SGD>(params[k], torch::optim::SGDOptions(1.0));
      }
    }
  }
  int index_of(lucid::amp::OptimizerKey key) const {
    for (int k = 0; k < kOptimizers; ++k) {
      if (key == opt[k].get()) {
        return k;
      }
    }
    return -1;
  }
};

GradScalerOptions to_options(const ModelOptions& m, float init) {
  return GradScalerOptions()
      .init_scale(init)
      .growth_factor(m.growth_factor)
      .backoff_factor(m.backoff_factor)
      .growth_interval(m.growth_interval)
      .enabled(m.enabled)
      .min_scale(m.min_scale)
      .max_scale(m.max_scale)
      .hysteresis(m.hysteresis);
}

struct Stats {
  int64_t sequences = 0, calls = 0, refused = 0, overflows = 0, backoffs = 0, loads = 0,
          archives = 0, divergences = 0;
};

class Sequence {
 public:
  Sequence(uint64_t seed, Stats& stats) : rng_(seed), stats_(stats) {}

  // Returns an empty string when every observable matched, else what differed.
  std::string run(int length) {
    odd_factors_ = !generic_ && pick(4) == 0;
    if (pick(2) == 0) {
      force_ = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
      odd_factors_ = false;
    }
    model_.o = random_options();
    model_.scale = random_scale(model_.o);
    real_.scaler = std::make_unique<GradScaler>(to_options(model_.o, model_.scale));
    log_ << (force_ ? "generic" : "routed") << " enabled " << model_.o.enabled << " gf "
         << model_.o.growth_factor << " bf " << model_.o.backoff_factor << " gi "
         << model_.o.growth_interval << " min " << model_.o.min_scale << " max "
         << model_.o.max_scale << " hyst " << model_.o.hysteresis << " init " << model_.scale
         << "\n";
    for (int n = 0; n < length; ++n) {
      std::string diff = one_call();
      ++stats_.calls;
      if (diff.empty()) {
        diff = compare();
      }
      if (!diff.empty()) {
        return log_.str() + "==> " + diff;
      }
    }
    return "";
  }

 private:
  uint32_t pick(uint32_t n) { return rng_() % n; }
  bool chance(uint32_t percent) { return pick(100) < percent; }

  ModelOptions random_options() {
    ModelOptions o;
    o.enabled = pick(10) != 0;
    if (odd_factors_) {
      const double g[] = {1.5, 3.0, 1.25};
      const double b[] = {0.3, 0.75, 0.9};
      o.growth_factor = g[pick(3)];
      o.backoff_factor = b[pick(3)];
    } else {
      o.growth_factor = pick(3) == 0 ? 4.0 : 2.0;
      o.backoff_factor = pick(3) == 0 ? 0.25 : 0.5;
    }
    o.growth_interval = 1 + pick(4);
    o.min_scale = chance(30) ? std::ldexp(1.0, -static_cast<int>(pick(4))) : 0.0;
    o.max_scale = chance(30) ? std::ldexp(1.0, 10 + static_cast<int>(pick(8))) : kInf;
    o.hysteresis = chance(30) ? 2 + pick(3) : 1;
    return o;
  }

  float random_scale(const ModelOptions& o) {
    for (;;) {
      const float s = std::ldexp(1.0f, static_cast<int>(pick(22)) - 4);
      if (static_cast<double>(s) >= o.min_scale && s <= static_cast<float>(o.max_scale)) {
        return s;
      }
    }
  }

  float random_value() {
    switch (pick(10)) {
      case 0:
        return kFNaN;
      case 1:
        return pick(2) ? kFInf : -kFInf;
      case 2:
        return pick(2) ? FLT_MAX / 2 : -FLT_MAX;
      default:
        return static_cast<float>(static_cast<int>(pick(41)) - 20) * std::ldexp(1.0f, pick(12));
    }
  }

  // Usually the backward pass of a scaled loss: scale() first.
  void set_grads(int k) {
    if (chance(80)) {
      log_ << "scale(1)\n";
      real_.scaler->scale(torch::ones({}));
      model_.scaled = model_.scaled || model_.o.enabled;
    }
    const bool clean = chance(60);
    for (int i = 0; i < kParams; ++i) {
      if (chance(10)) {
        model_.opt[k].grad_defined[i] = false;
        real_.params[k][i].mutable_grad() = torch::Tensor();
        continue;
      }
      std::vector<float> v(kEntries);
      for (float& x : v) {
        x = clean ? static_cast<float>(static_cast<int>(pick(9)) - 4) * std::ldexp(1.0f, pick(20))
                  : random_value();
      }
      model_.opt[k].grad_defined[i] = true;
      std::copy(v.begin(), v.end(), model_.opt[k].grad[i]);
      real_.params[k][i].mutable_grad() = torch::tensor(v);
    }
    log_ << "set_grads(" << k << ")\n";
  }

  std::map<std::string, double> random_map(bool& valid, std::string& broken) {
    ModelOptions o = model_.o;
    o.growth_factor = odd_factors_ ? 3.0 : (pick(2) ? 2.0 : 4.0);
    o.backoff_factor = odd_factors_ ? 0.3 : (pick(2) ? 0.5 : 0.25);
    o.growth_interval = 1 + pick(5);
    std::map<std::string, double> m = {{"growth_factor", o.growth_factor},
                                       {"backoff_factor", o.backoff_factor},
                                       {"growth_interval", static_cast<double>(o.growth_interval)}};
    const bool guards = chance(50);
    if (guards) {
      o.min_scale = chance(50) ? 0.25 : 0.0;
      o.max_scale = chance(50) ? 8192.0 : kInf;
      o.hysteresis = 1 + pick(3);
      m["min_scale"] = o.min_scale;
      m["max_scale"] = o.max_scale;
      m["hysteresis"] = static_cast<double>(o.hysteresis);
      m["overflow_tracker"] = pick(static_cast<uint32_t>(o.hysteresis));
    }
    m["scale"] = random_scale(o);
    m[chance(30) ? "_growth_tracker" : "growth_tracker"] = pick(static_cast<uint32_t>(o.growth_interval));
    valid = true;
    if (chance(40)) {
      valid = false;
      const double nan = std::numeric_limits<double>::quiet_NaN();
      const std::vector<std::pair<std::string, double>> bad = {
          {"scale", nan},        {"scale", 0.0},          {"scale", -8.0},
          {"scale", kInf},       {"scale", 1e39},         {"scale", 1e-50},
          {"growth_factor", 1.0}, {"growth_factor", nan}, {"backoff_factor", 1.0},
          {"backoff_factor", 0.0}, {"growth_interval", 0.0}, {"growth_interval", 2.5},
          {"growth_interval", 3e9}, {"growth_tracker", -1.0}, {"growth_tracker", 1e6},
          {"min_scale", -1.0},   {"max_scale", 0.0},      {"hysteresis", 0.0},
          {"overflow_tracker", 9.0}, {"", 0.0}};
      const auto& b = bad[pick(static_cast<uint32_t>(bad.size()))];
      if (b.first.empty()) {
        const char* keys[] = {"scale", "growth_factor", "backoff_factor", "growth_interval"};
        broken = keys[pick(4)];
        m.erase(broken);
        if (broken == "growth_interval") {
          m.erase("growth_tracker");  // a missing tracker too
          m.erase("_growth_tracker");
        }
      } else {
        broken = b.first;
        m.erase("_growth_tracker");
        m[b.first] = b.second;
      }
    }
    if (valid) {
      staged_ = o;
      staged_.enabled = model_.o.enabled;
    }
    return m;
  }

  std::string one_call() {
    const int k = static_cast<int>(pick(kOptimizers));
    Outcome want = Outcome::kOk, got = Outcome::kOk;
    const uint32_t op = pick(100);
    if (op < 18) {
      set_grads(k);
      return "";
    } else if (op < 30) {
      log_ << "unscale_(" << k << ")\n";
      want = model_.unscale_(k);
      got = ::run([&] { real_.scaler->unscale_(*real_.opt[k]); });
    } else if (op < 48) {
      log_ << "step(" << k << ")\n";
      const auto [outcome, stepped] = model_.step(k);
      want = outcome;
      std::optional<torch::Tensor> r;
      got = ::run([&] { r = real_.scaler->step(*real_.opt[k]); });
      if (got == Outcome::kOk && want == Outcome::kOk && r.has_value() != stepped) {
        return std::string("step returned ") + (r.has_value() ? "a value" : "nullopt");
      }
      stats_.overflows += (want == Outcome::kOk && !stepped) ? 1 : 0;
    } else if (op < 62) {
      log_ << "update()\n";
      const auto before = model_.counters.backoffs;
      want = model_.update();
      got = ::run([&] { real_.scaler->update(); });
      stats_.backoffs += model_.counters.backoffs - before;
      stats_.divergences += want == Outcome::kError ? 1 : 0;
    } else if (op < 67) {
      const double values[] = {std::ldexp(1.0, static_cast<int>(pick(20)) - 5),
                               std::numeric_limits<double>::quiet_NaN(), 0.0, -1.0, kInf,
                               1e39, 1e-60, 3.0, 1e6};
      const double v = values[pick(9)];
      log_ << "update(" << v << ")\n";
      want = model_.update(v);
      got = ::run([&] { real_.scaler->update(v); });
    } else if (op < 72) {
      const float x = static_cast<float>(static_cast<int>(pick(21)) - 10) / 4.0f;
      log_ << "scale(" << x << ")\n";
      const torch::Tensor out = real_.scaler->scale(torch::scalar_tensor(x));
      model_.scaled = model_.scaled || model_.o.enabled;
      const float expect = model_.o.enabled ? x * model_.scale : x;
      if (!same_float(out.item<float>(), expect)) {
        return "scale(" + std::to_string(x) + ") = " + std::to_string(out.item<float>()) +
               ", model " + std::to_string(expect);
      }
      return "";
    } else if (op < 77) {
      log_ << "overflowed(" << k << ")\n";
      bool expect = false;
      if (model_.o.enabled && model_.opt[k].stage != OptimizerStage::kReady) {
        expect = model_.read_flag(k);
      }
      const bool got_flag = real_.scaler->overflowed(*real_.opt[k]);
      if (got_flag != expect) {
        return "overflowed() = " + std::to_string(got_flag);
      }
      return "";
    } else if (op < 85) {
      bool valid = false;
      std::string broken;
      const auto map = random_map(valid, broken);
      log_ << "load_state_dict(" << describe(map) << ")" << (valid ? "" : " broken " + broken)
           << "\n";
      ++stats_.loads;
      if (!model_.o.enabled) {
        want = Outcome::kOk;
      } else if (!valid) {
        want = Outcome::kValueError;
      } else {
        want = Outcome::kOk;
        model_.o = staged_;
        model_.scale = static_cast<float>(map.at("scale"));
        const auto gt = map.count("growth_tracker") ? map.at("growth_tracker") : map.at("_growth_tracker");
        model_.growth_tracker = static_cast<int32_t>(gt);
        model_.overflow_tracker =
            map.count("overflow_tracker") ? static_cast<int32_t>(map.at("overflow_tracker")) : 0;
      }
      got = ::run([&] { real_.scaler->load_state_dict(map); });
    } else if (op < 90) {
      model_.callback = !model_.callback;
      log_ << "set_backoff_callback(" << model_.callback << ")\n";
      if (model_.callback) {
        real_.scaler->set_backoff_callback([this](const BackoffEvent& e) { real_.events.push_back(e); });
      } else {
        real_.scaler->set_backoff_callback(nullptr);
      }
      return "";
    } else if (op < 92) {
      // Checkpoint into a fresh scaler through bytes, and carry on with it.
      log_ << "checkpoint\n";
      ++stats_.archives;
      std::ostringstream out;
      torch::save(*real_.scaler, out);
      ModelOptions fresh_o = random_options();
      fresh_o.enabled = model_.o.enabled;
      auto fresh = std::make_unique<GradScaler>(to_options(fresh_o, random_scale(fresh_o)));
      std::istringstream in(out.str());
      got = ::run([&] { torch::load(*fresh, in); });
      if (got != Outcome::kOk) {
        return std::string("checkpoint load: ") + name(got);
      }
      real_.scaler = std::move(fresh);
      if (!model_.o.enabled) {
        model_.o = fresh_o;  // a disabled scaler ignores the archive
      }
      for (auto& x : model_.opt) {
        x.stage = OptimizerStage::kReady;
        x.flag = x.flag_read = false;
        x.last_skipped = -1;
      }
      model_.report.reset();
      model_.callback = false;
      model_.scaled = false;  // a fresh scaler: no scale until its first scale()
      return "";
    } else {
      return "";  // observe only
    }
    if (want != Outcome::kOk) {
      ++stats_.refused;
    }
    if (want != got) {
      return std::string("expected ") + name(want) + ", got " + name(got);
    }
    return "";
  }

  std::string compare() {
    GradScaler& s = *real_.scaler;
    std::ostringstream d;
    const double want_scale = model_.o.enabled ? model_.scale : 1.0;
    if (s.get_scale() != want_scale) {
      d << "get_scale " << s.get_scale() << " model " << want_scale << "; ";
    }
    const auto state = s.state_dict();
    if (state != model_.state_dict()) {
      d << "state_dict " << describe(state) << " model "
        << describe(model_.state_dict()) << "; ";
    }
    const ScalerCounters c = s.counters();
    if (!operator_eq(c, model_.counters)) {
      d << "counters " << describe(c) << " model " << describe(model_.counters)
        << "; ";
    }
    for (int k = 0; k < kOptimizers; ++k) {
      const auto& m = model_.opt[k];
      if (s.stage(*real_.opt[k]) != (model_.o.enabled ? m.stage : OptimizerStage::kReady)) {
        d << "stage of " << k << "; ";
      }
      if (s.step_skipped(*real_.opt[k]) != (m.last_skipped == 1)) {
        d << "step_skipped of " << k << "; ";
      }
      for (int i = 0; i < kParams; ++i) {
        const torch::Tensor p = real_.params[k][i].detach();
        const torch::Tensor& g = real_.params[k][i].grad();
        if (g.defined() != m.grad_defined[i]) {
          d << "grad " << k << "." << i << " defined; ";
          continue;
        }
        for (int j = 0; j < kEntries; ++j) {
          if (!same_float(p[j].item<float>(), m.param[i][j])) {
            d << "param " << k << "." << i << "[" << j << "] " << p[j].item<float>() << " model "
              << m.param[i][j] << "; ";
          }
          if (g.defined() && !same_float(g[j].item<float>(), m.grad[i][j])) {
            d << "grad " << k << "." << i << "[" << j << "] " << g[j].item<float>() << " model "
              << m.grad[i][j] << "; ";
          }
        }
      }
    }
    const auto& report = s.last_overflow();
    if (report.has_value() != model_.report.has_value()) {
      d << "report presence " << report.has_value() << "; ";
    } else if (report.has_value()) {
      std::vector<ModelReportEntry> got;
      for (const auto& e : report->gradients) {
        got.push_back({real_.index_of(e.optimizer), static_cast<int>(e.param_group),
                       static_cast<int>(e.index), e.nan_count, e.inf_count});
      }
      auto want = model_.report->entries;
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      if (got != want || report->iteration != model_.report->iteration ||
          report->scale != model_.report->scale || report->optimizers != model_.report->optimizers ||
          report->uninspected_optimizers != model_.report->uninspected) {
        d << "report " << report->to_string() << " model iteration " << model_.report->iteration
          << " scale " << model_.report->scale << " optimizers " << model_.report->optimizers
          << " entries " << want.size() << "; ";
      }
    }
    if (real_.events.size() != model_.events.size()) {
      d << "backoff events " << real_.events.size() << " model " << model_.events.size() << "; ";
    } else {
      for (size_t i = 0; i < real_.events.size(); ++i) {
        const auto& e = real_.events[i];
        const auto& m = model_.events[i];
        if (e.iteration != m.iteration || e.old_scale != m.old_scale ||
            e.new_scale != m.new_scale || e.overflow_streak != m.streak) {
          d << "backoff event " << i << "; ";
        }
      }
    }
    return d.str();
  }

  std::mt19937_64 rng_;
  Stats& stats_;
  Model model_;
  Real real_;
  ModelOptions staged_;
  bool generic_ = false;
  bool odd_factors_ = false;
  std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force_;
  std::ostringstream log_;
};

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoll(v) : fallback;
}

TEST(PropertySequences, EveryObservableMatchesTheReferenceModel) {
  const int64_t sequences = env_or("LUCID_PROPERTY_SEQUENCES", 3000);
  const uint64_t seed = static_cast<uint64_t>(env_or("LUCID_PROPERTY_SEED", 20240611));
  Stats stats;
  std::mt19937_64 seeds(seed);
  for (int64_t n = 0; n < sequences; ++n) {
    const uint64_t sequence_seed = seeds();
    Sequence sequence(sequence_seed, stats);
    const int length = 10 + static_cast<int>(sequence_seed % 50);
    const std::string failure = sequence.run(length);
    ++stats.sequences;
    ASSERT_TRUE(failure.empty()) << "sequence " << n << " (seed " << seed << ", sequence seed "
                                 << sequence_seed << "):\n" << failure;
  }
  std::printf("property sequences: %lld sequences, %lld calls, %lld refused calls, %lld skipped "
              "steps, %lld backoffs, %lld divergence errors, %lld load_state_dict, %lld "
              "checkpoints\n",
              static_cast<long long>(stats.sequences), static_cast<long long>(stats.calls),
              static_cast<long long>(stats.refused), static_cast<long long>(stats.overflows),
              static_cast<long long>(stats.backoffs), static_cast<long long>(stats.divergences),
              static_cast<long long>(stats.loads), static_cast<long long>(stats.archives));
  RecordProperty("sequences", static_cast<int>(stats.sequences));
  RecordProperty("calls", static_cast<int>(stats.calls));
}

}  // namespace
