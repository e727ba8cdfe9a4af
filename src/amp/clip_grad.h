// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the argument checks clip_grad_norm_ and GradScaler::clip_grad_norm_ share.

namespace lucid {
namespace amp {
namespace detail {

// max_norm finite and > 0, norm_type > 0 (inf allowed); c10::ValueError naming `who`.
void check_clip_arguments(double max_norm, double norm_type, const char* who);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
