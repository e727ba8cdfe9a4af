#pragma once

// Hyper-parameters of one fused optimizer launch, shared by the CPU and CUDA kernels
// (plain structs: the CUDA kernels compile without LibTorch).

namespace lucid {
namespace optim {
namespace detail {

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
  bool decoupled_weight_decay;  // AdamW: p *= 1 - lr * weight_decay, grad untouched
};

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

}  // namespace detail
}  // namespace optim
}  // namespace lucid
