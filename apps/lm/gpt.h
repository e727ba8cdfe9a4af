// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// A small GPT (decoder-only transformer) over bytes: token and position embeddings,
// pre-norm blocks of causal self-attention and a GELU MLP, a final LayerNorm and a
// linear head to 256 logits.

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <vector>

#include "fp16_range.h"

namespace lucid {
namespace lm {

/// The model's shape.
struct GptShape {
  int64_t vocab = 256;   ///< bytes
  int64_t context = 128;
  int64_t d_model = 128;
  int64_t layers = 4;
  int64_t heads = 4;
};

class TinyGptImpl : public torch::nn::Module {
 public:
  /// GPT-2's initialisation (NOTE: [GPT-2 init] in gpt.cpp); seeded by the caller.
  explicit TinyGptImpl(const GptShape& shape);

  /// tokens int64 [B, T] (T <= context) -> logits [B, T, vocab] (float16/bfloat16 under
  /// autocast, float32 otherwise).
  torch::Tensor forward(const torch::Tensor& tokens);

  /// The CPU's float16 emulation, as the CNN's (NOTE: [float16 range emulation] in
  /// apps/common/fp16_range.cpp): every input, weight, bias and output of a linear and of
  /// the two attention matmuls, forwards and backwards, rounded through float16.
  void set_fp16_range(bool on, bool flush_subnormals) {
    fp16_range_ = on;
    flush_subnormals_ = flush_subnormals;
  }
  /// Zero entries among the gradients that crossed a linear backwards (activations,
  /// weights, biases; after float16 rounding where it is on). The attention matmuls are
  /// left out: the causal mask zeroes half of their gradients in every precision.
  apps::GradZeroCounter& grad_zeros() { return grad_zeros_; }
  const GptShape& shape() const { return shape_; }

 private:
  struct Block {
    torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
    torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, out{nullptr};
  };
  torch::Tensor round_(const torch::Tensor& t, bool count);
  torch::Tensor linear_(const torch::Tensor& x, const torch::nn::Linear& layer);
  torch::Tensor attention_(const torch::Tensor& x, const Block& b);

  GptShape shape_;
  torch::nn::Embedding tokens_{nullptr}, positions_{nullptr};
  std::vector<Block> blocks_;
  torch::nn::LayerNorm ln_final_{nullptr};
  torch::nn::Linear head_{nullptr};
  bool fp16_range_ = false;
  bool flush_subnormals_ = false;
  apps::GradZeroCounter grad_zeros_;
};
TORCH_MODULE(TinyGpt);

}  // namespace lm
}  // namespace lucid
