// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [float16 range emulation]
// On a GPU, fp16 autocast casts each input of a matmul/conv (activation, weight, bias)
// to float16, the op accumulates in float32 and writes a float16 output; in backward the
// op receives a float16 gradient and writes float16 gradients for its inputs, which the
// casts' backward widen to float32 for the float32 master weights. Every tensor that
// crosses such an op, forwards or backwards, is therefore a float16 value. Rounding each
// of them through at::kHalf (here, around every conv and linear of the model) reproduces
// exactly that set of roundings on the CPU, with float32 arithmetic in between:
// - forward: activations lose mantissa bits and saturate to inf past 65504;
// - backward: gradients below float16's smallest subnormal (2^-24, about 6e-8) become 0
//   and those below its smallest normal (2^-14, about 6.1e-5) keep only a few bits.
// The second point is the underflow the loss scaler exists for: the scaler multiplies
// the loss before backward(), so the gradients are s times larger when they meet these
// roundings, and are divided by s in float32 only after them.
// Subnormals (2^-24 <= |x| < 2^-14): CUDA keeps them for float16, and so does the CPU
// conversion through c10::Half (exact IEEE rounding). Apple's Metal, the reference API's
// device, flushes them to zero; both programs emulate that by default
// (--fp16-subnormals flush), since it is the case the reference API describes and
// the one where a small CNN's gradients, with the usual batch-mean loss, underflow.

#include "fp16_range.h"

#include <torch/autograd.h>

namespace lucid {
namespace apps {
namespace {

struct Fp16Range : public torch::autograd::Function<Fp16Range> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            bool flush) {
    ctx->saved_data["flush"] = flush;
    return round_through_half(x, flush);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const bool flush = ctx->saved_data["flush"].toBool();
    // An undefined gradient means "zero" to autograd; pass it on as it is.
    return {grads[0].defined() ? round_through_half(grads[0], flush) : grads[0], at::Tensor()};
  }
};

// The counter travels as an integer in saved_data (an IValue cannot hold a pointer); it
// must outlive the backward pass, which the model that owns it guarantees.
struct GradProbe : public torch::autograd::Function<GradProbe> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            bool round_fp16, bool flush, GradZeroCounter* counter) {
    ctx->saved_data["round"] = round_fp16;
    ctx->saved_data["flush"] = flush;
    ctx->saved_data["counter"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(counter));
    // A fresh tensor even when nothing is rounded: autograd needs an output of its own.
    return round_fp16 ? round_through_half(x, flush) : x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    at::Tensor g = grads[0];
    if (!g.defined()) return {g, at::Tensor(), at::Tensor(), at::Tensor()};
    if (ctx->saved_data["round"].toBool()) {
      g = round_through_half(g, ctx->saved_data["flush"].toBool());
    }
    auto* counter = reinterpret_cast<GradZeroCounter*>(
        static_cast<intptr_t>(ctx->saved_data["counter"].toInt()));
    if (counter != nullptr) {
      const auto zeros = g.eq(0).sum();
      counter->zeros = counter->zeros.defined() ? counter->zeros + zeros : zeros;
      counter->entries += g.numel();
    }
    return {g, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

double GradZeroCounter::fraction() const {
  if (entries == 0 || !zeros.defined()) return 0.0;
  return static_cast<double>(zeros.item<int64_t>()) / static_cast<double>(entries);
}

at::Tensor grad_probe(const at::Tensor& x, bool round_fp16, bool flush_subnormals,
                      GradZeroCounter* counter) {
  if (!round_fp16 && counter == nullptr) return x;
  return GradProbe::apply(x, round_fp16, flush_subnormals, counter);
}

at::Tensor round_through_half(const at::Tensor& x, bool flush_subnormals) {
  auto y = x.to(at::kHalf).to(x.scalar_type());
  // 2^-14: float16's smallest normal magnitude.
  if (flush_subnormals) y.masked_fill_(y.abs() < 6.103515625e-05, 0.0);
  return y;
}

at::Tensor fp16_range(const at::Tensor& x, bool flush_subnormals) {
  return Fp16Range::apply(x, flush_subnormals);
}

}  // namespace apps
}  // namespace lucid
