// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// What the scaler tests share: the names they use from lucid::amp, non-finite constants,
// exact error types (expect_throws.h), a scaler's whole observable state, and a tiny
// optimizer over one parameter. A test file includes this and says
// `using namespace lucid_test;` inside its anonymous namespace, so that a name it
// defines itself (a float kInf, its own fixture) takes precedence over the one here.

#include <lucid/amp.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include "expect_throws.h"

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace lucid_test {

using lucid::amp::BackoffEvent;
using lucid::amp::GradScaler;
using lucid::amp::GradScalerOptions;
using lucid::amp::NonFiniteGradient;
using lucid::amp::OptimizerStage;
using lucid::amp::ScalerCounters;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kFInf = std::numeric_limits<float>::infinity();
constexpr float kFNaN = std::numeric_limits<float>::quiet_NaN();

inline std::string describe(const std::map<std::string, double>& s) {
  std::ostringstream out;
  out << "{";
  for (const auto& kv : s) {
    out << kv.first << ": " << kv.second << ", ";
  }
  out << "}";
  return out.str();
}

inline std::string describe(const ScalerCounters& c) {
  std::ostringstream out;
  out << "{taken " << c.steps_taken << ", skipped " << c.steps_skipped << ", updates "
      << c.updates << ", overflow_updates " << c.overflow_updates << ", backoffs " << c.backoffs
      << ", growths " << c.growths << ", streak " << c.overflow_streak << ", unchecked updates "
      << c.updates_without_checks << ", steps without gradients " << c.steps_without_gradients
      << ", min_scale holds " << c.min_scale_holds << "}";
  return out.str();
}

inline bool operator_eq(const ScalerCounters& a, const ScalerCounters& b) {
  return a.steps_taken == b.steps_taken && a.steps_skipped == b.steps_skipped &&
         a.updates == b.updates && a.overflow_updates == b.overflow_updates &&
         a.backoffs == b.backoffs && a.growths == b.growths &&
         a.overflow_streak == b.overflow_streak &&
         a.updates_without_checks == b.updates_without_checks &&
         a.steps_without_gradients == b.steps_without_gradients &&
         a.min_scale_holds == b.min_scale_holds;
}

// Every counter at once, named in the failure:
//   EXPECT_TRUE(CountersAre(scaler.counters(), {taken, skipped, updates, overflow_updates,
//                                              backoffs, growths, overflow_streak}));
inline ::testing::AssertionResult CountersAre(const ScalerCounters& got,
                                              const ScalerCounters& want) {
  if (operator_eq(got, want)) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "counters " << describe(got) << ", expected "
                                       << describe(want);
}

// Everything a scaler shows without an optimizer: state, options, counters.
struct Observed {
  std::map<std::string, double> state;
  double scale;
  ScalerCounters counters;
  double min_scale, max_scale;
  int64_t hysteresis;

  static Observed of(const GradScaler& s) {
    return {s.state_dict(),          s.get_scale(),          s.counters(),
            s.options().min_scale(), s.options().max_scale(), s.options().hysteresis()};
  }
  bool operator==(const Observed& o) const {
    return state == o.state && scale == o.scale && operator_eq(counters, o.counters) &&
           min_scale == o.min_scale && max_scale == o.max_scale && hysteresis == o.hysteresis;
  }
  std::string str() const {
    std::ostringstream out;
    out << describe(state) << " scale " << scale << " " << describe(counters) << " min "
        << min_scale << " max " << max_scale << " hysteresis " << hysteresis;
    return out.str();
  }
};

// One parameter and an SGD(lr) over it: `n` float32 ones, or a tensor of the test's
// choice (another dtype, another device).
struct OneParam {
  explicit OneParam(int64_t n = 4, double lr = 0.1)
      : OneParam(torch::ones({n}), lr) {}
  explicit OneParam(torch::Tensor p, double lr = 0.1)
      : param(p.requires_grad_()),
        optimizer(std::vector<torch::Tensor>{param}, torch::optim::SGDOptions(lr)) {}
  void set_grad(const torch::Tensor& g) { param.mutable_grad() = g.clone(); }
  void clean_grad(float value = 8.0f) { set_grad(torch::full({param.numel()}, value)); }
  void inf_grad() {
    auto g = torch::full({param.numel()}, 8.0f);
    g[0] = std::numeric_limits<float>::infinity();
    set_grad(g);
  }
  // An inf in the gradient when `overflow`, else a clean one.
  void grad_for(bool overflow) {
    if (overflow) {
      inf_grad();
    } else {
      clean_grad();
    }
  }
  torch::Tensor param;
  torch::optim::SGD optimizer;
};

// The iteration's scale() call, on a loss of one on `device`: the first one makes the
// scale there, and unscale_, clip_grad_norm_, step and update refuse to run before it.
// A found-inf hook made of the test's functions; it combines norms where it has `norm`.
class FunctionHook final : public lucid::amp::FoundInfHook {
 public:
  using Flag = std::function<void(torch::Tensor&)>;
  using Norm = std::function<void(torch::Tensor&, torch::Tensor&, double)>;
  explicit FunctionHook(Flag flag, Norm norm = nullptr)
      : flag_(std::move(flag)), norm_(std::move(norm)) {}
  void agree_(torch::Tensor& found_inf) override { flag_(found_inf); }
  bool combines_norm() const override { return static_cast<bool>(norm_); }
  void agree_with_norm_(torch::Tensor& found_inf, torch::Tensor& partial, double p) override {
    norm_(found_inf, partial, p);
  }

 private:
  Flag flag_;
  Norm norm_;
};

inline std::shared_ptr<FunctionHook> hook_of(FunctionHook::Flag flag,
                                             FunctionHook::Norm norm = nullptr) {
  return std::make_shared<FunctionHook>(std::move(flag), std::move(norm));
}

inline void scale_loss(GradScaler& scaler, torch::Device device = torch::kCPU) {
  scaler.scale(torch::ones({}, torch::TensorOptions().device(device)));
}

// One iteration on `p`: scale(), a gradient with or without an inf, step, update.
inline void iterate(GradScaler& scaler, OneParam& p, bool overflow) {
  scale_loss(scaler, p.param.device());
  p.grad_for(overflow);
  scaler.step(p.optimizer);
  scaler.update();
}

// One iteration on a throw-away parameter: only whether it overflowed reaches the scaler.
inline void iterate(GradScaler& scaler, bool overflow) {
  OneParam p;
  iterate(scaler, p, overflow);
}

}  // namespace lucid_test
