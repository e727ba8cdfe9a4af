// SPDX-License-Identifier: BSD-3-Clause
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

using lucid::apps::fp16_range;
using lucid::apps::grad_probe;
using lucid::apps::GradZeroCounter;
using lucid::apps::round_through_half;
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

TEST(Fp16Range, FlushModeZeroesWhatWouldBeSubnormalForwardAndBackward) {
  const float min_normal = std::ldexp(1.0f, -14);
  auto x = torch::tensor({min_normal, min_normal * 0.99f, 1e-6f, -1e-6f, 1.0f},
                         torch::requires_grad());
  auto y = fp16_range(x, /*flush_subnormals=*/true);
  EXPECT_TRUE(torch::equal(y, torch::tensor({min_normal, 0.0f, 0.0f, 0.0f, 1.0f})));
  y.backward(torch::tensor({1e-4f, 6e-5f, 1e-7f, 1.0f, 70000.0f}));
  EXPECT_TRUE(torch::equal(
      x.grad(), torch::tensor({round_through_half(torch::tensor(1e-4f)).item<float>(), 0.0f,
                               0.0f, 1.0f, std::numeric_limits<float>::infinity()})));
  // IEEE mode keeps them as subnormals.
  EXPECT_GT(round_through_half(torch::tensor(1e-6f)).item<float>(), 0.0f);
}

TEST(Fp16Range, ProbeCountsZerosAfterRounding) {
  GradZeroCounter counter;
  auto x = torch::ones({4}, torch::requires_grad());
  grad_probe(x, /*round_fp16=*/true, /*flush_subnormals=*/false, &counter).backward(torch::tensor({0.0f, 1e-9f, 1e-3f, 1.0f}));
  EXPECT_EQ(counter.entries, 4);
  EXPECT_DOUBLE_EQ(counter.fraction(), 0.5);  // the 0 and the flushed 1e-9
  auto z = torch::ones({4}, torch::requires_grad());
  grad_probe(z, /*round_fp16=*/false, /*flush_subnormals=*/false, &counter).backward(torch::tensor({0.0f, 1e-9f, 1e-3f, 1.0f}));
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
    model->set_fp16_range(fp16, /*flush_subnormals=*/true);  // the trainer's default
    // The trainer's default loss: the batch's share of a 60000-image training set's mean.
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
  // Without scaling every gradient is below float16's normal range and flushes...
  EXPECT_GT(zeros16, 0.99) << zeros16 << " vs " << zeros32;
  EXPECT_LT(zeros32, 0.8);
  // ...with scaling about as many entries are 0 as in float32 (ReLU's zeros).
  EXPECT_LT(zeros16s, zeros32 + 0.05) << zeros16s << " vs " << zeros32;
  // The first conv's weight gradient: unscaled float16 has none, scaled is close.
  auto rel = [&](const torch::Tensor& a) {
    return ((a - g32[0]).norm() / g32[0].norm()).item<double>();
  };
  EXPECT_EQ(g16[0].count_nonzero().item<int64_t>(), 0);
  EXPECT_LT(rel(g16s[0]), 0.1) << rel(g16s[0]);
}
