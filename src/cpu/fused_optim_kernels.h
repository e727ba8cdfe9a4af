#pragma once

// CPU fused optimizer kernels: the twins of the CUDA ones (src/cuda/multi_tensor_kernels.cu),
// same formulas in the same order. Unchecked on purpose: src/optim/ owns the
// preconditions: all tensors on the CPU, contiguous, of one dtype (float32 or float64)
// per launch except the step counters (float32, 0-dim).

#include <ATen/ATen.h>

#include <vector>

#include "optim/fused_hyper.h"

namespace lucid {
namespace optim {
namespace cpu {

// lists: params, grads, exp_avg, exp_avg_sq, [max_exp_avg_sq], steps. Gradients are
// multiplied by inv_scale; the caller skips the call when the step must be skipped.
void fused_adam_(const std::vector<std::vector<at::Tensor>>& lists,
                 const detail::AdamHyper& hyper, double inv_scale);

// lists: params, grads, [momentum_buffer], steps.
void fused_sgd_(const std::vector<std::vector<at::Tensor>>& lists,
                const detail::SgdHyper& hyper, double inv_scale);

}  // namespace cpu
}  // namespace optim
}  // namespace lucid
