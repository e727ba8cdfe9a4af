#pragma once

// Helpers shared by the fault tests (test_guards, test_diagnostics, test_serialize,
// test_property_sequences): exact error types with message checks, a scaler's whole
// observable state, and tiny optimizers.

#include <lucid/amp.h>
#include <torch/torch.h>

#include <gtest/gtest.h>

#include <map>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

namespace fault_test {

// Succeeds when `f` throws exactly `E` (c10::Error, c10::ValueError, ...; not a subclass
// of it) with `needle` in its message.
template <typename E, typename F>
::testing::AssertionResult ThrowsExactly(const std::string& needle, F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    if (typeid(e) != typeid(E)) {
      return ::testing::AssertionFailure() << "expected " << typeid(E).name() << ", got "
                                           << typeid(e).name() << ": " << msg;
    }
    if (msg.find(needle) == std::string::npos) {
      return ::testing::AssertionFailure() << "message lacks \"" << needle << "\": " << msg;
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "expected a c10 error, got: " << e.what();
  } catch (...) {
    return ::testing::AssertionFailure() << "expected a c10 error, got an unknown exception";
  }
  return ::testing::AssertionFailure() << "expected " << typeid(E).name() << ", nothing thrown";
}

template <typename F>
::testing::AssertionResult ThrowsValueError(const std::string& needle, F&& f) {
  return ThrowsExactly<c10::ValueError>(needle, std::forward<F>(f));
}

template <typename F>
::testing::AssertionResult ThrowsError(const std::string& needle, F&& f) {
  return ThrowsExactly<c10::Error>(needle, std::forward<F>(f));
}

inline std::string describe(const std::map<std::string, double>& s) {
  std::ostringstream out;
  out << "{";
  for (const auto& kv : s) {
    out << kv.first << ": " << kv.second << ", ";
  }
  out << "}";
  return out.str();
}

inline std::string describe(const lucid::amp::ScalerCounters& c) {
  std::ostringstream out;
  out << "{taken " << c.steps_taken << ", skipped " << c.steps_skipped << ", updates "
      << c.updates << ", overflow_updates " << c.overflow_updates << ", backoffs " << c.backoffs
      << ", growths " << c.growths << ", streak " << c.overflow_streak << "}";
  return out.str();
}

inline bool operator_eq(const lucid::amp::ScalerCounters& a, const lucid::amp::ScalerCounters& b) {
  return a.steps_taken == b.steps_taken && a.steps_skipped == b.steps_skipped &&
         a.updates == b.updates && a.overflow_updates == b.overflow_updates &&
         a.backoffs == b.backoffs && a.growths == b.growths &&
         a.overflow_streak == b.overflow_streak;
}

// Everything a scaler shows without an optimizer: state, options, counters.
struct Observed {
  std::map<std::string, double> state;
  double scale;
  lucid::amp::ScalerCounters counters;
  double min_scale, max_scale;
  int64_t hysteresis;

  static Observed of(const lucid::amp::GradScaler& s) {
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

// One float32 parameter of `n` entries and an SGD(lr) over it.
struct OneParam {
  explicit OneParam(int64_t n = 4, double lr = 0.1)
      : param(torch::ones({n}, torch::requires_grad())),
        optimizer(std::vector<torch::Tensor>{param}, torch::optim::SGDOptions(lr)) {}
  void grad(const torch::Tensor& g) { param.mutable_grad() = g.clone(); }
  void clean_grad(float value = 8.0f) { grad(torch::full({param.numel()}, value)); }
  void inf_grad() {
    auto g = torch::full({param.numel()}, 8.0f);
    g[0] = std::numeric_limits<float>::infinity();
    grad(g);
  }
  torch::Tensor param;
  torch::optim::SGD optimizer;
};

// One iteration on `p`: a gradient with or without an inf, step, update.
inline void iterate(lucid::amp::GradScaler& scaler, OneParam& p, bool overflow) {
  if (overflow) {
    p.inf_grad();
  } else {
    p.clean_grad();
  }
  scaler.step(p.optimizer);
  scaler.update();
}

}  // namespace fault_test
