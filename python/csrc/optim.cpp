// SPDX-License-Identifier: BSD-3-Clause
// Python bindings of lucid-amp's fused optimizer kernels (lucid_amp._C._fused_adam_ and
// _fused_sgd_), for lucid_amp.optim's torch.optim.Optimizer subclasses
// (python/lucid_amp/optim/fused.py), which keep the state in torch.optim's form and hand
// one param group's aligned lists over per step. Here they are checked, grouped by device
// and dtype and launched through the same routing as lucid::optim's C++ optimizers.

#include "bindings.h"

#include "optim/fused_launch.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <vector>

namespace lucid {
namespace python {
namespace {

using optim::detail::AdamHyper;
using optim::detail::Bucket;
using optim::detail::SgdHyper;
using TensorList = std::vector<at::Tensor>;

// Indices of `params` per (device, dtype), in first-seen order; every list in `lists`
// must be aligned with `params`.
struct Group {
  Bucket bucket;
  std::vector<size_t> index;
};

std::vector<Group> group_by_device_and_dtype(const char* name, const TensorList& params,
                                             const TensorList& grads,
                                             const std::vector<const TensorList*>& states) {
  TORCH_CHECK(grads.size() == params.size(), name, ": ", params.size(), " parameters but ",
              grads.size(), " gradients.");
  for (const TensorList* s : states) {
    TORCH_CHECK(s->size() == params.size(), name, ": a state list of ", s->size(),
                " tensors for ", params.size(), " parameters.");
  }
  std::vector<Group> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor& g = grads[i];
    TORCH_CHECK(g.defined(), name, ": parameter ", i, " has no gradient.");
    TORCH_CHECK_NOT_IMPLEMENTED(!g.is_sparse(), name, " does not support sparse gradients.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, name,
        " updates float32 and float64 parameters; parameter ", i, " is ", p.scalar_type(),
        ". Keep master weights in float32 and let autocast run the forward pass.");
    TORCH_CHECK(g.scalar_type() == p.scalar_type(), name, ": parameter ", i, " is ",
                p.scalar_type(), " but its gradient is ", g.scalar_type(), ".");
    TORCH_CHECK(g.device() == p.device(), name, ": parameter ", i, " is on ", p.device(),
                " but its gradient is on ", g.device(), ".");
    TORCH_CHECK_NOT_IMPLEMENTED(p.is_cpu() || p.is_cuda(), name,
                                " runs on CPU and CUDA; parameter ", i, " is on ", p.device(), ".");
    for (const TensorList* s : states) {
      const at::Tensor& t = (*s)[i];
      TORCH_CHECK(t.device() == p.device() && t.is_contiguous(), name, ": the state of parameter ",
                  i, " must be contiguous and on ", p.device(), ".");
    }
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& gr) {
      return gr.bucket.device == p.device() && gr.bucket.dtype == p.scalar_type();
    });
    if (it == groups.end()) {
      groups.push_back({Bucket{p.device(), p.scalar_type(), {}, {}, {}}, {}});
      it = std::prev(groups.end());
    }
    it->bucket.originals.push_back(p);
    it->bucket.params.push_back(p.is_contiguous() ? p : p.contiguous());
    it->bucket.grads.push_back(g.is_contiguous() ? g : g.contiguous());
    it->index.push_back(i);
  }
  return groups;
}

TensorList pick(const TensorList& list, const std::vector<size_t>& index) {
  TensorList out;
  out.reserve(index.size());
  for (size_t i : index) {
    out.push_back(list[i]);
  }
  return out;
}

at::Tensor or_undefined(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

void fused_adam_(const TensorList& params, const TensorList& grads, const TensorList& exp_avg,
                 const TensorList& exp_avg_sq, const TensorList& max_exp_avg_sq,
                 const TensorList& steps, double lr, double beta1, double beta2, double eps,
                 double weight_decay, bool amsgrad, bool decoupled_weight_decay,
                 const c10::optional<at::Tensor>& grad_scale,
                 const c10::optional<at::Tensor>& found_inf) {
  const char* name = decoupled_weight_decay ? "FusedAdamW" : "FusedAdam";
  std::vector<const TensorList*> states{&exp_avg, &exp_avg_sq, &steps};
  if (amsgrad) {
    states.push_back(&max_exp_avg_sq);
  }
  for (const at::Tensor& s : steps) {
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.dim() == 0, name,
                ": step counters must be float32 0-dim tensors.");
  }
  torch::NoGradGuard no_grad;
  const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, amsgrad, decoupled_weight_decay};
  for (const Group& g : group_by_device_and_dtype(name, params, grads, states)) {
    std::vector<TensorList> lists{g.bucket.params, g.bucket.grads, pick(exp_avg, g.index),
                                  pick(exp_avg_sq, g.index)};
    if (amsgrad) {
      lists.push_back(pick(max_exp_avg_sq, g.index));
    }
    lists.push_back(pick(steps, g.index));
    optim::detail::launch_adam(g.bucket, lists, hyper, or_undefined(grad_scale),
                               or_undefined(found_inf));
  }
}

void fused_sgd_(const TensorList& params, const TensorList& grads,
                const TensorList& momentum_buffer, const TensorList& steps, double lr,
                double momentum, double dampening, double weight_decay, bool nesterov,
                const c10::optional<at::Tensor>& grad_scale,
                const c10::optional<at::Tensor>& found_inf) {
  const bool has_momentum = momentum != 0;
  std::vector<const TensorList*> states{&steps};
  if (has_momentum) {
    states.push_back(&momentum_buffer);
  }
  for (const at::Tensor& s : steps) {
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.dim() == 0,
                "FusedSGD: step counters must be float32 0-dim tensors.");
  }
  torch::NoGradGuard no_grad;
  const SgdHyper hyper{lr, momentum, dampening, weight_decay, nesterov};
  for (const Group& g : group_by_device_and_dtype("FusedSGD", params, grads, states)) {
    std::vector<TensorList> lists{g.bucket.params, g.bucket.grads};
    if (has_momentum) {
      lists.push_back(pick(momentum_buffer, g.index));
    }
    lists.push_back(pick(steps, g.index));
    optim::detail::launch_sgd(g.bucket, lists, hyper, or_undefined(grad_scale),
                              or_undefined(found_inf));
  }
}

}  // namespace

void bind_optim(py::module& m) {
  m.def("_fused_adam_", torch::wrap_pybind_function(fused_adam_),
        "One fused Adam/AdamW update of one param group's aligned lists (lucid_amp.optim).");
  m.def("_fused_sgd_", torch::wrap_pybind_function(fused_sgd_),
        "One fused SGD update of one param group's aligned lists (lucid_amp.optim).");
}

}  // namespace python
}  // namespace lucid
