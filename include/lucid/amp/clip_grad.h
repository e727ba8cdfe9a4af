// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// Clipping gradients by their total norm without a host synchronisation: the C++ form of
/// torch::nn::utils::clip_grad_norm_ that leaves the norm on the device. With a
/// GradScaler, use GradScaler::clip_grad_norm_ instead: it unscales and clips in the same
/// pass.

#include <ATen/core/Tensor.h>

#include <vector>

namespace lucid {
namespace amp {

/// Scales the gradients of `parameters` in place so that their total `norm_type` norm is
/// at most `max_norm` (coefficient max_norm / (norm + 1e-6), at most 1, as PyTorch), and
/// returns that norm as a float32 0-dim tensor on the first gradient's device, without
/// reading it back. Norms 2 and inf take one read pass and one write pass over all
/// gradients; other p > 0 the ATen operations of PyTorch's algorithm. Parameters without
/// a gradient are passed over; no gradient at all returns 0. Gradients: float32, float64
/// or bfloat16, dense or sparse, on any devices. Throws c10::ValueError for `max_norm`
/// not finite and > 0 or `norm_type` not > 0, changing nothing; c10::NotImplementedError
/// for other gradient dtypes. With `error_if_nonfinite` (as PyTorch's), a non-finite norm
/// throws c10::Error before any gradient is clipped; that check reads the norm back, the
/// one host synchronisation, as PyTorch's does.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                           double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace amp
}  // namespace lucid
