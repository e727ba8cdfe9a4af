// SPDX-License-Identifier: BSD-3-Clause
// Training equivalence: PyTorch's own way of testing a loss scaler (test_grad_scaling_*
// in test/test_cuda.py / test_torch.py). A scaled run with overflows injected at chosen
// iterations (one gradient entry set to inf or NaN after the scaled backward) must end
// with the same parameters as an unscaled control run on the same data and the same
// initial weights that simply skips those iterations. Each test also checks the scale's
// sawtooth against an explicitly computed schedule, that step() returned std::nullopt
// exactly at the injected iterations, and that the comparison can fail at all (the
// weights moved, and a control that does not skip ends elsewhere).

#include <gtest/gtest.h>

#include <lucid/amp.h>
#include <torch/torch.h>

#include "amp/kernel_routing.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace {

using lucid::amp::GradScaler;
using lucid::amp::GradScalerOptions;

constexpr int kIterations = 8;
constexpr int64_t kBatch = 6;
constexpr int64_t kIn = 8;
constexpr int64_t kHidden = 16;
constexpr int64_t kOut = 4;

// ---------------------------------------------------------------------------------------
// Overflow injection.

enum class Poison { kInf, kNegInf, kNaN };

// One injected overflow: which iteration, which parameter (index into
// model->parameters()), which flat element, and what to write there.
struct Injection {
  int iteration;
  size_t param_index;
  int64_t element;
  Poison poison;
};

double poison_value(Poison p) {
  switch (p) {
    case Poison::kInf:
      return std::numeric_limits<double>::infinity();
    case Poison::kNegInf:
      return -std::numeric_limits<double>::infinity();
    case Poison::kNaN:
      return std::numeric_limits<double>::quiet_NaN();
  }
  return 0.0;
}

void poison_gradient(const torch::Tensor& param, int64_t element, Poison poison) {
  torch::NoGradGuard no_grad;
  ASSERT_TRUE(param.grad().defined()) << "nothing to poison: the parameter has no gradient";
  param.grad().view({-1})[element].fill_(poison_value(poison));
  ASSERT_FALSE(torch::isfinite(param.grad()).all().item<bool>());
}

std::set<int> iterations_of(const std::vector<Injection>& injections) {
  std::set<int> its;
  for (const auto& inj : injections) {
    its.insert(inj.iteration);
  }
  return its;
}

// ---------------------------------------------------------------------------------------
// The expected sawtooth, computed independently of the library: the scale after each
// update(), for a run whose update() at iteration i sees an overflow iff i is in
// `overflow_iterations`. Mirrors the float32 storage of the scale.

std::vector<double> expected_scales(double init_scale, double growth_factor,
                                    double backoff_factor, int64_t growth_interval,
                                    const std::set<int>& overflow_iterations, int iterations) {
  std::vector<double> scales;
  float scale = static_cast<float>(init_scale);
  int64_t tracker = 0;
  for (int i = 0; i < iterations; ++i) {
    if (overflow_iterations.count(i) != 0) {
      scale = static_cast<float>(static_cast<double>(scale) * backoff_factor);
      tracker = 0;
    } else if (++tracker == growth_interval) {
      scale = static_cast<float>(static_cast<double>(scale) * growth_factor);
      tracker = 0;
    }
    scales.push_back(scale);
  }
  return scales;
}

// ---------------------------------------------------------------------------------------
// Models, data, parameter snapshots.

torch::nn::Sequential make_mlp(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::ReLU(),
                               torch::nn::Linear(kHidden, kOut));
}

// A deep copy: same values, separate storage.
torch::nn::Sequential deep_copy(const torch::nn::Sequential& model) {
  auto copy = torch::nn::Sequential(
      std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone()));
  const auto a = model->parameters();
  const auto b = copy->parameters();
  EXPECT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_NE(a[i].data_ptr(), b[i].data_ptr()) << "clone() shared parameter " << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "clone() changed parameter " << i;
  }
  return copy;
}

struct MicroBatch {
  torch::Tensor x;
  torch::Tensor y;
};
// data[iteration][micro_batch]
using Dataset = std::vector<std::vector<MicroBatch>>;

Dataset make_data(int iterations, int micro_batches, uint64_t seed,
                  torch::Dtype dtype = torch::kFloat) {
  torch::manual_seed(seed);
  Dataset data(iterations);
  for (int i = 0; i < iterations; ++i) {
    for (int m = 0; m < micro_batches; ++m) {
      data[i].push_back({torch::randn({kBatch, kIn}).to(dtype),
                         torch::randn({kBatch, kOut}).to(dtype)});
    }
  }
  return data;
}

std::vector<torch::Tensor> snapshot(const torch::nn::Sequential& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) {
    out.push_back(p.detach().clone());
  }
  return out;
}

bool all_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
               double rtol, double atol) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::allclose(a[i], b[i], rtol, atol)) {
      return false;
    }
  }
  return true;
}

double max_abs_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

void expect_params_close(const std::vector<torch::Tensor>& scaled,
                         const std::vector<torch::Tensor>& control, double rtol, double atol) {
  ASSERT_EQ(scaled.size(), control.size());
  for (size_t i = 0; i < scaled.size(); ++i) {
    EXPECT_EQ(scaled[i].scalar_type(), control[i].scalar_type()) << "parameter " << i;
    EXPECT_TRUE(torch::isfinite(scaled[i]).all().item<bool>())
        << "parameter " << i << " of the scaled run holds inf/NaN: a poisoned step ran";
    EXPECT_TRUE(torch::allclose(scaled[i], control[i], rtol, atol))
        << "parameter " << i << " differs: max |scaled - control| = "
        << (scaled[i] - control[i]).abs().max().item<double>();
  }
}

double grad_norm(const std::vector<torch::Tensor>& params) {
  double sq = 0.0;
  for (const auto& p : params) {
    if (p.grad().defined()) {
      sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
    }
  }
  return std::sqrt(sq);
}

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// ---------------------------------------------------------------------------------------
// The two runs.

struct LoopConfig {
  int micro_batches = 1;     // > 1: gradient accumulation, loss divided by this
  double clip_max_norm = 0;  // > 0: unscale_, then clip_grad_norm_, then step
};

struct ScaledResult {
  std::vector<torch::Tensor> params;
  std::vector<bool> stepped;             // step() returned a value
  std::vector<double> scale_used;        // get_scale() during the iteration
  std::vector<double> scale_after;       // get_scale() after update()
  std::vector<double> scaled_grad_norm;  // after backward, before unscaling
  std::vector<double> unscaled_grad_norm;  // after step (or after clipping), finite iters
  std::vector<double> clip_norm;         // what clip_grad_norm_ returned
};

torch::Tensor mse(const torch::Tensor& out, const torch::Tensor& y) {
  return torch::mse_loss(out, y);
}

ScaledResult run_scaled(torch::nn::Sequential model, const OptimizerFactory& make_optimizer,
                        const Dataset& data, const std::vector<Injection>& injections,
                        const GradScalerOptions& options, const LoopConfig& config = {}) {
  ScaledResult r;
  auto optimizer = make_optimizer(model->parameters());
  GradScaler scaler(options);
  const auto params = model->parameters();
  for (int i = 0; i < static_cast<int>(data.size()); ++i) {
    optimizer->zero_grad();
    r.scale_used.push_back(scaler.get_scale());
    for (int m = 0; m < config.micro_batches; ++m) {
      const auto& mb = data[i][m];
      auto loss = mse(model->forward(mb.x), mb.y);
      if (config.micro_batches > 1) {
        loss = loss / static_cast<double>(config.micro_batches);
      }
      scaler.scale(loss).backward();
      if (m == 0) {
        // Poison after the first micro-batch: with accumulation, the later backward()
        // calls add onto the inf/NaN, as a real overflow would be carried.
        for (const auto& inj : injections) {
          if (inj.iteration == i) {
            poison_gradient(params.at(inj.param_index), inj.element, inj.poison);
          }
        }
      }
    }
    // Still scaled here; non-finite at the injected iterations.
    r.scaled_grad_norm.push_back(grad_norm(params));
    if (config.clip_max_norm > 0) {
      scaler.unscale_(*optimizer);
      r.clip_norm.push_back(torch::nn::utils::clip_grad_norm_(params, config.clip_max_norm));
    } else {
      r.clip_norm.push_back(0.0);
    }
    const std::optional<torch::Tensor> result = scaler.step(*optimizer);
    r.stepped.push_back(result.has_value());
    r.unscaled_grad_norm.push_back(grad_norm(params));
    scaler.update();
    r.scale_after.push_back(scaler.get_scale());
  }
  r.params = snapshot(model);
  return r;
}

struct ControlResult {
  std::vector<torch::Tensor> params;
  std::vector<double> grad_norm;  // before clipping; NaN at skipped iterations
  std::vector<double> clip_norm;
};

ControlResult run_control(torch::nn::Sequential model, const OptimizerFactory& make_optimizer,
                          const Dataset& data, const std::set<int>& skip,
                          const LoopConfig& config = {}) {
  ControlResult r;
  auto optimizer = make_optimizer(model->parameters());
  const auto params = model->parameters();
  for (int i = 0; i < static_cast<int>(data.size()); ++i) {
    if (skip.count(i) != 0) {
      r.grad_norm.push_back(std::numeric_limits<double>::quiet_NaN());
      r.clip_norm.push_back(std::numeric_limits<double>::quiet_NaN());
      continue;
    }
    optimizer->zero_grad();
    for (int m = 0; m < config.micro_batches; ++m) {
      const auto& mb = data[i][m];
      auto loss = mse(model->forward(mb.x), mb.y);
      if (config.micro_batches > 1) {
        loss = loss / static_cast<double>(config.micro_batches);
      }
      loss.backward();
    }
    r.grad_norm.push_back(grad_norm(params));
    if (config.clip_max_norm > 0) {
      r.clip_norm.push_back(torch::nn::utils::clip_grad_norm_(params, config.clip_max_norm));
    } else {
      r.clip_norm.push_back(0.0);
    }
    optimizer->step();
  }
  r.params = snapshot(model);
  return r;
}

// ---------------------------------------------------------------------------------------
// The whole check for one optimizer on one scaler.

struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
};

// The standard schedule of these tests: init 128, x2 after 3 clean updates, x0.5 on
// overflow; overflows at iterations 1 and 5 of 8. Scales after each update:
//   it0 128 (t1)  it1 64 (inf)  it2 64 (t1)  it3 64 (t2)  it4 128 (grown)
//   it5 64 (inf)  it6 64 (t1)   it7 64 (t2)
GradScalerOptions standard_options() {
  return GradScalerOptions().init_scale(128.0).growth_factor(2.0).backoff_factor(0.5)
      .growth_interval(3);
}

std::vector<Injection> standard_injections() {
  // An inf in the first layer's weight, a NaN in the last layer's bias.
  return {{1, 0, 5, Poison::kInf}, {5, 3, 2, Poison::kNaN}};
}

void check_equivalence(const OptimizerFactory& make_optimizer, const std::string& what,
                       torch::Dtype dtype = torch::kFloat, Tolerance tol = {},
                       const LoopConfig& config = {},
                       GradScalerOptions options = standard_options(),
                       std::vector<Injection> injections = standard_injections(),
                       const std::vector<double>* literal_scales = nullptr) {
  SCOPED_TRACE(what);
  auto model = make_mlp(/*seed=*/7);
  model->to(dtype);
  auto scaled_model = deep_copy(model);
  auto control_model = deep_copy(model);
  auto noskip_model = deep_copy(model);
  const auto initial = snapshot(model);
  const Dataset data = make_data(kIterations, config.micro_batches, /*seed=*/1234, dtype);
  const std::set<int> injected = iterations_of(injections);

  const ScaledResult scaled =
      run_scaled(scaled_model, make_optimizer, data, injections, options, config);
  const ControlResult control = run_control(control_model, make_optimizer, data, injected, config);
  const ControlResult noskip = run_control(noskip_model, make_optimizer, data, {}, config);

  // step() returned std::nullopt exactly at the injected iterations.
  for (int i = 0; i < kIterations; ++i) {
    EXPECT_EQ(scaled.stepped[i], injected.count(i) == 0)
        << "iteration " << i << ": step() " << (scaled.stepped[i] ? "ran" : "was skipped");
  }

  // The sawtooth, as computed independently (and, for the standard schedule, literally).
  const std::vector<double> expected =
      expected_scales(options.init_scale(), options.growth_factor(), options.backoff_factor(),
                      options.growth_interval(), injected, kIterations);
  if (literal_scales != nullptr) {
    ASSERT_EQ(expected, *literal_scales) << "the test's own schedule helper is wrong";
  }
  ASSERT_EQ(scaled.scale_after.size(), expected.size());
  for (int i = 0; i < kIterations; ++i) {
    EXPECT_NEAR(scaled.scale_after[i], expected[i], expected[i] * 1e-7)
        << "scale after update() of iteration " << i;
  }
  // The final get_scale() (the last entry) is the schedule's last value.
  EXPECT_NEAR(scaled.scale_after.back(), expected.back(), expected.back() * 1e-7)
      << "final get_scale()";

  // The scaled backward really was scaled, and unscaling gave back the true gradients.
  for (int i = 0; i < kIterations; ++i) {
    if (injected.count(i) != 0) {
      continue;
    }
    const double true_norm = control.grad_norm[i];
    ASSERT_GT(true_norm, 0.0);
    EXPECT_NEAR(scaled.scaled_grad_norm[i] / true_norm, scaled.scale_used[i],
                scaled.scale_used[i] * 1e-4)
        << "iteration " << i << ": the gradients of scale(loss).backward() are not "
        << "scale * the true gradients";
    if (config.clip_max_norm > 0) {
      EXPECT_NEAR(scaled.clip_norm[i], control.clip_norm[i], control.clip_norm[i] * 1e-4)
          << "iteration " << i << ": clip_grad_norm_ after unscale_ saw another norm";
      EXPECT_GT(control.clip_norm[i], config.clip_max_norm)
          << "iteration " << i << ": max_norm too large, nothing was clipped";
    } else {
      EXPECT_NEAR(scaled.unscaled_grad_norm[i], true_norm, true_norm * 1e-4)
          << "iteration " << i << ": the gradients after step() are not unscaled";
    }
  }

  // The equivalence itself.
  expect_params_close(scaled.params, control.params, tol.rtol, tol.atol);

  // ...and that it can fail: training moved the weights, and stepping at the injected
  // iterations would have ended somewhere else.
  EXPECT_GT(max_abs_diff(scaled.params, initial), 1e-3) << "training did not move the weights";
  EXPECT_FALSE(all_close(scaled.params, noskip.params, tol.rtol, tol.atol))
      << "a control that steps at the injected iterations ends at the same weights, so "
      << "the test could not tell skipping from stepping";
}

}  // namespace

// ---------------------------------------------------------------------------------------

namespace {

template <typename Opt, typename Options>
OptimizerFactory factory(Options options) {
  return [options](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<Opt>(std::move(params), options);
  };
}

const std::vector<double> kStandardScales = {128, 64, 64, 64, 128, 64, 64, 64};

}  // namespace

TEST(TrainingEquivalence, SgdPlainMatchesControlThatSkipsOverflowIterations) {
  check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)), "SGD",
                    torch::kFloat, {}, {}, standard_options(), standard_injections(),
                    &kStandardScales);
}

TEST(TrainingEquivalence, SgdMomentumMatchesControl) {
  check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9)),
                    "SGD momentum", torch::kFloat, {}, {}, standard_options(),
                    standard_injections(), &kStandardScales);
}

TEST(TrainingEquivalence, SgdNesterovWithWeightDecayMatchesControl) {
  check_equivalence(
      factory<torch::optim::SGD>(
          torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-2)),
      "SGD nesterov + weight decay", torch::kFloat, {}, {}, standard_options(),
      standard_injections(), &kStandardScales);
}

TEST(TrainingEquivalence, AdamMatchesControl) {
  check_equivalence(factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)), "Adam",
                    torch::kFloat, {}, {}, standard_options(), standard_injections(),
                    &kStandardScales);
}

TEST(TrainingEquivalence, AdamAmsgradWithWeightDecayMatchesControl) {
  check_equivalence(factory<torch::optim::Adam>(
                        torch::optim::AdamOptions(0.01).amsgrad(true).weight_decay(1e-2)),
                    "Adam amsgrad + weight decay", torch::kFloat, {}, {}, standard_options(),
                    standard_injections(), &kStandardScales);
}

TEST(TrainingEquivalence, AdamWMatchesControl) {
  check_equivalence(
      factory<torch::optim::AdamW>(torch::optim::AdamWOptions(0.01).weight_decay(0.1)), "AdamW",
      torch::kFloat, {}, {}, standard_options(), standard_injections(), &kStandardScales);
}

TEST(TrainingEquivalence, RmspropAndAdagradMatchControl) {
  check_equivalence(
      factory<torch::optim::RMSprop>(torch::optim::RMSpropOptions(0.01).momentum(0.5)),
      "RMSprop", torch::kFloat, {}, {}, standard_options(), standard_injections(),
      &kStandardScales);
  check_equivalence(factory<torch::optim::Adagrad>(torch::optim::AdagradOptions(0.1)), "Adagrad",
                    torch::kFloat, {}, {}, standard_options(), standard_injections(),
                    &kStandardScales);
}

// Overflows at 0 (the very first iteration, before any step) and at two consecutive
// iterations; -inf as well. Scales: 64 32 16 16 16 32 32 32.
TEST(TrainingEquivalence, SgdMomentumWithBackToBackOverflowsMatchesControl) {
  const std::vector<double> scales = {64, 32, 16, 16, 16, 32, 32, 32};
  check_equivalence(
      factory<torch::optim::SGD>(torch::optim::SGDOptions(0.05).momentum(0.9)),
      "SGD momentum, overflows at 0, 1, 2", torch::kFloat, {}, {}, standard_options(),
      {{0, 1, 0, Poison::kNegInf}, {1, 2, 7, Poison::kNaN}, {2, 0, 3, Poison::kInf}}, &scales);
}

// A scale and factors that are not powers of two: unscaling is no longer exact, so the
// runs agree within float32 rounding only.
TEST(TrainingEquivalence, SgdWithNonPowerOfTwoScaleMatchesWithinRounding) {
  check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.5)),
                    "SGD, scale 1000, growth 3, backoff 0.3", torch::kFloat, {}, {},
                    GradScalerOptions().init_scale(1000.0).growth_factor(3.0)
                        .backoff_factor(0.3).growth_interval(2));
}

TEST(TrainingEquivalence, ClippingAfterUnscaleMatchesControlClippingTrueGradients) {
  LoopConfig config;
  config.clip_max_norm = 0.05;
  check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)),
                    "SGD momentum + clip_grad_norm_ after unscale_", torch::kFloat, {}, config,
                    standard_options(), standard_injections(), &kStandardScales);
  check_equivalence(factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)),
                    "Adam + clip_grad_norm_ after unscale_", torch::kFloat, {}, config,
                    standard_options(), standard_injections(), &kStandardScales);
}

TEST(TrainingEquivalence, GradientAccumulationOverTwoMicroBatchesMatchesControl) {
  LoopConfig config;
  config.micro_batches = 2;
  check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)),
                    "SGD momentum, 2 micro-batches", torch::kFloat, {}, config,
                    standard_options(), standard_injections(), &kStandardScales);
  check_equivalence(factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)),
                    "Adam, 2 micro-batches", torch::kFloat, {}, config, standard_options(),
                    standard_injections(), &kStandardScales);
}

TEST(TrainingEquivalence, GenericBackendSgdMatchesControl) {
  ASSERT_FALSE(lucid::amp::detail::generic_backend_forced());
  {
    lucid::amp::detail::ForceGenericBackendGuard force_generic;
    ASSERT_TRUE(lucid::amp::detail::generic_backend_forced());
    // The control run does not touch the scaler, so holding the guard over it too is
    // harmless; the scaled run is the one that must take the generic path.
    check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1)),
                      "SGD, generic backend", torch::kFloat, {}, {}, standard_options(),
                      standard_injections(), &kStandardScales);
    check_equivalence(factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)),
                      "Adam, generic backend", torch::kFloat, {}, {}, standard_options(),
                      standard_injections(), &kStandardScales);
    LoopConfig clip;
    clip.clip_max_norm = 0.05;
    check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)),
                      "SGD momentum + clipping, generic backend", torch::kFloat, {}, clip,
                      standard_options(), standard_injections(), &kStandardScales);
  }
  EXPECT_FALSE(lucid::amp::detail::generic_backend_forced());
}

TEST(TrainingEquivalence, Float64ModelMatchesFloat64ControlTightly) {
  Tolerance tight;
  tight.rtol = 1e-12;
  tight.atol = 1e-14;
  check_equivalence(factory<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)),
                    "float64 SGD momentum", torch::kDouble, tight, {}, standard_options(),
                    standard_injections(), &kStandardScales);
  check_equivalence(factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)),
                    "float64 Adam", torch::kDouble, tight, {}, standard_options(),
                    standard_injections(), &kStandardScales);
  {
    lucid::amp::detail::ForceGenericBackendGuard force_generic;
    check_equivalence(factory<torch::optim::Adam>(torch::optim::AdamOptions(0.01)),
                      "float64 Adam, generic backend", torch::kDouble, tight, {},
                      standard_options(), standard_injections(), &kStandardScales);
  }
}

// The gradients stay float64 through unscaling (dtypes never change).
TEST(TrainingEquivalence, Float64GradientsStayFloat64AfterUnscale) {
  auto model = make_mlp(3);
  model->to(torch::kDouble);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler(standard_options());
  auto x = torch::randn({kBatch, kIn}, torch::kDouble);
  auto y = torch::randn({kBatch, kOut}, torch::kDouble);
  opt.zero_grad();
  auto scaled_loss = scaler.scale(mse(model->forward(x), y));
  EXPECT_EQ(scaled_loss.scalar_type(), torch::kDouble);
  scaled_loss.backward();
  scaler.unscale_(opt);
  for (const auto& p : model->parameters()) {
    EXPECT_EQ(p.grad().scalar_type(), torch::kDouble);
  }
  EXPECT_TRUE(scaler.step(opt).has_value());
  scaler.update();
}

// Two optimizers on one scaler (SGD+momentum on the first layer, Adam on the last).
// An overflow in one optimizer's gradients skips only that optimizer's step; update()
// backs the scale off all the same. Control: the other optimizer steps, that one skips.
TEST(TrainingEquivalence, TwoOptimizersOverflowSkipsOnlyTheAffectedOptimizer) {
  auto model = make_mlp(11);
  auto scaled_model = deep_copy(model);
  auto control_model = deep_copy(model);
  const auto initial = snapshot(model);
  const Dataset data = make_data(kIterations, 1, /*seed=*/99);

  auto first_params = [](torch::nn::Sequential& m) {
    auto p = m->parameters();
    return std::vector<torch::Tensor>{p[0], p[1]};
  };
  auto second_params = [](torch::nn::Sequential& m) {
    auto p = m->parameters();
    return std::vector<torch::Tensor>{p[2], p[3]};
  };

  // Iteration 1: overflow in the second optimizer's gradients only.
  // Iteration 5: overflow in the first optimizer's gradients only.
  const std::set<int> skip_first = {5};
  const std::set<int> skip_second = {1};

  // Scaled run.
  std::vector<bool> stepped_first, stepped_second;
  std::vector<double> scales;
  {
    torch::optim::SGD opt1(first_params(scaled_model),
                           torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::Adam opt2(second_params(scaled_model), torch::optim::AdamOptions(0.01));
    GradScaler scaler(standard_options());
    for (int i = 0; i < kIterations; ++i) {
      opt1.zero_grad();
      opt2.zero_grad();
      scaler.scale(mse(scaled_model->forward(data[i][0].x), data[i][0].y)).backward();
      if (skip_second.count(i) != 0) {
        poison_gradient(second_params(scaled_model)[0], 4, Poison::kInf);
      }
      if (skip_first.count(i) != 0) {
        poison_gradient(first_params(scaled_model)[1], 0, Poison::kNaN);
      }
      stepped_first.push_back(scaler.step(opt1).has_value());
      stepped_second.push_back(scaler.step(opt2).has_value());
      scaler.update();
      scales.push_back(scaler.get_scale());
    }
  }

  // Control run.
  {
    torch::optim::SGD opt1(first_params(control_model),
                           torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::Adam opt2(second_params(control_model), torch::optim::AdamOptions(0.01));
    for (int i = 0; i < kIterations; ++i) {
      opt1.zero_grad();
      opt2.zero_grad();
      mse(control_model->forward(data[i][0].x), data[i][0].y).backward();
      if (skip_first.count(i) == 0) {
        opt1.step();
      }
      if (skip_second.count(i) == 0) {
        opt2.step();
      }
    }
  }

  for (int i = 0; i < kIterations; ++i) {
    EXPECT_EQ(stepped_first[i], skip_first.count(i) == 0) << "first optimizer, iteration " << i;
    EXPECT_EQ(stepped_second[i], skip_second.count(i) == 0)
        << "second optimizer, iteration " << i;
  }

  // Any optimizer's overflow backs the scale off: the standard sawtooth.
  const std::vector<double> expected =
      expected_scales(128.0, 2.0, 0.5, 3, {1, 5}, kIterations);
  ASSERT_EQ(expected, kStandardScales);
  EXPECT_EQ(scales, expected);
  EXPECT_EQ(scales.back(), 64.0);

  const auto scaled_params = snapshot(scaled_model);
  const auto control_params = snapshot(control_model);
  expect_params_close(scaled_params, control_params, 1e-5, 1e-6);

  // Both halves trained, and a control in which both optimizers skip (or neither does)
  // at an overflow would differ.
  for (size_t i = 0; i < initial.size(); ++i) {
    EXPECT_GT((scaled_params[i] - initial[i]).abs().max().item<double>(), 1e-3)
        << "parameter " << i << " did not move";
  }
  auto both_skip_model = deep_copy(model);
  {
    torch::optim::SGD opt1(first_params(both_skip_model),
                           torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::Adam opt2(second_params(both_skip_model), torch::optim::AdamOptions(0.01));
    for (int i = 0; i < kIterations; ++i) {
      if (i == 1 || i == 5) {
        continue;
      }
      opt1.zero_grad();
      opt2.zero_grad();
      mse(both_skip_model->forward(data[i][0].x), data[i][0].y).backward();
      opt1.step();
      opt2.step();
    }
  }
  EXPECT_FALSE(all_close(scaled_params, snapshot(both_skip_model), 1e-5, 1e-6))
      << "skipping both optimizers gives the same weights: the test cannot tell";
}
