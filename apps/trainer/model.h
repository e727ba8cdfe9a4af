// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The small CNN the trainer fits to Fashion-MNIST.

#include <torch/nn/module.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "fp16_range.h"

namespace lucid {
namespace trainer {

/// conv3x3(1->16) relu maxpool2, conv3x3(16->32) relu maxpool2, linear(1568->64) relu,
/// linear(64->10). Input [N,1,28,28] float32; output logits [N,10] (float16/bfloat16
/// under autocast, float32 otherwise).
class SmallCnnImpl : public torch::nn::Module {
 public:
  /// Default LibTorch initialisation, then the classifier head scaled by `head_init_gain`
  /// (NOTE: [Small head] in model.cpp).
  explicit SmallCnnImpl(double head_init_gain = 1.0);

  /// The forward pass; with fp16 range on, every conv/linear input, weight, bias and output
  /// is rounded through float16 in forward and backward (NOTE: [float16 range emulation]).
  torch::Tensor forward(const torch::Tensor& x);

  /// Turns the float16 range emulation on or off; `flush_subnormals`: results below
  /// 2^-14 become 0 (Metal) rather than float16 subnormals (IEEE, CUDA).
  void set_fp16_range(bool on, bool flush_subnormals = true) {
    fp16_range_ = on;
    flush_subnormals_ = flush_subnormals;
  }
  /// Whether the float16 range emulation is on.
  bool fp16_range() const { return fp16_range_; }
  /// Zero entries among the gradients that crossed the convs and linears backwards
  /// (activations, weights, biases; after float16 rounding where it is on).
  apps::GradZeroCounter& grad_zeros() { return grad_zeros_; }

 private:
  torch::Tensor q_(const torch::Tensor& t);

  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
  bool fp16_range_ = false;
  bool flush_subnormals_ = true;
  apps::GradZeroCounter grad_zeros_;
};
TORCH_MODULE(SmallCnn);

}  // namespace trainer
}  // namespace lucid
