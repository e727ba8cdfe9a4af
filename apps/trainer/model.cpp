// NOTE: [Small head]
// The last layer starts small (its default init times head_init_gain, 1e-3 in the
// trainer): the classifier begins near "all classes equally likely", a common choice
// (zero- or small-init heads), and it makes every gradient that flows back into the
// network small in the first steps, of the order of 1e-6..1e-8 at the first conv. In
// float32 those gradients are exact, and Adam turns even tiny gradients into full-size
// steps; in float16 most of them are below 2^-24 and flush to zero, so the lower layers
// do not learn until the head has grown. That is the regime loss scaling exists for.

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
  return grad_probe(t, fp16_range_, flush_subnormals_,
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
