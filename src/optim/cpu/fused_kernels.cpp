// SPDX-License-Identifier: BSD-3-Clause
#include "optim/cpu/fused_kernels.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <optional>

namespace lucid {
namespace optim {
namespace cpu {
namespace {

using detail::AdamList;
using detail::SgdList;

// Work items of at most this many elements, so one large tensor and many small ones
// both spread over ATen's threads.
constexpr int64_t kChunkElements = int64_t{1} << 15;

struct Item {
  size_t tensor;
  int64_t begin, end;
};

std::vector<Item> chunk(const std::vector<at::Tensor>& params) {
  std::vector<Item> items;
  for (size_t t = 0; t < params.size(); ++t) {
    for (int64_t b = 0; b < params[t].numel(); b += kChunkElements) {
      items.push_back({t, b, std::min(b + kChunkElements, params[t].numel())});
    }
  }
  return items;
}

template <typename T>
T* ptr(const std::vector<std::vector<at::Tensor>>& lists, size_t list, size_t t) {
  return lists[list][t].data_ptr<T>();
}

template <typename T>
void adam_typed(const std::vector<std::vector<at::Tensor>>& lists, const detail::AdamHyper& h,
                double inv_scale) {
  const size_t steps_list = h.amsgrad ? AdamList::kStepsAmsgrad : AdamList::kSteps;
  const auto& params = lists[AdamList::kParam];
  const T inv = static_cast<T>(inv_scale);
  const std::vector<Item> items = chunk(params);
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    // The bias corrections of the last step count met: the tensors of a group usually
    // share it, and two pow() per tensor are most of a small tensor's time.
    std::optional<double> corrected_step;
    T step_size = 0;
    T sqrt_bc2 = 0;
    for (int64_t i = b; i < e; ++i) {
      const Item& it = items[i];
      // The step being taken; the counters are incremented after every chunk is done.
      const double step = static_cast<double>(*ptr<float>(lists, steps_list, it.tensor)) + 1.0;
      if (!corrected_step.has_value() || step != *corrected_step) {
        step_size = static_cast<T>(h.lr / (1.0 - std::pow(h.beta1, step)));
        sqrt_bc2 = static_cast<T>(std::sqrt(1.0 - std::pow(h.beta2, step)));
        corrected_step = step;
      }
      const T decay = static_cast<T>(1.0 - h.lr * h.weight_decay);
      T* p = ptr<T>(lists, AdamList::kParam, it.tensor);
      const T* g = ptr<T>(lists, AdamList::kGrad, it.tensor);
      T* m = ptr<T>(lists, AdamList::kExpAvg, it.tensor);
      T* v = ptr<T>(lists, AdamList::kExpAvgSq, it.tensor);
      T* vmax = h.amsgrad ? ptr<T>(lists, AdamList::kMaxExpAvgSq, it.tensor) : nullptr;
      for (int64_t k = it.begin; k < it.end; ++k) {
        T pk = p[k], gk = g[k] * inv;
        if (h.weight_decay != 0) {
          if (h.decoupled_weight_decay) {
            pk = pk * decay;
          } else {
            gk = gk + static_cast<T>(h.weight_decay) * pk;
          }
        }
        const T mk = m[k] * static_cast<T>(h.beta1) + static_cast<T>(1 - h.beta1) * gk;
        const T vk = v[k] * static_cast<T>(h.beta2) + static_cast<T>(1 - h.beta2) * gk * gk;
        T v_used = vk;
        if (vmax != nullptr) {
          v_used = vmax[k] > vk ? vmax[k] : vk;
          vmax[k] = v_used;
        }
        const T denom = std::sqrt(v_used) / sqrt_bc2 + static_cast<T>(h.eps);
        p[k] = pk - step_size * (mk / denom);
        m[k] = mk;
        v[k] = vk;
      }
    }
  });
}

template <typename T>
void sgd_typed(const std::vector<std::vector<at::Tensor>>& lists, const detail::SgdHyper& h,
               double inv_scale) {
  const bool momentum = h.momentum != 0;
  const size_t steps_list = momentum ? SgdList::kStepsMomentum : SgdList::kSteps;
  const T inv = static_cast<T>(inv_scale);
  const std::vector<Item> items = chunk(lists[SgdList::kParam]);
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Item& it = items[i];
      const bool first = *ptr<float>(lists, steps_list, it.tensor) == 0.0f;
      T* p = ptr<T>(lists, SgdList::kParam, it.tensor);
      const T* g = ptr<T>(lists, SgdList::kGrad, it.tensor);
      T* buf = momentum ? ptr<T>(lists, SgdList::kMomentumBuffer, it.tensor) : nullptr;
      for (int64_t k = it.begin; k < it.end; ++k) {
        T d = g[k] * inv;
        if (h.weight_decay != 0) d = d + static_cast<T>(h.weight_decay) * p[k];
        if (momentum) {
          const T bk = first ? d
                             : buf[k] * static_cast<T>(h.momentum) +
                                   static_cast<T>(1 - h.dampening) * d;
          buf[k] = bk;
          d = h.nesterov ? d + static_cast<T>(h.momentum) * bk : bk;
        }
        p[k] = p[k] - static_cast<T>(h.lr) * d;
      }
    }
  });
}

void increment_steps(const std::vector<at::Tensor>& steps) {
  for (const auto& s : steps) {
    *s.data_ptr<float>() += 1.0f;
  }
}

}  // namespace

void fused_adam_(const std::vector<std::vector<at::Tensor>>& lists,
                 const detail::AdamHyper& hyper, double inv_scale) {
  if (lists[AdamList::kParam].front().scalar_type() == at::kDouble) {
    adam_typed<double>(lists, hyper, inv_scale);
  } else {
    adam_typed<float>(lists, hyper, inv_scale);
  }
  increment_steps(lists.back());
}

void fused_sgd_(const std::vector<std::vector<at::Tensor>>& lists,
                const detail::SgdHyper& hyper, double inv_scale) {
  if (lists[SgdList::kParam].front().scalar_type() == at::kDouble) {
    sgd_typed<double>(lists, hyper, inv_scale);
  } else {
    sgd_typed<float>(lists, hyper, inv_scale);
  }
  increment_steps(lists.back());
}

}  // namespace cpu
}  // namespace optim
}  // namespace lucid
