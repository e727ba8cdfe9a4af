// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// What one fused optimizer launch passes its kernels: the hyper-parameters and the order
// of the tensor lists. Shared by the CPU and CUDA kernels and the launch code in
// src/optim; plain C++ with no includes, so the CUDA kernels compile without LibTorch and
// no kernel depends on an optimizer header.

namespace lucid {
namespace optim {
namespace detail {

// The slots of the device copies of the hyper-parameters that schedules change (NOTE:
// [Hyper-parameters on the device] in src/optim/live_hyper_parameters.cpp): float64, one
// entry per slot. A kernel given them reads these values there instead of the host values
// of its launch, so that a CUDA graph replays with the values of the replay.
struct LiveSlot {
  enum : int { kLr = 0, kWeightDecay = 1, kMomentum = 2 };
  static constexpr int kCount = 3;
};

struct AdamHyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad;
  bool decoupled_weight_decay;   // AdamW: p *= 1 - lr * weight_decay, grad untouched
  const double* live = nullptr;  // device copies in LiveSlot order, or null (CPU)
};

struct SgdHyper {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  const double* live = nullptr;  // device copies in LiveSlot order, or null (CPU)
};

// The lists of one fused Adam/AdamW launch, in this order. The step counters (float32,
// one 0-dim tensor per parameter) follow the last data list: at kSteps, or at
// kStepsAmsgrad when max_exp_avg_sq is present.
struct AdamList {
  enum : int {
    kParam = 0,
    kGrad = 1,
    kExpAvg = 2,
    kExpAvgSq = 3,
    kMaxExpAvgSq = 4,  // amsgrad only
  };
  static constexpr int kSteps = kExpAvgSq + 1;
  static constexpr int kStepsAmsgrad = kMaxExpAvgSq + 1;
};

// The lists of one fused SGD launch, in this order; the step counters follow the last
// data list: at kSteps, or at kStepsMomentum when momentum buffers are present. A
// counter of 0 means the buffer is still to be initialised with the first gradient.
struct SgdList {
  enum : int {
    kParam = 0,
    kGrad = 1,
    kMomentumBuffer = 2,  // momentum != 0 only
  };
  static constexpr int kSteps = kGrad + 1;
  static constexpr int kStepsMomentum = kMomentumBuffer + 1;
};

}  // namespace detail
}  // namespace optim
}  // namespace lucid
