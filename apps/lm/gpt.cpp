// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [GPT-2 init]
// Every linear and embedding weight ~ N(0, 0.02), biases 0, and the two projections that
// write into the residual stream (attention out, MLP out) ~ N(0, 0.02 / sqrt(2 layers)),
// as GPT-2 does. Nothing here is tuned towards float16 trouble: the gradients are small
// because the loss is the mean over every token of the batch (B x T of them) and the
// weights are small, which is the ordinary case.

#include "gpt.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <cmath>
#include <limits>
#include <string>

namespace lucid {
namespace lm {

TinyGptImpl::TinyGptImpl(const GptShape& shape) : shape_(shape) {
  TORCH_CHECK_VALUE(shape.vocab > 0 && shape.context > 0 && shape.layers > 0,
                    "vocabulary, context and layers must be positive.");
  TORCH_CHECK_VALUE(shape.heads > 0 && shape.d_model % shape.heads == 0, "d_model ",
                    shape.d_model, " is not a multiple of the ", shape.heads, " heads.");
  const int64_t d = shape.d_model;
  tokens_ = register_module("tokens", torch::nn::Embedding(shape.vocab, d));
  positions_ = register_module("positions", torch::nn::Embedding(shape.context, d));
  for (int64_t i = 0; i < shape.layers; ++i) {
    const std::string p = "block" + std::to_string(i) + "_";
    Block b;
    b.ln1 = register_module(p + "ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    b.qkv = register_module(p + "qkv", torch::nn::Linear(d, 3 * d));
    b.proj = register_module(p + "proj", torch::nn::Linear(d, d));
    b.ln2 = register_module(p + "ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    b.fc = register_module(p + "fc", torch::nn::Linear(d, 4 * d));
    b.out = register_module(p + "out", torch::nn::Linear(4 * d, d));
    blocks_.push_back(b);
  }
  ln_final_ = register_module("ln_final", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
  head_ = register_module("head", torch::nn::Linear(d, shape.vocab));

  torch::NoGradGuard no_grad;
  const double std = 0.02, residual_std = 0.02 / std::sqrt(2.0 * double(shape.layers));
  auto init = [](const torch::nn::Linear& l, double s) {
    torch::nn::init::normal_(l->weight, 0.0, s);
    torch::nn::init::zeros_(l->bias);
  };
  torch::nn::init::normal_(tokens_->weight, 0.0, std);
  torch::nn::init::normal_(positions_->weight, 0.0, std);
  for (const auto& b : blocks_) {
    init(b.qkv, std);
    init(b.proj, residual_std);
    init(b.fc, std);
    init(b.out, residual_std);
  }
  init(head_, std);
}

torch::Tensor TinyGptImpl::round_(const torch::Tensor& t, bool count) {
  const bool counted = count && at::GradMode::is_enabled() && t.requires_grad();
  return apps::grad_probe(t, fp16_range_, flush_subnormals_,
                             counted ? &grad_zeros_ : nullptr);
}

torch::Tensor TinyGptImpl::linear_(const torch::Tensor& x, const torch::nn::Linear& layer) {
  // at::linear rather than the module's forward, so that the weights pass round_ too;
  // under autocast this is the op that autocast casts.
  return round_(at::linear(round_(x, true), round_(layer->weight, true),
                           round_(layer->bias, true)),
                true);
}

torch::Tensor TinyGptImpl::attention_(const torch::Tensor& x, const Block& b) {
  const int64_t batch = x.size(0), t = x.size(1), h = shape_.heads, dh = shape_.d_model / h;
  // [3, B, heads, T, dh]
  const auto qkv = linear_(x, b.qkv).view({batch, t, 3, h, dh}).permute({2, 0, 3, 1, 4});
  const auto q = qkv[0] * (1.0 / std::sqrt(double(dh))), k = qkv[1], v = qkv[2];
  auto scores = round_(at::matmul(round_(q, false), round_(k.transpose(-2, -1), false)), false);
  const auto future = at::ones({t, t}, x.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  // softmax runs in float32 under float16 autocast (its fp32 list); the product with v
  // is cast back down.
  const auto weights = at::softmax(scores, -1, at::kFloat);
  const auto mixed =
      round_(at::matmul(round_(weights.to(v.scalar_type()), false), round_(v, false)), false);
  return linear_(mixed.transpose(1, 2).reshape({batch, t, shape_.d_model}), b.proj);
}

torch::Tensor TinyGptImpl::forward(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TORCH_CHECK_VALUE(t <= shape_.context, "sequence of ", t, " tokens is longer than the ",
                    shape_.context, "-token context.");
  auto x = tokens_(tokens) + positions_(at::arange(t, tokens.options()));
  for (auto& b : blocks_) {
    x = x + attention_(b.ln1->forward(x), b);
    x = x + linear_(at::gelu(linear_(b.ln2->forward(x), b.fc)), b.out);
  }
  return linear_(ln_final_->forward(x), head_);
}

}  // namespace lm
}  // namespace lucid
