// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The fused Adam/AdamW and SGD kernels, as templates over the shared multi-tensor
// walker: fused_kernels.cu instantiates and launches them, the kernel lab
// (benchmarks/cuda/unscale_lab.cu) times them with other chunk sizes. The same formulas
// in the same order as the CPU twins (src/optim/cpu/fused_kernels.cpp). Unchecked on
// purpose: the launchers own the preconditions (fused_kernels.h).

#include <cuda_runtime.h>

#include "cuda_common/multi_tensor_apply.cuh"
#include "optim/cuda/fused_kernels.h"

namespace lucid {
namespace optim {
namespace cuda {

using cuda_common::Element;
using cuda_common::Table;

template <typename S, bool kAmsgrad>
struct AdamOp {
  static constexpr int D = kAmsgrad ? AdamList::kStepsAmsgrad : AdamList::kSteps;
  static constexpr int kStepsList = D;  // the counters follow the last data list
  using O = typename Element<S>::opmath;
  AdamHyper h;
  O inv;
  O step_size, sqrt_bc2, decay, weight_decay;
  __device__ static constexpr bool writes(int d) { return d != AdamList::kGrad; }
  __device__ void begin_tensor(const Table& table, int t) {
    // The step being taken: the counter is incremented by a later launch.
    const double step =
        static_cast<double>(*static_cast<const float*>(table.pointer(kStepsList, t))) + 1.0;
    const double bc1 = 1.0 - pow(h.beta1, step);
    const double bc2 = 1.0 - pow(h.beta2, step);
    const double lr = h.live ? h.live[LiveSlot::kLr] : h.lr;
    const double wd = h.live ? h.live[LiveSlot::kWeightDecay] : h.weight_decay;
    step_size = static_cast<O>(lr / bc1);
    sqrt_bc2 = static_cast<O>(sqrt(bc2));
    decay = static_cast<O>(1.0 - lr * wd);
    weight_decay = static_cast<O>(wd);
  }
  __device__ void element(S (&e)[D]) {
    O p = e[AdamList::kParam], g = e[AdamList::kGrad] * inv, m = e[AdamList::kExpAvg],
      v = e[AdamList::kExpAvgSq];
    if (weight_decay != 0) {
      if (h.decoupled_weight_decay) {
        p = p * decay;
      } else {
        g = g + weight_decay * p;
      }
    }
    m = m * static_cast<O>(h.beta1) + static_cast<O>(1 - h.beta1) * g;
    v = v * static_cast<O>(h.beta2) + static_cast<O>(1 - h.beta2) * g * g;
    O v_used = v;
    if (kAmsgrad) {
      // Only read when kAmsgrad, where D > kMaxExpAvgSq; the index is clamped so that
      // the other instantiation names a valid element.
      constexpr int kMax = kAmsgrad ? AdamList::kMaxExpAvgSq : 0;
      const O vmax = e[kMax] > v ? e[kMax] : v;
      e[kMax] = vmax;
      v_used = vmax;
    }
    const O denom = sqrt(v_used) / sqrt_bc2 + static_cast<O>(h.eps);
    p = p - step_size * (m / denom);
    e[AdamList::kParam] = p;
    e[AdamList::kExpAvg] = m;
    e[AdamList::kExpAvgSq] = v;
  }
};

template <typename S, bool kMomentum>
struct SgdOp {
  static constexpr int D = kMomentum ? SgdList::kStepsMomentum : SgdList::kSteps;
  static constexpr int kStepsList = D;  // the counters follow the last data list
  using O = typename Element<S>::opmath;
  SgdHyper h;
  O inv;
  O lr, weight_decay, momentum;
  bool first = false;
  __device__ static constexpr bool writes(int d) { return d != SgdList::kGrad; }
  __device__ void begin_tensor(const Table& table, int t) {
    first = *static_cast<const float*>(table.pointer(kStepsList, t)) == 0.0f;
    lr = static_cast<O>(h.live ? h.live[LiveSlot::kLr] : h.lr);
    weight_decay = static_cast<O>(h.live ? h.live[LiveSlot::kWeightDecay] : h.weight_decay);
    momentum = static_cast<O>(h.live ? h.live[LiveSlot::kMomentum] : h.momentum);
  }
  __device__ void element(S (&e)[D]) {
    O p = e[SgdList::kParam], d = e[SgdList::kGrad] * inv;
    if (weight_decay != 0) d = d + weight_decay * p;
    if (kMomentum) {
      // Only touched when kMomentum, where D > kMomentumBuffer (clamped as in AdamOp).
      constexpr int kBuf = kMomentum ? SgdList::kMomentumBuffer : 0;
      O buf = first ? d : e[kBuf] * momentum + static_cast<O>(1 - h.dampening) * d;
      e[kBuf] = buf;
      d = h.nesterov ? d + momentum * buf : buf;
    }
    e[SgdList::kParam] = p - lr * d;
  }
};

// One fused optimizer step over a table: `Op` (AdamOp, SgdOp) updates each element, after
// the whole launch returned at once if the overflow flag is set.
template <typename S, typename Op, typename Hyper>
__global__ void __launch_bounds__(cuda_common::kThreads)
    fused_step_kernel(Table table, Hyper h, const float* scale, const float* found_inf) {
  if (cuda_common::skipped(found_inf)) return;
  Op op;
  op.h = h;
  op.inv = cuda_common::inverse_scale<typename Element<S>::opmath>(scale);
  cuda_common::walk_block_range<S, Op::D>(table, op);
}

template <typename S, bool kAmsgrad>
constexpr auto adam_kernel = fused_step_kernel<S, AdamOp<S, kAmsgrad>, AdamHyper>;
template <typename S, bool kMomentum>
constexpr auto sgd_kernel = fused_step_kernel<S, SgdOp<S, kMomentum>, SgdHyper>;

}  // namespace cuda
}  // namespace optim
}  // namespace lucid
