// The float16-range emulation: what it rounds, forward and backward, and that the model
// built on it loses small gradients without loss scaling and keeps them with it.

#include <gtest/gtest.h>
#include <lucid/amp/grad_scaler.h>
#include <torch/nn/functional/loss.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>

#include "fp16_range.h"
#include "model.h"

using lucid::trainer::fp16_range;
using lucid::trainer::grad_probe;
using lucid::trainer::GradZeroCounter;
using lucid::trainer::round_through_half;
using lucid::trainer::SmallCnn;

TEST(Fp16Range, ForwardRoundsToTheNearestFloat16AndKeepsTheDtype) {
  const float inf = std::numeric_limits<float>::infinity();
  auto x = torch::tensor({1.0f, 1.0f + 1.0f / 4096, 1.0f + 3.0f / 2048, 65504.0f, 65520.0f,
                          -70000.0f, 6.0e-8f, 2.0e-8f, std::ldexp(1.0f, -24), 0.0f});
  auto y = fp16_range(x);
  EXPECT_EQ(y.scalar_type(), torch::kFloat);
  const std::vector<float> want = {1.0f, 1.0f,  // 1 + 2^-12 is a tie: rounds to even, 1
                                   1.0f + 2.0f / 1024,  // 1 + 1.5 * 2^-10 rounds to even
                                   65504.0f, inf, -inf,
                                   std::ldexp(1.0f, -24),  // nearest subnormal
                                   0.0f,                   // below half of 2^-24: flushed
                                   std::ldexp(1.0f, -24), 0.0f};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(y[static_cast<int64_t>(i)].item<float>(), want[i]) << "element " << i;
  }
  EXPECT_TRUE(torch::equal(y, x.to(torch::kHalf).to(torch::kFloat)));
}

TEST(Fp16Range, BackwardRoundsTheIncomingGradientThroughFloat16) {
  auto x = torch::ones({4}, torch::requires_grad());
  auto upstream = torch::tensor({1e-9f, 3e-8f, 1e-6f, 1e5f});
  fp16_range(x).backward(upstream);
  EXPECT_TRUE(torch::equal(x.grad(), round_through_half(upstream)));
  EXPECT_EQ(x.grad()[0].item<float>(), 0.0f);            // underflow
  EXPECT_GT(x.grad()[1].item<float>(), 0.0f);            // a subnormal survives
  EXPECT_TRUE(std::isinf(x.grad()[3].item<float>()));    // overflow
}

TEST(Fp16Range, ProbeCountsZerosAfterRounding) {
  GradZeroCounter counter;
  auto x = torch::ones({4}, torch::requires_grad());
  grad_probe(x, /*round_fp16=*/true, &counter).backward(torch::tensor({0.0f, 1e-9f, 1e-3f, 1.0f}));
  EXPECT_EQ(counter.entries, 4);
  EXPECT_DOUBLE_EQ(counter.fraction(), 0.5);  // the 0 and the flushed 1e-9
  auto z = torch::ones({4}, torch::requires_grad());
  grad_probe(z, /*round_fp16=*/false, &counter).backward(torch::tensor({0.0f, 1e-9f, 1e-3f, 1.0f}));
  EXPECT_EQ(counter.entries, 8);
  EXPECT_DOUBLE_EQ(counter.fraction(), 3.0 / 8);  // without rounding 1e-9 stays
  EXPECT_TRUE(torch::equal(z.grad(), torch::tensor({0.0f, 1e-9f, 1e-3f, 1.0f})));
}

// The same batch through the same weights: float32, emulated float16 without scaling, and
// emulated float16 with the loss scaled by 2^16 and the gradients divided back.
TEST(Fp16Range, ModelLosesSmallGradientsWithoutScalingAndKeepsThemWithIt) {
  torch::manual_seed(0);
  auto x = torch::randn({32, 1, 28, 28});
  auto y = torch::randint(10, {32}, torch::kLong);
  auto grads = [&](bool fp16, double scale) {
    torch::manual_seed(1);
    SmallCnn model;
    model->set_fp16_range(fp16);
    // A loss normalised by a data-set size, as the trainer's default: small gradients.
    auto loss = torch::nn::functional::cross_entropy(
                    model->forward(x), y,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
                60000.0;
    (loss * scale).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : model->parameters()) g.push_back(p.grad() / scale);
    return std::make_pair(g, model->grad_zeros().fraction());
  };
  const auto [g32, zeros32] = grads(false, 1.0);
  const auto [g16, zeros16] = grads(true, 1.0);
  const auto [g16s, zeros16s] = grads(true, 65536.0);
  // Without scaling float16 zeroes far more gradient entries than float32 holds...
  EXPECT_GT(zeros16, zeros32 + 0.2) << zeros16 << " vs " << zeros32;
  // ...with scaling, about as many as float32.
  EXPECT_LT(zeros16s, zeros32 + 0.02) << zeros16s << " vs " << zeros32;
  // And the first conv's weight gradient: unscaled float16 is far off, scaled is close.
  auto rel = [&](const torch::Tensor& a) {
    return ((a - g32[0]).norm() / g32[0].norm()).item<double>();
  };
  EXPECT_GT(rel(g16[0]), 0.1);
  EXPECT_LT(rel(g16s[0]), 0.01);
}
