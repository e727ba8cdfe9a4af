// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: what a sharded clip's agreement all-reduces (FoundInfHook::agree_with_norm_),
// without the transport: the C++ binding (lucid::distributed, c10d) and the Python one
// (lucid_amp.distributed, torch.distributed) each reduce the same payload with their own
// process group, and apply the result with the same code.
//
// NOTE: [Sharded norm agreement]
// A gradient norm's partial travels beside the overflow flag in one all-reduce, as
// [flag, partial] reduced with SUM for a finite p: a sum of 0/1 flags is non-zero exactly
// when some rank overflowed, and the partials (sums of |g|^p over disjoint shards) add up
// to the partial of all gradients, differing from one process's only in the order of the
// float32 additions: no root is taken before the sum, so none is undone after it. An inf
// or NaN partial reaches every rank through the sum. For inf the partials (largest |g|)
// combine by MAX, and so does the flag, but a backend's MAX need not keep NaN (Gloo's is
// std::max, whose result with a NaN depends on the order), so a NaN partial travels as 0
// with a third element that says so, and comes back as NaN on every rank.
// The flag comes back as 0 or 1; turning a non-finite combined norm into an overflow is
// the scaler's part, identical on every rank because the combined partial is.

#include <ATen/ATen.h>

namespace lucid {
namespace amp {
namespace detail {

// Checks that `tensor` (an overflow flag or a norm partial, named by `what`) is one
// contiguous float32 element, as an agreement reduces it in place; c10::Error naming `who`
// otherwise.
void check_agreement_operand(const at::Tensor& tensor, const char* what, const char* who);

// The tensor to all-reduce, and with which operation.
struct NormAgreementPayload {
  at::Tensor values;  // float32, 1-D, on the flag's device
  bool reduce_max;    // MAX for the inf norm, else SUM
};

// Checks the arguments (c10::ValueError for a norm_type <= 0, c10::Error for a flag or
// partial that is not one float32 element, or on different devices) and packs them.
// Args: found_inf and norm_partial as FoundInfHook::agree_with_norm_ gets them; norm_type
// its p.
NormAgreementPayload norm_agreement_payload(const at::Tensor& found_inf,
                                            const at::Tensor& norm_partial, double norm_type,
                                            const char* who);

// Writes the agreed flag (0 or 1) and partial from `reduced`, the payload after the
// all-reduce, into found_inf and norm_partial, in place.
void apply_norm_agreement(const at::Tensor& reduced, at::Tensor& found_inf,
                          at::Tensor& norm_partial, double norm_type);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
