// SPDX-License-Identifier: BSD-3-Clause
// Clipping by the total norm: lucid::amp::clip_grad_norm_ against
// torch::nn::utils::clip_grad_norm_, and GradScaler::clip_grad_norm_ against unscale_
// followed by it, on every backend, fused optimizers or not; overflow, errors, determinism
// and a clipped training run with injected overflows against its control.

#include "support/backend_fixture.h"
#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"

#include <lucid/amp/clip_grad.h>
#include <lucid/optim.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>

namespace {

using namespace lucid_test;

class ClipBackends : public BackendTest {};

LUCID_TEST_INSTANTIATE_BACKENDS(ClipBackends);

// Parameters of several sizes (one without a gradient) with random gradients.
std::vector<torch::Tensor> make_params(const torch::TensorOptions& options, uint64_t seed,
                                       float grad_scale = 1.0f) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params;
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{70000}, int64_t{3}}) {
    params.push_back(torch::randn({n}, options).requires_grad_());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (i != 4) {
      params[i].mutable_grad() = torch::randn_like(params[i]) * grad_scale;
    }
  }
  return params;
}

std::vector<torch::Tensor> clone_with_grads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    auto c = p.detach().clone().requires_grad_();
    if (p.grad().defined()) {
      c.mutable_grad() = p.grad().clone();
    }
    out.push_back(c);
  }
  return out;
}

void expect_grads_close(const std::vector<torch::Tensor>& got,
                        const std::vector<torch::Tensor>& want, double rtol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].grad().defined(), want[i].grad().defined()) << i;
    if (want[i].grad().defined()) {
      EXPECT_TRUE(torch::allclose(got[i].grad().to(torch::kDouble).cpu(),
                                  want[i].grad().to(torch::kDouble).cpu(), rtol, 1e-7))
          << "gradient " << i;
    }
  }
}

// ---------------------------------------------------------------------------------------
// The free function.

TEST_P(ClipBackends, FreeFunctionEqualsTorchClipGradNorm) {
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity(), 1.0, 3.5}) {
    for (const double max_norm : {0.5, 1e6}) {  // clipping, and a norm below the limit
      auto ours = make_params(on(), 3, 4.0f);
      auto theirs = clone_with_grads(ours);
      const torch::Tensor norm = lucid::amp::clip_grad_norm_(ours, max_norm, norm_type);
      const double want = torch::nn::utils::clip_grad_norm_(theirs, max_norm, norm_type);
      EXPECT_EQ(norm.device().type(), device().type());
      EXPECT_EQ(norm.scalar_type(), torch::kFloat);
      EXPECT_EQ(norm.dim(), 0);
      EXPECT_NEAR(norm.item<double>(), want, 1e-5 * want) << norm_type << " " << max_norm;
      expect_grads_close(ours, theirs);
    }
  }
}

TEST_P(ClipBackends, FreeFunctionKeepsDtypes) {
  for (const auto dtype : {torch::kDouble, torch::kBFloat16}) {
    auto ours = make_params(on(dtype), 5, 3.0f);
    auto theirs = clone_with_grads(ours);
    const torch::Tensor norm = lucid::amp::clip_grad_norm_(ours, 1.0);
    const double want = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
    EXPECT_NEAR(norm.item<double>(), want, (dtype == torch::kBFloat16 ? 1e-2 : 1e-5) * want);
    for (const auto& p : ours) {
      if (p.grad().defined()) {
        EXPECT_EQ(p.grad().scalar_type(), dtype);
      }
    }
  }
}

TEST_P(ClipBackends, NormIsTheSameBitsRunToRun) {
  auto a = make_params(on(), 9, 2.0f);
  auto b = clone_with_grads(a);
  const float x = lucid::amp::clip_grad_norm_(a, 1e9).item<float>();
  const float y = lucid::amp::clip_grad_norm_(b, 1e9).item<float>();
  EXPECT_EQ(std::memcmp(&x, &y, sizeof x), 0) << x << " vs " << y;
}

TEST(ClipFree, ArgumentsAreCheckedBeforeAnythingChanges) {
  auto params = make_params(torch::TensorOptions(), 1);
  auto before = clone_with_grads(params);
  for (const double bad : {0.0, -1.0, kNaN, kInf}) {
    EXPECT_TRUE(ThrowsValueError("max_norm", [&] { lucid::amp::clip_grad_norm_(params, bad); }))
        << bad;
  }
  for (const double bad : {0.0, -2.0, kNaN}) {
    EXPECT_TRUE(
        ThrowsValueError("norm_type", [&] { lucid::amp::clip_grad_norm_(params, 1.0, bad); }))
        << bad;
  }
  expect_grads_close(params, before, 0.0);
  std::vector<torch::Tensor> none = {torch::ones({3}).requires_grad_()};
  EXPECT_EQ(lucid::amp::clip_grad_norm_(none, 1.0).item<float>(), 0.0f);
}

// ---------------------------------------------------------------------------------------
// GradScaler::clip_grad_norm_.

// The control: unscale_ then torch's clip, then step, with the same optimizer type.
template <typename MakeOptimizer>
void expect_scaler_clip_equals_control(torch::Device device, MakeOptimizer make,
                                       double norm_type) {
  const float scale = 1024.0f;
  auto ours = make_params(torch::TensorOptions().device(device), 11);
  auto theirs = clone_with_grads(ours);
  for (auto* set : {&ours, &theirs}) {
    for (auto& p : *set) {
      if (p.grad().defined()) {
        p.mutable_grad().mul_(scale);  // gradients of the scaled loss
      }
    }
  }
  auto opt_ours = make(ours);
  auto opt_theirs = make(theirs);
  GradScaler a(GradScalerOptions().init_scale(scale));
  GradScaler b(GradScalerOptions().init_scale(scale));
  scale_loss(a, device);
  scale_loss(b, device);
  const torch::Tensor norm = a.clip_grad_norm_(*opt_ours, 0.5, norm_type);
  EXPECT_EQ(a.stage(*opt_ours), OptimizerStage::kUnscaled);
  b.unscale_(*opt_theirs);
  const double want = torch::nn::utils::clip_grad_norm_(theirs, 0.5, norm_type);
  EXPECT_NEAR(norm.item<double>(), want, 1e-5 * want);
  EXPECT_TRUE(a.step(*opt_ours).has_value());
  EXPECT_TRUE(b.step(*opt_theirs).has_value());
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ours[i].detach().cpu(), theirs[i].detach().cpu(), 1e-5, 1e-6))
        << "parameter " << i;
  }
  a.update();
  b.update();
  EXPECT_EQ(a.get_scale(), b.get_scale());
}

TEST_P(ClipBackends, ScalerClipEqualsUnscaleThenClipWithSgd) {
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity(), 1.0}) {
    expect_scaler_clip_equals_control(
        device(),
        [](std::vector<torch::Tensor>& p) {
          return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.1));
        },
        norm_type);
  }
}

TEST_P(ClipBackends, ScalerClipFoldsIntoAFusedOptimizer) {
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    expect_scaler_clip_equals_control(
        device(),
        [](std::vector<torch::Tensor>& p) {
          return std::make_unique<lucid::optim::FusedAdamW>(p,
                                                           lucid::optim::FusedAdamWOptions(1e-2));
        },
        norm_type);
  }
}

TEST_P(ClipBackends, FusedOptimizerGradientsStayScaledInMemory) {
  auto params = make_params(on(), 2);
  const torch::Tensor g0 = params[2].grad().clone();
  lucid::optim::FusedSGD opt(params, lucid::optim::FusedSGDOptions(0.1));
  GradScaler scaler;
  scale_loss(scaler, on().device());
  scaler.clip_grad_norm_(opt, 1.0);
  EXPECT_TRUE(torch::equal(params[2].grad(), g0)) << "no gradient is written for a fused step";
}

TEST_P(ClipBackends, NonFiniteNormSkipsTheStepAndIsReturned) {
  auto params = make_params(on(), 4);
  params[3].mutable_grad()[5] = std::numeric_limits<float>::infinity();
  auto before = clone_with_grads(params);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  scale_loss(scaler, on().device());
  const torch::Tensor norm = scaler.clip_grad_norm_(opt, 1.0);
  EXPECT_TRUE(std::isinf(norm.item<float>()));
  EXPECT_FALSE(scaler.step(opt).has_value());
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].detach(), before[i].detach())) << i;
  }
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST_P(ClipBackends, SquaresThatOverflowFloat32AreAnOverflow) {
  // Every value finite, but the sum of their squares is not.
  std::vector<torch::Tensor> params = {torch::ones({4}, on()).requires_grad_()};
  params[0].mutable_grad() = torch::full({4}, 3e19f * 65536.0f, on());
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  scale_loss(scaler, on().device());
  const torch::Tensor norm = scaler.clip_grad_norm_(opt, 1.0);
  EXPECT_TRUE(std::isinf(norm.item<float>()));
  EXPECT_TRUE(scaler.overflowed(opt));
}

TEST(ClipScaler, ErrorsChangeNothing) {
  auto params = make_params(torch::TensorOptions(), 6);
  auto before = clone_with_grads(params);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  EXPECT_TRUE(ThrowsError("before any scale()", [&] { scaler.clip_grad_norm_(opt, 1.0); }));
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
  expect_grads_close(params, before, 0.0);
  scale_loss(scaler);
  EXPECT_TRUE(ThrowsValueError("max_norm", [&] { scaler.clip_grad_norm_(opt, 0.0); }));
  EXPECT_TRUE(ThrowsValueError("norm_type", [&] { scaler.clip_grad_norm_(opt, 1.0, -1.0); }));
  EXPECT_EQ(scaler.stage(opt), OptimizerStage::kReady);
  expect_grads_close(params, before, 0.0);
  scaler.unscale_(opt);
  EXPECT_TRUE(ThrowsError("unscale_() has already been called",
                          [&] { scaler.clip_grad_norm_(opt, 1.0); }));
  scaler.step(opt);
  EXPECT_TRUE(ThrowsError("after step()", [&] { scaler.clip_grad_norm_(opt, 1.0); }));
}

TEST(ClipScaler, DisabledClipsLikeTheFreeFunction) {
  auto params = make_params(torch::TensorOptions(), 8, 5.0f);
  auto theirs = clone_with_grads(params);
  torch::optim::SGD opt(params, torch::optim::SGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().enabled(false));
  const torch::Tensor norm = scaler.clip_grad_norm_(opt, 1.0);
  const double want = torch::nn::utils::clip_grad_norm_(theirs, 1.0);
  EXPECT_NEAR(norm.item<double>(), want, 1e-5 * want);
  expect_grads_close(params, theirs);
}

// 100 steps of the clipped loop with injected overflows against the control loop
// (unscale_ + torch::nn::utils::clip_grad_norm_), SGD, Adam, AdamW, fused and not.
TEST_P(ClipBackends, ClippedTrainingWithOverflowsEqualsTheControl) {
  using Make = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;
  const std::vector<std::pair<const char*, Make>> makers = {
      {"SGD", [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9)); }},
      {"Adam", [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2)); }},
      {"AdamW", [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2)); }},
      {"FusedAdamW", [](auto p) { return std::make_unique<lucid::optim::FusedAdamW>(p, lucid::optim::FusedAdamWOptions(1e-2)); }},
      {"FusedSGD", [](auto p) { return std::make_unique<lucid::optim::FusedSGD>(p, lucid::optim::FusedSGDOptions(0.05).momentum(0.9)); }},
  };
  for (const auto& [name, make] : makers) {
    torch::manual_seed(21);
    const torch::Tensor w0 = torch::randn({16, 8}, on());
    const torch::Tensor x = torch::randn({32, 16}, on()), y = torch::randn({32, 8}, on());
    std::vector<torch::Tensor> pa = {w0.clone().requires_grad_()}, pb = {w0.clone().requires_grad_()};
    auto oa = make(pa);
    auto ob = make(pb);
    GradScaler a(GradScalerOptions().init_scale(256).growth_interval(5));
    GradScaler b(GradScalerOptions().init_scale(256).growth_interval(5));
    for (int step = 0; step < 100; ++step) {
      const bool inject = step % 13 == 7;
      for (auto [scaler, params, opt] : {std::make_tuple(&a, &pa, oa.get()), std::make_tuple(&b, &pb, ob.get())}) {
        opt->zero_grad();
        auto loss = (x.matmul((*params)[0]) - y).pow(2).mean();
        scaler->scale(loss).backward();
        if (inject) {
          (*params)[0].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
        }
        if (scaler == &a) {
          scaler->clip_grad_norm_(*opt, 0.3);
        } else {
          scaler->unscale_(*opt);
          torch::nn::utils::clip_grad_norm_(*params, 0.3);
        }
        scaler->step(*opt);
        scaler->update();
      }
      ASSERT_EQ(a.get_scale(), b.get_scale()) << name << " step " << step;
    }
    EXPECT_TRUE(torch::allclose(pa[0].detach().cpu(), pb[0].detach().cpu(), 1e-4, 1e-5))
        << name << ": max diff " << (pa[0] - pb[0]).abs().max().item<float>();
    EXPECT_EQ(a.counters().steps_skipped, 8) << name;
  }
}

}  // namespace

namespace {

// The clip's arithmetic after the norm pass in one launch (AmpBackend::clip_factors_, on
// CUDA) gives the bits of the ATen operations it replaces, clamped or not, and for a
// non-finite norm.
TEST_P(ClipBackends, ClipFactorsInOneLaunchAreTheAtenOperationsBits) {
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    for (const double max_norm : {0.5, 1e9}) {
      for (const bool poisoned : {false, true}) {
        auto params = make_params(on(), 9, 1e3f);
        if (poisoned) {
          params[2].mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
        }
        std::vector<torch::Tensor> grads;
        for (const auto& p : params) {
          if (p.grad().defined()) {
            grads.push_back(p.grad());
          }
        }
        const torch::Tensor scale = torch::full({}, 256.0f, on());
        torch::Tensor found_fused = torch::zeros({}, on());
        torch::Tensor found_aten = torch::zeros({}, on());
        torch::Tensor divisor;
        const torch::Tensor norm = lucid::amp::detail::check_grads_and_clip_(
            grads, scale, found_fused, norm_type, max_norm, &divisor);
        const torch::Tensor norm_aten =
            lucid::amp::detail::check_grads_and_norm_(grads, scale, found_aten, norm_type);
        const torch::Tensor divisor_aten = scale / (max_norm / (norm_aten + 1e-6)).clamp_max(1.0);
        SCOPED_TRACE(testing::Message() << "norm_type " << norm_type << " max_norm " << max_norm
                                        << (poisoned ? " with a NaN" : ""));
        EXPECT_EQ(found_fused.item<float>(), poisoned ? 1.0f : 0.0f);
        EXPECT_TRUE(torch::equal(found_fused, found_aten));
        EXPECT_TRUE(torch::equal(norm, norm_aten) ||
                    (poisoned && norm.isnan().item<bool>() && norm_aten.isnan().item<bool>()));
        EXPECT_TRUE(
            torch::equal(divisor, divisor_aten) ||
            (poisoned && divisor.isnan().item<bool>() && divisor_aten.isnan().item<bool>()));
        EXPECT_EQ(norm.device(), scale.device());
        EXPECT_EQ(divisor.device(), scale.device());
      }
    }
  }
}

}  // namespace
