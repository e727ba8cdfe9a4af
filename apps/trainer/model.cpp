// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [Small head]
// The last layer can start small (its default init times head_init_gain; 1, i.e. off, by
// default): a small head makes every gradient flowing back into the network small in the
// first steps, another way into float16's underflow. With Adam the head grows within a
// few dozen steps, so the effect is short-lived; the trainer's default relies on the
// loss normalisation instead (NOTE: [Loss normalisation] in trainer.cpp).

#include "model.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include "fp16_range.h"

namespace lucid {
namespace trainer {

SmallCnnImpl::SmallCnnImpl(double head_init_gain) {
  conv1_ = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 3).padding(1)));
  conv2_ = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 3).padding(1)));
  fc1_ = register_module("fc1", torch::nn::Linear(32 * 7 * 7, 64));
  fc2_ = register_module("fc2", torch::nn::Linear(64, 10));
  torch::NoGradGuard no_grad;
  fc2_->weight.mul_(head_init_gain);
  fc2_->bias.mul_(head_init_gain);
}

torch::Tensor SmallCnnImpl::q_(const torch::Tensor& t) {
  // Counting only where a gradient will flow; evaluation passes straight through.
  return apps::grad_probe(t, fp16_range_, flush_subnormals_,
                    at::GradMode::is_enabled() && t.requires_grad() ? &grad_zeros_ : nullptr);
}

torch::Tensor SmallCnnImpl::forward(const torch::Tensor& x) {
  // at::conv2d / at::linear rather than the modules' forward, so that the weights can be
  // passed through q_ too; under autocast these are the ops autocast casts.
  auto h = q_(at::conv2d(q_(x), q_(conv1_->weight), q_(conv1_->bias), 1, 1));
  h = at::max_pool2d(at::relu(h), 2);
  h = q_(at::conv2d(q_(h), q_(conv2_->weight), q_(conv2_->bias), 1, 1));
  h = at::max_pool2d(at::relu(h), 2).flatten(1);
  h = at::relu(q_(at::linear(q_(h), q_(fc1_->weight), q_(fc1_->bias))));
  return q_(at::linear(q_(h), q_(fc2_->weight), q_(fc2_->bias)));
}

}  // namespace trainer
}  // namespace lucid
