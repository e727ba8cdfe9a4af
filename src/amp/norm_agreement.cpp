// SPDX-License-Identifier: BSD-3-Clause
// The payload of a sharded clip's agreement (NOTE: [Sharded norm agreement] in
// norm_agreement.h).

#include "amp/norm_agreement.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace lucid {
namespace amp {
namespace detail {

void check_agreement_operand(const at::Tensor& tensor, const char* what, const char* who) {
  TORCH_CHECK(tensor.defined(), who, " got an undefined ", what, ".");
  TORCH_CHECK(tensor.scalar_type() == at::kFloat && tensor.numel() == 1, who,
              " expects a 1-element float32 ", what, ", got a ", tensor.scalar_type(),
              " tensor of ", tensor.numel(), " elements.");
  TORCH_CHECK(tensor.is_contiguous(), who, " expects a contiguous ", what, ".");
}

NormAgreementPayload norm_agreement_payload(const at::Tensor& found_inf,
                                            const at::Tensor& norm_partial, double norm_type,
                                            const char* who) {
  TORCH_CHECK_VALUE(norm_type > 0.0, who, ": norm_type must be > 0 (a finite p or inf), got ",
                    norm_type, ".");
  check_agreement_operand(found_inf, "overflow flag", who);
  check_agreement_operand(norm_partial, "norm partial", who);
  TORCH_CHECK(norm_partial.device() == found_inf.device(), who,
              " expects the norm partial on the flag's device (", found_inf.device(),
              "), got it on ", norm_partial.device(), ".");
  const at::Tensor flag = found_inf.reshape({});
  const at::Tensor partial = norm_partial.reshape({});
  if (std::isinf(norm_type)) {
    const at::Tensor is_nan = partial.isnan();
    return {at::stack({flag, partial.masked_fill(is_nan, 0.0), is_nan.to(at::kFloat)}), true};
  }
  return {at::stack({flag, partial}), false};
}

void apply_norm_agreement(const at::Tensor& reduced, at::Tensor& found_inf,
                          at::Tensor& norm_partial, double norm_type) {
  found_inf.copy_(reduced[0].ne(0.0));
  if (std::isinf(norm_type)) {
    norm_partial.copy_(
        reduced[1].masked_fill(reduced[2].ne(0.0), std::numeric_limits<float>::quiet_NaN()));
  } else {
    norm_partial.copy_(reduced[1]);
  }
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
