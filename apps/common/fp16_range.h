// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// float16 range on hardware that has no float16 autocast (LibTorch 1.13's CPU autocast
// knows bfloat16 only). NOTE: [float16 range emulation] in fp16_range.cpp says what is
// rounded, and why that is enough to show underflow.

#include <ATen/ATen.h>

namespace lucid {
namespace apps {

/// Rounds `x` to the nearest float16 value and back to x's dtype (round to nearest even,
/// magnitudes past 65504 become inf; float16 subnormals, below 2^-14, kept as IEEE and
/// CUDA keep them, or flushed to 0 as Metal does), and does the same to the gradient that
/// flows back through it. Differentiable; `x`'s dtype is unchanged.
at::Tensor fp16_range(const at::Tensor& x, bool flush_subnormals = false);

/// Counts the entries of the gradients that pass backward through grad_probe, and how
/// many of them are exactly 0 (the count stays on the gradients' device: no sync).
struct GradZeroCounter {
  at::Tensor zeros;     ///< int64 0-dim, undefined until the first gradient
  int64_t entries = 0;
  /// The share of zero entries so far (reads `zeros` back: a sync on CUDA).
  double fraction() const;
};

/// Identity in forward and backward, except that (a) with `round_fp16` it is fp16_range,
/// and (b) with a `counter` the gradient that leaves it backwards (after rounding) is
/// counted. The model puts one on every tensor that crosses a conv or linear, in every
/// precision, so that the zero share is measured at the same places in all of them.
at::Tensor grad_probe(const at::Tensor& x, bool round_fp16, bool flush_subnormals,
                      GradZeroCounter* counter);

/// The rounding alone, outside autograd: `x.to(Half).to(x.dtype())`, then, with
/// `flush_subnormals`, every result below 2^-14 in magnitude set to 0.
at::Tensor round_through_half(const at::Tensor& x, bool flush_subnormals = false);

}  // namespace apps
}  // namespace lucid
