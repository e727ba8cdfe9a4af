// SPDX-License-Identifier: BSD-3-Clause
// GradScaler's public behaviour, one TEST per documented behaviour of the contract
// (docs/behaviour.md): scale(), the
// scale/step/update loop, the per-optimizer stage machine, closures, the disabled
// pass-through, refused gradient dtypes, unscaling per dtype, non-finite gradients,
// sparse gradients, several optimizers, and the growth/backoff schedule.
//
// The numeric behaviours run twice (suite GradScalerBackend): on the native backends
// and with lucid::amp::detail::ForceGenericBackendGuard routing every device to the
// generic ATen-ops path (the path Apple MPS and other devices take).

#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"

#include <cfloat>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace {

using namespace lucid_test;

constexpr double kDefaultScale = 65536.0;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ---------------------------------------------------------------------------------------
// Fixtures.

// A float32 parameter whose gradient the test sets by hand, in its own SGD (lr 1).
struct HandParam {
  torch::Tensor param;
  torch::optim::SGD opt;

  explicit HandParam(std::vector<float> values, double lr = 1.0,
                     torch::Device device = torch::kCPU)
      : param(torch::tensor(values, torch::TensorOptions().device(device)).requires_grad_()),
        opt(std::vector<torch::Tensor>{param}, torch::optim::SGDOptions(lr)) {}

  void set_grad(const torch::Tensor& grad) { param.mutable_grad() = grad; }
  torch::Tensor grad() const { return param.grad(); }
};

// SGD whose step() returns a tensor the test can recognise and counts its calls, to
// check that GradScaler::step returns what optimizer.step() returned, or skips it.
class MarkingSGD : public torch::optim::SGD {
 public:
  MarkingSGD(std::vector<torch::Tensor> params, double lr)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(lr)) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    ++calls;
    torch::optim::SGD::step(std::move(closure));
    return marker;
  }

  torch::Tensor marker = torch::full({}, 42.0);
  int calls = 0;
};

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> out;
  for (const auto& t : tensors) {
    out.push_back(t.detach().clone());
  }
  return out;
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) {
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) {
      return false;
    }
  }
  return true;
}

// A float32 gradient with known values (as if backward() of a loss scaled by `s` had
// produced s * values).
torch::Tensor scaled(std::vector<float> values, double s, torch::Device device = torch::kCPU) {
  return torch::tensor(values, torch::TensorOptions().device(device)) * s;
}

// `got` is `want` or one of its two float neighbours.
template <typename T>
bool within_one_ulp(T got, T want) {
  return got == want || got == std::nextafter(want, std::numeric_limits<T>::infinity()) ||
         got == std::nextafter(want, -std::numeric_limits<T>::infinity());
}

// Records an overflow (or none) for the next update(), through a throw-away optimizer.
void record_iteration(GradScaler& scaler, bool overflow, torch::Device device = torch::kCPU) {
  scale_loss(scaler, device);
  HandParam p({1.0f}, 1.0, device);
  p.set_grad(torch::tensor({overflow ? kInf : 1.0f}, torch::TensorOptions().device(device)));
  scaler.unscale_(p.opt);
  scaler.update();
}

// ---------------------------------------------------------------------------------------
// scale()

TEST(GradScalerScale, ReturnsOutputsTimesScaleWithSameShape) {
  GradScaler scaler;
  const auto loss = torch::scalar_tensor(1.5);
  const auto out = scaler.scale(loss);
  EXPECT_EQ(out.dim(), 0) << "a 0-dim loss must stay 0-dim, got sizes " << out.sizes();
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_EQ(out.item<float>(), 1.5f * 65536.0f);

  torch::manual_seed(0);
  const auto column = torch::randn({8, 1});
  const auto out2 = scaler.scale(column);
  EXPECT_EQ(out2.sizes(), column.sizes());
  EXPECT_TRUE(torch::equal(out2, column * 65536.0));
}

TEST(GradScalerScale, UsesTheCurrentScaleAfterUpdate) {
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  EXPECT_EQ(scaler.scale(torch::scalar_tensor(3.0)).item<float>(), 24.0f);
  scaler.update(0.25);
  EXPECT_EQ(scaler.scale(torch::scalar_tensor(3.0)).item<float>(), 0.75f);
}

TEST(GradScalerScale, KeepsTheAutogradGraph) {
  GradScaler scaler(GradScalerOptions().init_scale(1024.0));
  const auto x = torch::tensor({1.0f, -2.0f, 3.0f}).requires_grad_();
  const auto loss = (x * x).sum();
  const auto out = scaler.scale(loss);
  ASSERT_TRUE(out.requires_grad());
  out.backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(torch::equal(x.grad(), torch::tensor({2.0f, -4.0f, 6.0f}) * 1024.0))
      << x.grad();
}

TEST(GradScalerScale, Float16OutputIsPromotedToFloat32AndDoesNotOverflow) {
  GradScaler scaler;
  const auto loss = torch::full({}, 2.0, torch::kHalf);
  const auto out = scaler.scale(loss);
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_EQ(out.dim(), 0);
  EXPECT_EQ(out.item<float>(), 131072.0f) << "an fp16 loss of 2 times 65536 must not be inf";
}

TEST(GradScalerScale, BFloat16OutputIsPromotedToFloat32) {
  GradScaler scaler(GradScalerOptions().init_scale(3.0));
  // 1.0078125 is exact in bfloat16; times 3 it is not (bfloat16 would round it to 3.03125).
  const auto loss = torch::full({2}, 1.0078125, torch::kBFloat16);
  const auto out = scaler.scale(loss);
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_EQ(out.sizes(), loss.sizes());
  EXPECT_EQ(out[0].item<float>(), 3.0234375f);
}

TEST(GradScalerScale, Float64OutputStaysFloat64) {
  GradScaler scaler;
  const double value = 1.0 + 1e-12;  // not representable in float32
  const auto out = scaler.scale(torch::full({3}, value, torch::kDouble));
  EXPECT_EQ(out.scalar_type(), torch::kDouble);
  EXPECT_EQ(out[1].item<double>(), value * kDefaultScale);
}

TEST(GradScalerScale, VectorFormScalesEachElement) {
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  const std::vector<torch::Tensor> outputs = {torch::scalar_tensor(1.0),
                                              torch::full({2, 3}, 0.5, torch::kBFloat16),
                                              torch::full({4}, 2.0, torch::kDouble)};
  const auto out = scaler.scale(outputs);
  ASSERT_EQ(out.size(), outputs.size());
  EXPECT_EQ(out[0].dim(), 0);
  EXPECT_EQ(out[0].item<float>(), 4.0f);
  EXPECT_EQ(out[1].sizes(), outputs[1].sizes());
  EXPECT_EQ(out[1].scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(out[1], torch::full({2, 3}, 2.0)));
  EXPECT_EQ(out[2].scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::equal(out[2], torch::full({4}, 8.0, torch::kDouble)));
}

TEST(GradScalerScale, DisabledReturnsTheInputItself) {
  GradScaler scaler(GradScalerOptions().enabled(false));
  const auto loss = torch::full({}, 2.0, torch::kHalf);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  const std::vector<torch::Tensor> outputs = {torch::ones({2}), torch::zeros({})};
  const auto out = scaler.scale(outputs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].is_same(outputs[0]));
  EXPECT_TRUE(out[1].is_same(outputs[1]));
}

// ---------------------------------------------------------------------------------------
// The scale / step / update loop.

TEST(GradScalerLoop, ScaleStepUpdateTrainsASmallModel) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  torch::nn::MSELoss loss_fn;
  GradScaler scaler;
  const auto before = clone_all(model->parameters());
  for (int i = 0; i < 3; ++i) {
    const auto x = torch::randn({8, 4}), y = torch::randn({8, 1});
    optimizer.zero_grad();
    const auto loss = loss_fn(model->forward(x), y);
    scaler.scale(loss).backward();
    EXPECT_TRUE(scaler.step(optimizer).has_value()) << "iteration " << i;
    scaler.update();
  }
  const auto after = model->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_FALSE(torch::equal(after[i], before[i])) << "parameter " << i << " never moved";
  }
  EXPECT_EQ(scaler.get_scale(), kDefaultScale);
}

TEST(GradScalerLoop, StepReturnsWhatOptimizerStepReturned) {
  HandParam p({1.0f, 2.0f});
  MarkingSGD opt({p.param}, 1.0);
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({0.5f, 0.25f}, kDefaultScale));
  const auto result = scaler.step(opt);
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(opt.calls, 1);
  EXPECT_TRUE(result->is_same(opt.marker)) << "step must hand back optimizer.step()'s tensor";
  EXPECT_TRUE(torch::equal(p.param.detach(), torch::tensor({0.5f, 1.75f})));
}

TEST(GradScalerLoop, StepReturnsUndefinedTensorWhenOptimizerReturnsNone) {
  // torch::optim::SGD::step() without a closure returns an undefined tensor.
  HandParam p({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({1.0f}, kDefaultScale));
  const auto result = scaler.step(p.opt);
  ASSERT_TRUE(result.has_value()) << "an optimizer step that ran must not read as skipped";
  EXPECT_FALSE(result->defined());
  EXPECT_EQ(p.param.item<float>(), 0.0f);
}

TEST(GradScalerLoop, StepIsSkippedWhenAGradientHoldsInf) {
  HandParam p({1.0f, 2.0f});
  MarkingSGD opt({p.param}, 1.0);
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(torch::tensor({1.0f, kInf}));
  EXPECT_FALSE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 0);
  EXPECT_TRUE(torch::equal(p.param.detach(), torch::tensor({1.0f, 2.0f})));
}

TEST(GradScalerLoop, StepIsSkippedWhenAGradientHoldsNaN) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 1);
  MarkingSGD opt(model->parameters(), 0.1);
  GradScaler scaler;
  scaler.scale(model->forward(torch::randn({8, 4})).sum()).backward();
  model->bias.grad().fill_(kNaN);
  const auto before = clone_all(model->parameters());
  EXPECT_FALSE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 0);
  EXPECT_TRUE(all_equal(clone_all(model->parameters()), before));
}

TEST(GradScalerLoop, SkippedStepLeavesAdamUntouched) {
  // A skipped step must not call optimizer.step(): Adam would create its state (step
  // count, moments) and move the parameters even with zero-ish gradients.
  auto w = torch::tensor({1.0f, 2.0f}).requires_grad_();
  torch::optim::Adam adam(std::vector<torch::Tensor>{w}, torch::optim::AdamOptions(0.1));
  GradScaler scaler;
  scale_loss(scaler);
  w.mutable_grad() = torch::tensor({kNaN, 1.0f});
  EXPECT_FALSE(scaler.step(adam).has_value());
  EXPECT_TRUE(adam.state().empty()) << "Adam::step ran on an overflowed iteration";
  EXPECT_TRUE(torch::equal(w.detach(), torch::tensor({1.0f, 2.0f})));
  scaler.update();
  w.mutable_grad() = scaled({1.0f, -1.0f}, scaler.get_scale());
  const auto result = scaler.step(adam);
  ASSERT_TRUE(result.has_value());
  EXPECT_FALSE(adam.state().empty());
  // Adam's first step moves each weight by lr against the gradient's sign.
  EXPECT_TRUE(torch::allclose(w.detach(), torch::tensor({0.9f, 2.1f}), 1e-5, 1e-6)) << w;
}

// ---------------------------------------------------------------------------------------
// The per-optimizer stage machine: ready -> unscaled -> stepped, update -> ready.

TEST(GradScalerStages, StageAccessorFollowsReadyUnscaledStepped) {
  HandParam p({1.0f});
  HandParam never_seen({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({1.0f}, kDefaultScale));
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kReady);
  scaler.unscale_(p.opt);
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kUnscaled);
  scaler.step(p.opt);
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kStepped);
  EXPECT_EQ(scaler.stage(never_seen.opt), OptimizerStage::kReady);
  scaler.update();
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kReady);
}

// A C++ optimizer's key is its address, whichever way it is spelt; a front's numbered key
// names the same optimizer as the address with that number. The null key is refused.
TEST(GradScalerStages, OptimizerKeysNameOptimizersByAddressOrNumber) {
  HandParam p({1.0f});
  const lucid::amp::OptimizerKey key = &p.opt;
  EXPECT_TRUE(key == &p.opt);
  EXPECT_EQ(key, lucid::amp::OptimizerKey::from_id(reinterpret_cast<std::uintptr_t>(&p.opt)));
  EXPECT_NE(key, lucid::amp::OptimizerKey());
  EXPECT_FALSE(static_cast<bool>(lucid::amp::OptimizerKey()));
  EXPECT_EQ(std::hash<lucid::amp::OptimizerKey>()(key),
            std::hash<std::uintptr_t>()(reinterpret_cast<std::uintptr_t>(&p.opt)));
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({1.0f}, kDefaultScale));
  scaler.unscale_(p.opt);
  EXPECT_EQ(scaler.stage(key), OptimizerStage::kUnscaled);
  EXPECT_EQ(scaler.stage(lucid::amp::OptimizerKey::from_id(key.id())), OptimizerStage::kUnscaled);
  lucid::amp::OptimizerView view;
  view.param_groups.emplace_back(p.opt.param_groups()[0].params());
  EXPECT_TRUE(ThrowsValueError("key must not be null", [&] { scaler.unscale_(view); }));
  EXPECT_EQ(scaler.stage(lucid::amp::OptimizerKey()), OptimizerStage::kReady);
}

TEST(GradScalerStages, StepWithoutUnscaleMovesReadyToStepped) {
  HandParam p({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({1.0f}, kDefaultScale));
  scaler.step(p.opt);
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kStepped);
}

TEST(GradScalerStages, UnscaleTwiceThrowsRuntimeError) {
  HandParam p({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({3.0f}, kDefaultScale));
  scaler.unscale_(p.opt);
  EXPECT_TRUE(ThrowsError("already been called",
                            [&] { scaler.unscale_(p.opt); }));
  EXPECT_EQ(p.grad().item<float>(), 3.0f) << "the refused unscale_ divided again";
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kUnscaled);
}

TEST(GradScalerStages, UnscaleAfterStepThrowsRuntimeError) {
  HandParam p({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({3.0f}, kDefaultScale));
  scaler.step(p.opt);
  EXPECT_TRUE(ThrowsError("after step", [&] { scaler.unscale_(p.opt); }));
  EXPECT_EQ(p.grad().item<float>(), 3.0f);
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kStepped);
}

TEST(GradScalerStages, StepTwiceBeforeUpdateThrowsRuntimeError) {
  HandParam p({10.0f});
  MarkingSGD opt({p.param}, 1.0);
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({1.0f}, kDefaultScale));
  ASSERT_TRUE(scaler.step(opt).has_value());
  EXPECT_TRUE(ThrowsError("already been called", [&] { scaler.step(opt); }));
  EXPECT_EQ(opt.calls, 1);
  EXPECT_EQ(p.param.item<float>(), 9.0f);
}

TEST(GradScalerStages, StepTwiceAfterASkippedStepThrowsRuntimeError) {
  HandParam p({10.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(torch::tensor({kInf}));
  ASSERT_FALSE(scaler.step(p.opt).has_value());
  EXPECT_TRUE(
      ThrowsError("already been called", [&] { scaler.step(p.opt); }));
}

TEST(GradScalerStages, UpdateReturnsEveryOptimizerToReady) {
  HandParam a({1.0f}), b({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  a.set_grad(scaled({1.0f}, kDefaultScale));
  b.set_grad(scaled({1.0f}, kDefaultScale));
  scaler.unscale_(a.opt);
  scaler.step(b.opt);
  scaler.update();
  EXPECT_EQ(scaler.stage(a.opt), OptimizerStage::kReady);
  EXPECT_EQ(scaler.stage(b.opt), OptimizerStage::kReady);
  // unscale_ and step are allowed again, and divide by the scale again.
  a.set_grad(scaled({6.0f}, kDefaultScale));
  b.set_grad(scaled({5.0f}, kDefaultScale));
  EXPECT_NO_THROW(scaler.unscale_(a.opt));
  EXPECT_NO_THROW(scaler.unscale_(b.opt));
  EXPECT_EQ(a.grad().item<float>(), 6.0f);
  EXPECT_EQ(b.grad().item<float>(), 5.0f);
  EXPECT_NO_THROW(scaler.step(a.opt));
  EXPECT_NO_THROW(scaler.step(b.opt));
}

TEST(GradScalerStages, UpdateWithNewScaleAlsoReturnsOptimizersToReady) {
  HandParam p({1.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({1.0f}, kDefaultScale));
  scaler.step(p.opt);
  scaler.update(1024.0);
  EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kReady);
  p.set_grad(scaled({2.0f}, 1024.0));
  EXPECT_NO_THROW(scaler.unscale_(p.opt));
  EXPECT_EQ(p.grad().item<float>(), 2.0f);
}

TEST(GradScalerStages, StepAfterUnscaleDoesNotDivideASecondTime) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 3);
  torch::nn::Linear reference(4, 3);
  {
    torch::NoGradGuard no_grad;
    reference->weight.copy_(model->weight);
    reference->bias.copy_(model->bias);
  }
  const auto x = torch::randn({8, 4}), y = torch::randn({8, 3});
  torch::nn::MSELoss loss_fn;
  // The true gradients: an unscaled backward on an identical model.
  loss_fn(reference->forward(x), y).backward();
  const auto true_grads = std::vector<torch::Tensor>{reference->weight.grad().clone(),
                                                     reference->bias.grad().clone()};

  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5));
  GradScaler scaler;
  scaler.scale(loss_fn(model->forward(x), y)).backward();
  scaler.unscale_(optimizer);
  const auto weight_before = model->weight.detach().clone();
  ASSERT_TRUE(scaler.step(optimizer).has_value());
  // SGD leaves the gradients it used in place: they are the true ones, not divided twice.
  EXPECT_TRUE(torch::allclose(model->weight.grad(), true_grads[0], 1e-6, 1e-9))
      << model->weight.grad() << "\nvs\n" << true_grads[0];
  EXPECT_TRUE(torch::allclose(model->bias.grad(), true_grads[1], 1e-6, 1e-9));
  EXPECT_TRUE(torch::allclose(model->weight.detach(), weight_before - 0.5 * true_grads[0],
                              1e-6, 1e-7));
}

TEST(GradScalerStages, ClippingBetweenUnscaleAndStepIsWhatTheOptimizerUses) {
  // The reference API's second example: unscale_, clip the real gradients, then step.
  HandParam p({0.0f, 0.0f});
  GradScaler scaler;
  scale_loss(scaler);
  p.set_grad(scaled({3.0f, 4.0f}, kDefaultScale));  // true norm 5
  scaler.unscale_(p.opt);
  const double norm = torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{p.param}, 1.0);
  EXPECT_NEAR(norm, 5.0, 1e-5) << "clip_grad_norm_ saw gradients that were not unscaled";
  ASSERT_TRUE(scaler.step(p.opt).has_value());
  EXPECT_TRUE(torch::allclose(p.param.detach(), torch::tensor({-0.6f, -0.8f}), 1e-5, 1e-6))
      << p.param;
}

// ---------------------------------------------------------------------------------------
// Closures.

TEST(GradScalerClosure, ClosureWhileEnabledThrowsAndNothingSteps) {
  HandParam p({1.0f});
  MarkingSGD opt({p.param}, 1.0);
  GradScaler scaler;
  p.set_grad(scaled({1.0f}, kDefaultScale));
  int closure_runs = 0;
  const torch::optim::Optimizer::LossClosure closure = [&] {
    ++closure_runs;
    return torch::zeros({});
  };
  EXPECT_TRUE(ThrowsError("closure", [&] { scaler.step(opt, closure); }));
  EXPECT_EQ(closure_runs, 0);
  EXPECT_EQ(opt.calls, 0);
  EXPECT_EQ(p.param.item<float>(), 1.0f);
  EXPECT_EQ(p.grad().item<float>(), 65536.0f) << "a refused step unscaled the gradients";
  EXPECT_NE(scaler.stage(opt), OptimizerStage::kStepped);
}

// ---------------------------------------------------------------------------------------
// Disabled scaler: a transparent pass-through.

TEST(GradScalerDisabled, StepCallsTheOptimizerDirectly) {
  HandParam p({1.0f});
  MarkingSGD opt({p.param}, 1.0);
  GradScaler scaler(GradScalerOptions().enabled(false));
  p.set_grad(torch::tensor({0.25f}));  // not divided by anything
  const auto result = scaler.step(opt);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->is_same(opt.marker));
  EXPECT_EQ(p.param.item<float>(), 0.75f);
  p.set_grad(torch::tensor({kInf}));  // no overflow check either
  EXPECT_TRUE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 2);
}

TEST(GradScalerDisabled, StepAllowsAClosureAndRunsIt) {
  HandParam p({1.0f});
  GradScaler scaler(GradScalerOptions().enabled(false));
  int closure_runs = 0;
  const auto loss_value = torch::full({}, 7.0);
  const auto result = scaler.step(p.opt, [&] {
    ++closure_runs;
    p.set_grad(torch::tensor({0.5f}));
    return loss_value;
  });
  EXPECT_EQ(closure_runs, 1);
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->is_same(loss_value)) << "step must return what SGD::step(closure) returned";
  EXPECT_EQ(p.param.item<float>(), 0.5f);
}

TEST(GradScalerDisabled, UnscaleDoesNothing) {
  HandParam p({1.0f});
  GradScaler scaler(GradScalerOptions().enabled(false));
  p.set_grad(torch::tensor({3.0f}));
  scaler.unscale_(p.opt);
  EXPECT_EQ(p.grad().item<float>(), 3.0f);
  EXPECT_NO_THROW(scaler.unscale_(p.opt));  // no stage machine either
  EXPECT_EQ(p.grad().item<float>(), 3.0f);
}

TEST(GradScalerDisabled, UpdateDoesNothingAndGetScaleIsOne) {
  GradScaler scaler(GradScalerOptions().enabled(false).init_scale(1024.0).growth_interval(1));
  EXPECT_FALSE(scaler.is_enabled());
  EXPECT_EQ(scaler.get_scale(), 1.0);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  scaler.update(8.0);
  EXPECT_EQ(scaler.get_scale(), 1.0);
  // A no-op does not even look at its argument.
  EXPECT_NO_THROW(scaler.update(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

// ---------------------------------------------------------------------------------------
// Refused gradient dtypes: checked over all gradients before any is touched.

TEST(GradScalerRefusedDtypes, Float16GradientThrowsValueErrorAndUnscalesNothing) {
  auto good = torch::tensor({1.0f, 2.0f}).requires_grad_();
  auto half = torch::ones({2}, torch::kHalf).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{good, half}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  scale_loss(scaler);
  good.mutable_grad() = scaled({4.0f, 6.0f}, kDefaultScale);
  half.mutable_grad() = torch::ones({2}, torch::kHalf);  // last: checked before any division
  EXPECT_TRUE(ThrowsValueError("float16", [&] { scaler.unscale_(opt); }));
  EXPECT_TRUE(torch::equal(good.grad(), scaled({4.0f, 6.0f}, kDefaultScale)))
      << "a float32 gradient was unscaled before the float16 one was refused";
  EXPECT_EQ(half.grad().scalar_type(), torch::kHalf);
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
  // With the float16 gradient gone, unscale_ succeeds: the stage had not moved.
  half.mutable_grad() = torch::Tensor();
  EXPECT_NO_THROW(scaler.unscale_(opt));
  EXPECT_TRUE(torch::equal(good.grad(), torch::tensor({4.0f, 6.0f})));
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kUnscaled);
}

TEST(GradScalerRefusedDtypes, Float16GradientMakesStepThrowValueError) {
  auto good = torch::tensor({1.0f}).requires_grad_();
  auto half = torch::ones({1}, torch::kHalf).requires_grad_();
  MarkingSGD opt({good, half}, 1.0);
  GradScaler scaler;
  scale_loss(scaler);
  good.mutable_grad() = scaled({1.0f}, kDefaultScale);
  half.mutable_grad() = torch::ones({1}, torch::kHalf);
  EXPECT_TRUE(ThrowsValueError("float16", [&] { scaler.step(opt); }));
  EXPECT_EQ(opt.calls, 0);
  EXPECT_EQ(good.item<float>(), 1.0f);
  EXPECT_EQ(good.grad().item<float>(), 65536.0f);
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
}

TEST(GradScalerRefusedDtypes, ComplexGradientThrowsNotImplementedAndUnscalesNothing) {
  auto good = torch::tensor({1.0f, 2.0f}).requires_grad_();
  auto cplx = torch::ones({2}, torch::kComplexFloat).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{good, cplx}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  scale_loss(scaler);
  good.mutable_grad() = scaled({4.0f, 6.0f}, kDefaultScale);
  cplx.mutable_grad() = torch::ones({2}, torch::kComplexFloat);
  EXPECT_TRUE(
      ThrowsNotImplementedError("complex", [&] { scaler.unscale_(opt); }));
  EXPECT_TRUE(torch::equal(good.grad(), scaled({4.0f, 6.0f}, kDefaultScale)));
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
  cplx.mutable_grad() = torch::Tensor();
  EXPECT_NO_THROW(scaler.unscale_(opt));
  EXPECT_TRUE(torch::equal(good.grad(), torch::tensor({4.0f, 6.0f})));
}

TEST(GradScalerRefusedDtypes, ComplexGradientMakesStepThrowNotImplemented) {
  auto good = torch::tensor({1.0f}).requires_grad_();
  auto cplx = torch::ones({1}, torch::kComplexDouble).requires_grad_();
  MarkingSGD opt({good, cplx}, 1.0);
  GradScaler scaler;
  scale_loss(scaler);
  good.mutable_grad() = scaled({1.0f}, kDefaultScale);
  cplx.mutable_grad() = torch::ones({1}, torch::kComplexDouble);
  EXPECT_TRUE(
      ThrowsNotImplementedError("complex", [&] { scaler.step(opt); }));
  EXPECT_EQ(opt.calls, 0);
  EXPECT_EQ(good.grad().item<float>(), 65536.0f);
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
}

TEST(GradScalerRefusedDtypes, BadGradientInALaterParamGroupIsCheckedFirst) {
  auto good = torch::tensor({1.0f}).requires_grad_();
  auto half = torch::ones({1}, torch::kHalf).requires_grad_();
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{good});
  groups.emplace_back(std::vector<torch::Tensor>{half});
  torch::optim::SGD opt(groups, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  scale_loss(scaler);
  good.mutable_grad() = scaled({2.0f}, kDefaultScale);
  half.mutable_grad() = torch::ones({1}, torch::kHalf);
  EXPECT_TRUE(ThrowsValueError("float16", [&] { scaler.unscale_(opt); }));
  EXPECT_EQ(good.grad().item<float>(), 131072.0f);
}

// ---------------------------------------------------------------------------------------
// Odd parameters.

TEST(GradScalerParams, ParametersWithoutGradientArePassedOver) {
  auto with = torch::tensor({1.0f}).requires_grad_();
  auto without = torch::tensor({5.0f}).requires_grad_();
  MarkingSGD opt({with, without}, 1.0);
  GradScaler scaler;
  scale_loss(scaler);
  with.mutable_grad() = scaled({0.5f}, kDefaultScale);
  ASSERT_FALSE(without.grad().defined());
  EXPECT_NO_THROW(scaler.unscale_(opt));
  EXPECT_FALSE(without.grad().defined());
  EXPECT_EQ(with.grad().item<float>(), 0.5f);
  EXPECT_TRUE(scaler.step(opt).has_value());
  EXPECT_EQ(with.item<float>(), 0.5f);
  EXPECT_EQ(without.item<float>(), 5.0f);
}

TEST(GradScalerParams, OptimizerWithNoGradientsAtAllStepsButIsNoEvidence) {
  auto p = torch::tensor({1.0f}).requires_grad_();
  MarkingSGD opt({p}, 1.0);
  GradScaler scaler(GradScalerOptions().init_scale(16.0).growth_interval(1));
  scale_loss(scaler);
  EXPECT_TRUE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 1);
  EXPECT_EQ(scaler.counters().steps_without_gradients, 1);
  scaler.update();
  // Nothing was checked, so the update is not a clean step: the scale stays.
  EXPECT_EQ(scaler.get_scale(), 16.0);
  EXPECT_EQ(scaler.counters().updates_without_checks, 1);
  EXPECT_EQ(scaler.counters().growths, 0);
}

// ---------------------------------------------------------------------------------------
// Without scale().

TEST(GradScalerWithoutScale, UnscaleAndStepWorkWhenScaleWasNeverCalled) {
  HandParam p({1.0f, 1.0f});
  GradScaler scaler(GradScalerOptions().init_scale(512.0));
  scale_loss(scaler);
  p.set_grad(scaled({1.0f, -3.0f}, 512.0));
  EXPECT_NO_THROW(scaler.unscale_(p.opt));
  EXPECT_TRUE(torch::equal(p.grad(), torch::tensor({1.0f, -3.0f})));
  ASSERT_TRUE(scaler.step(p.opt).has_value());
  EXPECT_TRUE(torch::equal(p.param.detach(), torch::tensor({0.0f, 4.0f})));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
  // The scale created on the gradients' device now multiplies CPU outputs.
  EXPECT_EQ(scaler.scale(torch::scalar_tensor(2.0)).item<float>(), 1024.0f);
}

TEST(GradScalerWithoutScale, StepWithoutScaleSkipsOnOverflowAndBacksOff) {
  HandParam p({1.0f});
  GradScaler scaler(GradScalerOptions().init_scale(512.0));
  scale_loss(scaler);
  p.set_grad(torch::tensor({kNaN}));
  EXPECT_FALSE(scaler.step(p.opt).has_value());
  EXPECT_EQ(p.param.item<float>(), 1.0f);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 256.0);
}

TEST(GradScalerWithoutScale, UpdateWithNothingRecordedLeavesTheScaleAndCountsIt) {
  GradScaler scaler(GradScalerOptions().init_scale(4.0).growth_interval(1));
  scale_loss(scaler);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  EXPECT_EQ(scaler.counters().updates_without_checks, 2);
  EXPECT_EQ(scaler.counters().updates, 2);
}

TEST(GradScalerGrowth, UpdateNewScaleSetsTheScale) {
  GradScaler scaler;
  scale_loss(scaler);
  scaler.update(3.0);
  EXPECT_EQ(scaler.get_scale(), 3.0);
  EXPECT_EQ(scaler.scale(torch::scalar_tensor(2.0)).item<float>(), 6.0f);
}

TEST(GradScalerGrowth, UpdateNewScaleRejectsNonPositiveOrNonFinite) {
  GradScaler scaler(GradScalerOptions().init_scale(128.0));
  scale_loss(scaler);
  for (const double bad : {0.0, -1.0, -0.0, static_cast<double>(kInf), -static_cast<double>(kInf),
                           static_cast<double>(kNaN)}) {
    EXPECT_TRUE(ThrowsValueError("new_scale", [&] { scaler.update(bad); })) << "new_scale " << bad;
    EXPECT_EQ(scaler.get_scale(), 128.0) << "a refused new_scale " << bad << " changed the scale";
  }
}

// ---------------------------------------------------------------------------------------
// Core numeric behaviours, on each device (CUDA skipped when absent) and each path: the
// native backend of the device, and the generic ATen-ops path forced for every device.

enum class Path { kNative, kGeneric };

struct BackendCase {
  torch::DeviceType device;
  Path path;
};

void PrintTo(const BackendCase& c, std::ostream* os) {
  *os << (c.device == torch::kCUDA ? "CUDA" : "CPU") << ", "
      << (c.path == Path::kNative ? "native backend" : "generic backend forced");
}

class GradScalerBackend : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    if (GetParam().device == torch::kCUDA && !torch::cuda::is_available()) {
      GTEST_SKIP() << "CUDA is not available";
    }
    if (GetParam().path == Path::kGeneric) {
      guard_ = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
    ASSERT_EQ(lucid::amp::detail::generic_backend_forced(), GetParam().path == Path::kGeneric);
  }
  void TearDown() override { guard_.reset(); }

  // With an index, so that it compares equal to the device tensors report (cuda:0).
  torch::Device dev() const {
    return GetParam().device == torch::kCUDA ? torch::Device(torch::kCUDA, 0)
                                             : torch::Device(torch::kCPU);
  }
  torch::TensorOptions on(torch::ScalarType dtype = torch::kFloat) const {
    return torch::TensorOptions().dtype(dtype).device(dev());
  }
  torch::Tensor f32(std::vector<float> values) const {
    return torch::tensor(values, torch::TensorOptions().device(dev()));
  }

 private:
  std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> guard_;
};

TEST_P(GradScalerBackend, Float32GradientsAreUnscaled) {
  HandParam p({0.0f, 0.0f, 0.0f}, 1.0, dev());
  GradScaler scaler;
  scale_loss(scaler, dev());
  p.set_grad(scaled({1.5f, -0.25f, 1e-3f}, kDefaultScale, dev()));
  scaler.unscale_(p.opt);
  EXPECT_EQ(p.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(p.grad().device(), dev());
  EXPECT_TRUE(torch::equal(p.grad().cpu(), torch::tensor({1.5f, -0.25f, 1e-3f}))) << p.grad();
}

TEST_P(GradScalerBackend, Float32GradientWithNonPowerOfTwoScaleIsWithinFloatRounding) {
  torch::manual_seed(1);
  const auto truth = torch::randn({1000}) * 100;
  HandParam p(std::vector<float>(1000, 0.0f), 1.0, dev());
  GradScaler scaler;
  scale_loss(scaler, dev());
  scaler.update(3.0);
  p.set_grad(truth.clone().to(dev()));
  scaler.unscale_(p.opt);
  ASSERT_EQ(p.grad().scalar_type(), torch::kFloat);
  const auto got = p.grad().cpu().contiguous();
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float want = truth.data_ptr<float>()[i] / 3.0f;
    if (!within_one_ulp(got.data_ptr<float>()[i], want) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << got.data_ptr<float>()[i] << ", want "
                    << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(GradScalerBackend, Float64GradientIsUnscaledInFloat64) {
  torch::manual_seed(2);
  const auto truth = torch::randn({1000}, torch::kDouble) * 100;
  auto p = torch::zeros({1000}, on(torch::kDouble)).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  scale_loss(scaler, dev());
  scaler.update(3.0);
  p.mutable_grad() = truth.clone().to(dev());
  scaler.unscale_(opt);
  ASSERT_EQ(p.grad().scalar_type(), torch::kDouble);
  const auto got = p.grad().cpu().contiguous();
  int bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double want = truth.data_ptr<double>()[i] / 3.0;
    if (!within_one_ulp(got.data_ptr<double>()[i], want) && ++bad <= 5) {
      ADD_FAILURE() << "element " << i << ": got " << got.data_ptr<double>()[i] << ", want "
                    << want << " (float32 arithmetic would be ~1e-8 relative off)";
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_P(GradScalerBackend, BFloat16GradientIsUnscaledInFloat32AndRoundedOnce) {
  torch::manual_seed(3);
  const auto grad = (torch::randn({1000}) * 1000).to(torch::kBFloat16);
  auto p = torch::zeros({1000}, on(torch::kBFloat16)).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  scale_loss(scaler, dev());
  scaler.update(3.0);
  p.mutable_grad() = grad.clone().to(dev());
  scaler.unscale_(opt);
  ASSERT_EQ(p.grad().scalar_type(), torch::kBFloat16);
  // Expected: each value widened to float32, divided there, rounded to bfloat16 once.
  const auto wide = grad.to(torch::kFloat).contiguous();
  std::vector<float> quotient(wide.numel());
  for (int64_t i = 0; i < wide.numel(); ++i) {
    quotient[i] = wide.data_ptr<float>()[i] / 3.0f;
  }
  const auto want = torch::tensor(quotient).to(torch::kBFloat16);
  const auto got = p.grad().cpu();
  const auto mismatches = got.ne(want).sum().item<int64_t>();
  EXPECT_EQ(mismatches, 0) << "first values got " << got.slice(0, 0, 5) << " want "
                           << want.slice(0, 0, 5);
  // The check can fail: bfloat16 arithmetic (1/3 rounded to bfloat16) gives other values.
  const auto bf16_math = grad * torch::full({}, 1.0 / 3.0, torch::kBFloat16);
  EXPECT_GT(bf16_math.ne(want).sum().item<int64_t>(), 0);
}

TEST_P(GradScalerBackend, BFloat16GradientOverflowIsDetected) {
  auto p = torch::zeros({3}, on(torch::kBFloat16)).requires_grad_();
  MarkingSGD opt({p}, 1.0);
  GradScaler scaler;
  scale_loss(scaler, dev());
  p.mutable_grad() = (f32({1.0f, kInf, 2.0f}) * 65536).to(torch::kBFloat16);
  EXPECT_FALSE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 0);
  EXPECT_EQ(p.grad().scalar_type(), torch::kBFloat16);
  EXPECT_EQ(p.grad()[0].item<float>(), 1.0f);
  EXPECT_EQ(p.grad()[2].item<float>(), 2.0f);
  EXPECT_TRUE(torch::equal(p.detach().cpu(), torch::zeros({3}, torch::kBFloat16)));
}

TEST_P(GradScalerBackend, MixedDtypesInOneOptimizerKeepTheirDtypes) {
  auto a = torch::zeros({2}, on()).requires_grad_();
  auto b = torch::zeros({2}, on(torch::kDouble)).requires_grad_();
  auto c = torch::zeros({2}, on(torch::kBFloat16)).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{a, b, c}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  scale_loss(scaler, dev());
  a.mutable_grad() = f32({2.0f, 4.0f}) * 65536;
  b.mutable_grad() = torch::tensor({1.0 + 1e-12, 3.0}, on(torch::kDouble)) * 65536;
  c.mutable_grad() = (f32({0.5f, 8.0f}) * 65536).to(torch::kBFloat16);
  scaler.unscale_(opt);
  EXPECT_EQ(a.grad().scalar_type(), torch::kFloat);
  EXPECT_EQ(b.grad().scalar_type(), torch::kDouble);
  EXPECT_EQ(c.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(a.grad().cpu(), torch::tensor({2.0f, 4.0f})));
  EXPECT_EQ(b.grad()[0].item<double>(), 1.0 + 1e-12);
  EXPECT_TRUE(torch::equal(c.grad().cpu().to(torch::kFloat), torch::tensor({0.5f, 8.0f})));
}

TEST_P(GradScalerBackend, EveryGradientIsDividedNonFiniteOnesToo) {
  HandParam bad({0.0f, 0.0f, 0.0f}, 1.0, dev());
  auto other = torch::zeros({1}, on()).requires_grad_();
  MarkingSGD opt({bad.param, other}, 1.0);
  HandParam second({0.0f}, 1.0, dev());
  GradScaler scaler;
  scale_loss(scaler, dev());
  bad.set_grad(f32({kInf, 2.0f * 65536.0f, kNaN}));
  other.mutable_grad() = scaled({4.0f}, kDefaultScale, dev());
  second.set_grad(scaled({8.0f}, kDefaultScale, dev()));
  scaler.unscale_(opt);
  scaler.unscale_(second.opt);
  const auto g = bad.grad().cpu();
  EXPECT_TRUE(std::isinf(g[0].item<float>()) && g[0].item<float>() > 0) << g;
  EXPECT_EQ(g[1].item<float>(), 2.0f) << g;
  EXPECT_TRUE(std::isnan(g[2].item<float>())) << g;
  EXPECT_EQ(other.grad().item<float>(), 4.0f) << "the other gradient of the same optimizer";
  EXPECT_EQ(second.grad().item<float>(), 8.0f) << "another optimizer's gradient";
  EXPECT_FALSE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 0);
  EXPECT_TRUE(scaler.step(second.opt).has_value());
}

TEST_P(GradScalerBackend, NonContiguousGradientIsUnscaledInPlaceOnly) {
  auto base = torch::arange(1, 13, on()).reshape({3, 4}) * 65536;
  const auto base_before = base.cpu().clone();
  auto p = torch::zeros({3, 2}, on()).requires_grad_();
  torch::optim::SGD opt(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(1.0));
  p.mutable_grad() = base.slice(1, 0, 4, 2);  // columns 0 and 2: a strided view
  ASSERT_FALSE(p.grad().is_contiguous());
  GradScaler scaler;
  scale_loss(scaler, dev());
  scaler.unscale_(opt);
  EXPECT_TRUE(p.grad().is_alias_of(base)) << "the gradient must be unscaled in place";
  EXPECT_TRUE(torch::equal(p.grad().cpu(), base_before.slice(1, 0, 4, 2) / 65536));
  EXPECT_TRUE(torch::equal(base.slice(1, 1, 4, 2).cpu(), base_before.slice(1, 1, 4, 2)))
      << "elements outside the gradient view were touched";
}

TEST_P(GradScalerBackend, SparseGradientsAreUnscaledThroughTheirValues) {
  torch::manual_seed(4);
  torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  emb->to(dev());
  torch::optim::SGD opt(emb->parameters(), torch::optim::SGDOptions(0.5));
  const auto idx = torch::tensor({1, 1, 4}, on(torch::kLong));
  const auto w = torch::randn({3, 3}).to(dev());
  // d/dweight of sum(emb(idx) * w): row r gathers w's rows where idx == r.
  const auto true_grad = torch::zeros({10, 3}, on()).index_add_(0, idx, w);
  GradScaler scaler;
  scaler.scale((emb->forward(idx) * w).sum()).backward();
  ASSERT_TRUE(emb->weight.grad().is_sparse());
  scaler.unscale_(opt);
  ASSERT_TRUE(emb->weight.grad().is_sparse());
  EXPECT_TRUE(torch::allclose(emb->weight.grad().to_dense(), true_grad, 1e-6, 1e-7))
      << emb->weight.grad().to_dense();
  const auto before = emb->weight.detach().clone();
  ASSERT_TRUE(scaler.step(opt).has_value());
  EXPECT_TRUE(torch::allclose(emb->weight.detach(), before - 0.5 * true_grad, 1e-6, 1e-7));
}

TEST_P(GradScalerBackend, OverflowInSparseGradientValuesIsDetected) {
  torch::manual_seed(5);
  torch::nn::Embedding emb(torch::nn::EmbeddingOptions(10, 3).sparse(true));
  emb->to(dev());
  MarkingSGD opt(emb->parameters(), 0.5);
  const auto idx = torch::tensor({2, 7}, on(torch::kLong));
  GradScaler scaler;
  scaler.scale(emb->forward(idx).sum()).backward();
  ASSERT_TRUE(emb->weight.grad().is_sparse());
  emb->weight.grad()._values().select(0, 1).select(0, 2).fill_(kInf);
  const auto before = emb->weight.detach().clone();
  EXPECT_FALSE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 0);
  EXPECT_TRUE(torch::equal(emb->weight.detach(), before));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), kDefaultScale / 2);
}

TEST_P(GradScalerBackend, OverflowInOneOptimizerSkipsOnlyThatStep) {
  torch::manual_seed(6);
  torch::nn::Linear first(4, 2), second(4, 2);
  first->to(dev());
  second->to(dev());
  MarkingSGD opt1(first->parameters(), 0.1), opt2(second->parameters(), 0.1);
  GradScaler scaler(GradScalerOptions().growth_interval(3));
  const auto x = torch::randn({8, 4}).to(dev());
  scaler.scale(first->forward(x).sum() + second->forward(x).sum()).backward();
  second->weight.grad()[1][3] = kInf;
  const auto before1 = clone_all(first->parameters());
  const auto before2 = clone_all(second->parameters());
  EXPECT_TRUE(scaler.step(opt1).has_value());
  EXPECT_FALSE(scaler.step(opt2).has_value());
  EXPECT_EQ(opt1.calls, 1);
  EXPECT_EQ(opt2.calls, 0);
  EXPECT_FALSE(torch::equal(first->weight, before1[0]));
  EXPECT_TRUE(all_equal(clone_all(second->parameters()), before2));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), kDefaultScale / 2) << "any overflow backs the scale off";
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
}

TEST_P(GradScalerBackend, UpdateBacksOffWhenTheFirstOfSeveralOptimizersOverflowed) {
  HandParam a({0.0f}, 1.0, dev()), b({0.0f}, 1.0, dev()), c({0.0f}, 1.0, dev());
  GradScaler scaler;
  scale_loss(scaler, dev());
  a.set_grad(f32({kNaN}));
  b.set_grad(scaled({1.0f}, kDefaultScale, dev()));
  c.set_grad(scaled({1.0f}, kDefaultScale, dev()));
  EXPECT_FALSE(scaler.step(a.opt).has_value());
  scaler.unscale_(b.opt);
  EXPECT_TRUE(scaler.step(c.opt).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), kDefaultScale / 2);
}

TEST_P(GradScalerBackend, GrowsAfterGrowthIntervalCleanUpdates) {
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(3));
  scale_loss(scaler, dev());
  record_iteration(scaler, false, dev());
  record_iteration(scaler, false, dev());
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 2.0);
  record_iteration(scaler, false, dev());
  EXPECT_EQ(scaler.get_scale(), 2048.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  for (int i = 0; i < 3; ++i) {
    record_iteration(scaler, false, dev());
  }
  EXPECT_EQ(scaler.get_scale(), 4096.0);
}

TEST_P(GradScalerBackend, GrowthUsesTheGrowthFactor) {
  GradScaler scaler(GradScalerOptions().init_scale(10.0).growth_factor(1.5).growth_interval(1));
  scale_loss(scaler, dev());
  record_iteration(scaler, false, dev());
  EXPECT_EQ(scaler.get_scale(), 15.0);
}

TEST_P(GradScalerBackend, BackoffHalvesTheScaleAndResetsTheTracker) {
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(3));
  scale_loss(scaler, dev());
  record_iteration(scaler, false, dev());
  record_iteration(scaler, false, dev());
  ASSERT_EQ(scaler.state_dict().at("growth_tracker"), 2.0);
  record_iteration(scaler, true, dev());
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
  // The tracker restarted: two clean updates are not enough to grow.
  record_iteration(scaler, false, dev());
  record_iteration(scaler, false, dev());
  EXPECT_EQ(scaler.get_scale(), 512.0);
  record_iteration(scaler, false, dev());
  EXPECT_EQ(scaler.get_scale(), 1024.0);
}

TEST_P(GradScalerBackend, BackoffUsesTheBackoffFactor) {
  GradScaler scaler(GradScalerOptions().init_scale(1000.0).backoff_factor(0.25));
  scale_loss(scaler, dev());
  record_iteration(scaler, true, dev());
  EXPECT_EQ(scaler.get_scale(), 250.0);
}

TEST_P(GradScalerBackend, ScaleNeverGrowsPastFloat32Max) {
  const double start = static_cast<double>(FLT_MAX) / 1.5;
  GradScaler scaler(GradScalerOptions().init_scale(start).growth_interval(1));
  scale_loss(scaler, dev());
  const double stored = scaler.get_scale();
  EXPECT_TRUE(std::isfinite(stored));
  for (int i = 0; i < 3; ++i) {
    scaler.update();
    EXPECT_TRUE(std::isfinite(scaler.get_scale())) << "update " << i;
    EXPECT_EQ(scaler.get_scale(), stored) << "update " << i;
  }
  EXPECT_EQ(scaler.state_dict().at("growth_tracker"), 0.0);
}

TEST_P(GradScalerBackend, UpdateNewScaleSetsTheScale) {
  GradScaler scaler;
  scale_loss(scaler, dev());
  scaler.update(3.0);
  EXPECT_EQ(scaler.get_scale(), 3.0);
  const auto out = scaler.scale(torch::full({}, 2.0, on()));
  EXPECT_EQ(out.device(), dev());
  EXPECT_EQ(out.item<float>(), 6.0f);
}

TEST_P(GradScalerBackend, UpdateWithNothingRecordedLeavesTheScale) {
  // The scale exists on the device, but no optimizer was checked: no evidence, no growth.
  GradScaler scaler(GradScalerOptions().init_scale(4.0).growth_interval(1));
  scale_loss(scaler, dev());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(scaler.counters().updates_without_checks, 1);
  record_iteration(scaler, false, dev());
  EXPECT_EQ(scaler.get_scale(), 8.0);
}

TEST_P(GradScalerBackend, EveryCallThatNeedsTheScaleRefusesToRunBeforeScale) {
  // As torch.amp.GradScaler: the scale exists from the first scale() on; before it,
  // dividing gradients of a loss that was not scaled by it would be wrong.
  HandParam p({0.0f, 0.0f}, 1.0, dev());
  GradScaler scaler(GradScalerOptions().init_scale(64.0).growth_interval(1));
  p.set_grad(scaled({1.0f, -2.0f}, 64.0, dev()));
  const auto grad = p.grad().clone();
  for (const auto& [name, call] : std::vector<std::pair<const char*, std::function<void()>>>{
           {"unscale_", [&] { scaler.unscale_(p.opt); }},
           {"clip_grad_norm_", [&] { scaler.clip_grad_norm_(p.opt, 1.0); }},
           {"step", [&] { scaler.step(p.opt); }},
           {"update", [&] { scaler.update(); }},
           {"update(new_scale)", [&] { scaler.update(2.0); }}}) {
    EXPECT_TRUE(ThrowsError("before any scale()", call)) << name;
    EXPECT_TRUE(torch::equal(p.grad(), grad)) << name << " changed a gradient";
    EXPECT_TRUE(torch::equal(p.param.detach().cpu(), torch::tensor({0.0f, 0.0f}))) << name;
    EXPECT_EQ(scaler.stage(p.opt), OptimizerStage::kReady) << name;
    EXPECT_EQ(scaler.get_scale(), 64.0) << name;
  }
  scale_loss(scaler, dev());
  scaler.unscale_(p.opt);
  EXPECT_TRUE(torch::equal(p.grad().cpu(), torch::tensor({1.0f, -2.0f})));
  ASSERT_TRUE(scaler.step(p.opt).has_value());
  EXPECT_TRUE(torch::equal(p.param.detach().cpu(), torch::tensor({-1.0f, 2.0f})));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 128.0);
  p.set_grad(f32({kInf, 1.0f}));
  EXPECT_FALSE(scaler.step(p.opt).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 64.0);
}

TEST_P(GradScalerBackend, ScaleKeepsTheOutputDevice) {
  GradScaler scaler;
  const auto out = scaler.scale(torch::full({8, 1}, 0.5, on(torch::kHalf)));
  EXPECT_EQ(out.device(), dev());
  EXPECT_EQ(out.scalar_type(), torch::kFloat);
  EXPECT_EQ(out.sizes(), torch::IntArrayRef({8, 1}));
  EXPECT_TRUE(torch::equal(out.cpu(), torch::full({8, 1}, 32768.0)));
}

std::string backend_case_name(const ::testing::TestParamInfo<BackendCase>& info) {
  return std::string(info.param.device == torch::kCUDA ? "Cuda" : "Cpu") +
         (info.param.path == Path::kNative ? "Native" : "Generic");
}

INSTANTIATE_TEST_SUITE_P(DevicesAndPaths, GradScalerBackend,
                         ::testing::Values(BackendCase{torch::kCPU, Path::kNative},
                                           BackendCase{torch::kCPU, Path::kGeneric},
                                           BackendCase{torch::kCUDA, Path::kNative},
                                           BackendCase{torch::kCUDA, Path::kGeneric}),
                         backend_case_name);

// ---------------------------------------------------------------------------------------
// Gradients and outputs on several devices (needs CUDA).

TEST(GradScalerMultiDevice, VectorFormScalesEachElementOnItsOwnDevice) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "CUDA is not available";
  }
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  const std::vector<torch::Tensor> outputs = {torch::full({}, 1.0, torch::kCUDA),
                                              torch::full({2}, 3.0)};
  const auto out = scaler.scale(outputs);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(out[0].is_cuda());
  EXPECT_TRUE(out[1].is_cpu());
  EXPECT_EQ(out[0].item<float>(), 4.0f);
  EXPECT_TRUE(torch::equal(out[1], torch::full({2}, 12.0)));
}

TEST(GradScalerMultiDevice, OverflowOnAnyDeviceSkipsTheStep) {
  if (!torch::cuda::is_available()) {
    GTEST_SKIP() << "CUDA is not available";
  }
  auto on_gpu = torch::zeros({2}, torch::kCUDA).requires_grad_();
  auto on_cpu = torch::zeros({2}).requires_grad_();
  MarkingSGD opt({on_gpu, on_cpu}, 1.0);
  GradScaler scaler;
  scaler.scale(torch::ones({}, torch::kCUDA));  // the scale lives on the GPU
  on_gpu.mutable_grad() = torch::full({2}, 65536.0 * 3, torch::kCUDA);
  on_cpu.mutable_grad() = torch::tensor({1.0f, kInf});
  EXPECT_FALSE(scaler.step(opt).has_value());
  EXPECT_EQ(opt.calls, 0);
  EXPECT_TRUE(torch::equal(on_gpu.grad().cpu(), torch::full({2}, 3.0)));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  // Clean on both devices: both divided, the step runs.
  on_gpu.mutable_grad() = torch::full({2}, 32768.0 * 5, torch::kCUDA);
  on_cpu.mutable_grad() = torch::full({2}, 32768.0 * 7);
  EXPECT_TRUE(scaler.step(opt).has_value());
  EXPECT_TRUE(torch::equal(on_gpu.grad().cpu(), torch::full({2}, 5.0)));
  EXPECT_TRUE(torch::equal(on_cpu.grad(), torch::full({2}, 7.0)));
}

}  // namespace
