// SPDX-License-Identifier: BSD-3-Clause
// Python bindings of lucid-amp's fused optimizer kernels (lucid_amp._C._FusedGroup), for
// lucid_amp.optim's torch.optim.Optimizer subclasses (python/lucid_amp/optim/fused.py),
// which keep the state in torch.optim's form. A _FusedGroup holds one param group's
// aligned state lists, checked and grouped by device and dtype once; each step reads the
// gradients and launches through the same routing as lucid::optim's C++ optimizers.

#include "bindings.h"

#include "optim/fused_launch.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>

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

// One param group of a lucid_amp.optim optimizer, its kernel arguments kept between
// steps: the group's parameter list as Python holds it (to tell when it changed), which
// of them had a gradient when it was built, and per device and dtype the aligned state
// lists. A step reads only the gradients again; when the parameter list or the set of
// parameters with a gradient no longer matches, it does nothing and returns false, and
// Python gathers the state anew (python/lucid_amp/optim/fused.py, _CachedListsMixin).
class FusedGroup {
 public:
  // `params_list`: the group's parameters; `states`: the state lists aligned with the
  // parameters that have a gradient now (Adam: exp_avg, exp_avg_sq, [max_exp_avg_sq],
  // steps; SGD: [momentum_buffer], steps), step counters last.
  FusedGroup(std::string name, const py::list& params_list, std::vector<TensorList> states)
      : name_(std::move(name)) {
    TensorList with_grad;
    for (const py::handle item : params_list) {
      const at::Tensor p = py::cast<at::Tensor>(item);
      params_.push_back(py::reinterpret_borrow<py::object>(item));
      numel_.push_back(p.numel());
      has_grad_.push_back(p.grad().defined());
      if (has_grad_.back()) {
        with_grad.push_back(p);
      }
    }
    TORCH_CHECK(!states.empty(), name_, ": no state lists (the step counters come last).");
    for (const at::Tensor& s : states.back()) {
      TORCH_CHECK(s.scalar_type() == at::kFloat && s.dim() == 0, name_,
                  ": step counters must be float32 0-dim tensors.");
    }
    // The kernels walk a parameter's state element by element: sizes must agree.
    for (size_t s = 0; s + 1 < states.size(); ++s) {
      TORCH_CHECK(states[s].size() == with_grad.size(), name_, ": a state list of ",
                  states[s].size(), " tensors for ", with_grad.size(), " parameters.");
      for (size_t i = 0; i < with_grad.size(); ++i) {
        TORCH_CHECK(states[s][i].numel() == with_grad[i].numel(), name_,
                    ": the state of a parameter of ", with_grad[i].numel(), " elements has ",
                    states[s][i].numel(), ".");
      }
    }
    std::vector<const TensorList*> checked;
    for (const TensorList& s : states) {
      checked.push_back(&s);
    }
    const TensorList grads = grads_of(with_grad);
    for (Group& g : group_by_device_and_dtype(name_.c_str(), with_grad, grads, checked)) {
      Kept kept{g.bucket.device, g.bucket.dtype, g.index, {}};
      for (const TensorList& s : states) {
        kept.states.push_back(pick(s, g.index));
      }
      kept_.push_back(std::move(kept));
    }
  }

  bool adam_(const py::list& params_list, double lr, double beta1, double beta2, double eps,
             double weight_decay, bool amsgrad, bool decoupled_weight_decay,
             const c10::optional<at::Tensor>& grad_scale,
             const c10::optional<at::Tensor>& found_inf) {
    const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, amsgrad, decoupled_weight_decay};
    return run(params_list, [&](const Bucket& bucket, const std::vector<TensorList>& lists) {
      optim::detail::launch_adam(bucket, lists, hyper, or_undefined(grad_scale),
                                 or_undefined(found_inf));
    });
  }

  bool sgd_(const py::list& params_list, double lr, double momentum, double dampening,
            double weight_decay, bool nesterov, const c10::optional<at::Tensor>& grad_scale,
            const c10::optional<at::Tensor>& found_inf) {
    const SgdHyper hyper{lr, momentum, dampening, weight_decay, nesterov};
    return run(params_list, [&](const Bucket& bucket, const std::vector<TensorList>& lists) {
      optim::detail::launch_sgd(bucket, lists, hyper, or_undefined(grad_scale),
                                or_undefined(found_inf));
    });
  }

 private:
  struct Kept {
    at::Device device;
    at::ScalarType dtype;
    std::vector<size_t> index;        // into the parameters that have a gradient
    std::vector<TensorList> states;   // aligned with index
  };

  static TensorList grads_of(const TensorList& params) {
    TensorList grads;
    grads.reserve(params.size());
    for (const at::Tensor& p : params) {
      grads.push_back(p.grad());
    }
    return grads;
  }

  // Whether `params_list` holds the same parameters, of the same sizes, with gradients
  // exactly where they were when this group was built; if so, `with_grad` gets those
  // with a gradient. Compared by Python object, as torch.optim keys its state: a module
  // conversion may swap the tensor under a Parameter (torch.utils.swap_tensors), which
  // keeps its state, and the tensors are taken from the objects anew on every step.
  bool matches(const py::list& params_list, TensorList* with_grad) const {
    if (py::len(params_list) != params_.size()) {
      return false;
    }
    with_grad->clear();
    for (size_t i = 0; i < params_.size(); ++i) {
      PyObject* item = PyList_GET_ITEM(params_list.ptr(), static_cast<Py_ssize_t>(i));
      if (!THPVariable_Check(item)) {
        return false;
      }
      // params_ holds the objects, so an address is not reused while they are compared.
      if (item != params_[i].ptr()) {
        return false;
      }
      const at::Tensor& p = THPVariable_Unpack(item);
      if (p.numel() != numel_[i] || p.grad().defined() != has_grad_[i]) {
        return false;
      }
      if (has_grad_[i]) {
        with_grad->push_back(p);
      }
    }
    return true;
  }

  template <typename Launch>
  bool run(const py::list& params_list, Launch launch) {
    TensorList with_grad;
    if (!matches(params_list, &with_grad)) {
      return false;
    }
    torch::NoGradGuard no_grad;
    const TensorList grads = grads_of(with_grad);
    // every gradient checked before any kernel runs
    const std::vector<Group> groups =
        group_by_device_and_dtype(name_.c_str(), with_grad, grads, {});
    // A parameter moved to another device or dtype (model.to(...)) since: gather anew.
    if (groups.size() != kept_.size()) {
      return false;
    }
    for (size_t b = 0; b < groups.size(); ++b) {
      if (groups[b].bucket.device != kept_[b].device || groups[b].bucket.dtype != kept_[b].dtype ||
          groups[b].index != kept_[b].index) {
        return false;
      }
    }
    for (size_t b = 0; b < groups.size(); ++b) {
      const Group& g = groups[b];
      const Kept& kept = kept_[b];
      std::vector<TensorList> lists{g.bucket.params, g.bucket.grads};
      lists.insert(lists.end(), kept.states.begin(), kept.states.end());
      launch(g.bucket, lists);
    }
    return true;
  }

  std::string name_;
  // The group's parameters as Python objects. Not their tensors, not even weakly:
  // torch.utils.swap_tensors refuses a tensor that anything else references.
  std::vector<py::object> params_;
  std::vector<int64_t> numel_;  // each parameter's size when built
  std::vector<bool> has_grad_;  // which had a gradient when built
  std::vector<Kept> kept_;
};

}  // namespace

void bind_optim(py::module& m) {
  py::class_<FusedGroup>(m, "_FusedGroup",
                         "One param group's kernel arguments, kept between steps "
                         "(lucid_amp.optim).")
      .def(py::init(torch::wrap_pybind_function(
               [](std::string name, const py::list& params_list, std::vector<TensorList> states) {
                 return std::make_unique<FusedGroup>(std::move(name), params_list,
                                                     std::move(states));
               })),
           py::arg("name"), py::arg("params"), py::arg("states"))
      .def("adam_",
           torch::wrap_pybind_function(
               [](FusedGroup& self, const py::list& params, double lr, double beta1, double beta2,
                  double eps, double weight_decay, bool amsgrad, bool decoupled_weight_decay,
                  const c10::optional<at::Tensor>& grad_scale,
                  const c10::optional<at::Tensor>& found_inf) {
                 return self.adam_(params, lr, beta1, beta2, eps, weight_decay, amsgrad,
                                   decoupled_weight_decay, grad_scale, found_inf);
               }),
           "Steps the group with Adam/AdamW; false (nothing done) if its parameters or the "
           "set of them with a gradient changed since it was built.")
      .def("sgd_",
           torch::wrap_pybind_function(
               [](FusedGroup& self, const py::list& params, double lr, double momentum,
                  double dampening, double weight_decay, bool nesterov,
                  const c10::optional<at::Tensor>& grad_scale,
                  const c10::optional<at::Tensor>& found_inf) {
                 return self.sgd_(params, lr, momentum, dampening, weight_decay, nesterov,
                                  grad_scale, found_inf);
               }),
           "Steps the group with SGD; false (nothing done) as adam_.");
}

}  // namespace python
}  // namespace lucid
