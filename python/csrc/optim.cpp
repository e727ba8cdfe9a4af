// SPDX-License-Identifier: BSD-3-Clause
// Python bindings of lucid-amp's fused optimizer kernels (lucid_amp._C._FusedGroup), for
// lucid_amp.optim's torch.optim.Optimizer subclasses (python/lucid_amp/optim/fused.py),
// which keep the state in torch.optim's form. A _FusedGroup holds one param group's
// aligned state lists, checked and grouped by device and dtype once; each step reads the
// gradients and launches through the same routing as lucid::optim's C++ optimizers.

#include "bindings.h"

#include "common/plain_tensor.h"
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
    common::check_plain_tensor(p, name, "parameter ", i);
    common::check_plain_tensor(g, name, "the gradient of parameter ", i);
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
      common::check_plain_tensor(t, name, "the state of parameter ", i);
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
    std::vector<bool> has_grad;
    for (const py::handle item : params_list) {
      const at::Tensor p = py::cast<at::Tensor>(item);
      params_.push_back(py::reinterpret_borrow<py::object>(item));
      numel_.push_back(p.numel());
      has_grad.push_back(p.grad().defined());
      if (has_grad.back()) {
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
    std::vector<int> bucket_of_grad(with_grad.size());
    for (Group& g : group_by_device_and_dtype(name_.c_str(), with_grad, grads, checked)) {
      Kept kept{g.bucket.device, g.bucket.dtype, g.index, {TensorList(), TensorList()}};
      for (const TensorList& s : states) {
        kept.lists.push_back(pick(s, g.index));
      }
      for (size_t i : g.index) {
        bucket_of_grad[i] = static_cast<int>(kept_.size());
      }
      kept_.push_back(std::move(kept));
    }
    size_t k = 0;
    for (bool has : has_grad) {
      bucket_of_.push_back(has ? bucket_of_grad[k++] : -1);
    }
  }

  bool adam_(const py::list& params_list, double lr, double beta1, double beta2, double eps,
             double weight_decay, bool amsgrad, bool decoupled_weight_decay,
             const c10::optional<at::Tensor>& grad_scale,
             const c10::optional<at::Tensor>& found_inf) {
    const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, amsgrad, decoupled_weight_decay};
    return run(params_list, [&](const at::Device& device, const std::vector<TensorList>& lists) {
      optim::detail::launch_adam(device, lists, hyper, or_undefined(grad_scale),
                                 or_undefined(found_inf));
    });
  }

  bool sgd_(const py::list& params_list, double lr, double momentum, double dampening,
            double weight_decay, bool nesterov, const c10::optional<at::Tensor>& grad_scale,
            const c10::optional<at::Tensor>& found_inf) {
    const SgdHyper hyper{lr, momentum, dampening, weight_decay, nesterov};
    return run(params_list, [&](const at::Device& device, const std::vector<TensorList>& lists) {
      optim::detail::launch_sgd(device, lists, hyper, or_undefined(grad_scale),
                                or_undefined(found_inf));
    });
  }

 private:
  // One device and dtype of the group. `lists` is the launch's argument: the parameters
  // and their gradients (filled for one launch, then emptied, so that no tensor of a
  // parameter is held between steps), then the state lists, kept.
  struct Kept {
    at::Device device;
    at::ScalarType dtype;
    std::vector<size_t> index;      // into the parameters that have a gradient
    std::vector<TensorList> lists;  // [params, grads, states...], aligned with index
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
      const bool has_grad = bucket_of_[i] >= 0;
      if (p.numel() != numel_[i] || p.grad().defined() != has_grad) {
        return false;
      }
      if (has_grad) {
        with_grad->push_back(p);
      }
    }
    return true;
  }

  // Empties every bucket's parameter and gradient lists.
  void release_launch_lists() {
    for (Kept& k : kept_) {
      k.lists[0].clear();
      k.lists[1].clear();
    }
  }

  // Calls release_launch_lists() when it goes out of scope.
  struct ReleaseLaunchLists {
    FusedGroup& group;
    ~ReleaseLaunchLists() { group.release_launch_lists(); }
  };

  // Fills the launch lists when nothing changed since the group was built: the same
  // parameter objects, sizes, devices and dtypes, gradients exactly where they were, each
  // dense and contiguous with its parameter's dtype and device. This is every step of a
  // steady training loop, so it checks only that, without copying any list; false sends
  // the step through fill_checked, which tells what changed or raises.
  bool fill_unchanged(const py::list& params_list) {
    if (PyList_GET_SIZE(params_list.ptr()) != static_cast<Py_ssize_t>(params_.size())) {
      return false;
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      PyObject* item = PyList_GET_ITEM(params_list.ptr(), static_cast<Py_ssize_t>(i));
      // params_ holds the objects, so an address is not reused while they are compared.
      if (item != params_[i].ptr()) {
        return false;
      }
      const at::Tensor& p = THPVariable_Unpack(item);
      const at::Tensor& g = p.grad();
      const int b = bucket_of_[i];
      if (p.numel() != numel_[i] || g.defined() != (b >= 0)) {
        return false;
      }
      if (b < 0) {
        continue;
      }
      Kept& k = kept_[static_cast<size_t>(b)];
      if (p.device() != k.device || p.scalar_type() != k.dtype || !p.is_contiguous() ||
          g.layout() != c10::kStrided || g.device() != k.device || g.scalar_type() != k.dtype ||
          !g.is_contiguous()) {
        return false;
      }
      k.lists[0].push_back(p);
      k.lists[1].push_back(g);
    }
    return true;
  }

  // The checked way to the launch lists: every gradient is checked (and raises) before
  // any kernel runs; a non-contiguous parameter or gradient goes through a contiguous
  // copy, copied back into the parameter after the launch. Returns null, with nothing
  // filled, when the group changed (another parameter list, set of gradients, device or
  // dtype) and must be gathered anew; otherwise the buckets, for their write-back.
  c10::optional<std::vector<Group>> fill_checked(const py::list& params_list) {
    TensorList with_grad;
    if (!matches(params_list, &with_grad)) {
      return c10::nullopt;
    }
    const TensorList grads = grads_of(with_grad);
    std::vector<Group> groups = group_by_device_and_dtype(name_.c_str(), with_grad, grads, {});
    // A parameter moved to another device or dtype (model.to(...)) since: gather anew.
    if (groups.size() != kept_.size()) {
      return c10::nullopt;
    }
    for (size_t b = 0; b < groups.size(); ++b) {
      if (groups[b].bucket.device != kept_[b].device || groups[b].bucket.dtype != kept_[b].dtype ||
          groups[b].index != kept_[b].index) {
        return c10::nullopt;
      }
    }
    for (size_t b = 0; b < groups.size(); ++b) {
      kept_[b].lists[0] = groups[b].bucket.params;
      kept_[b].lists[1] = groups[b].bucket.grads;
    }
    return groups;
  }

  // launch(device, lists) once per bucket; false (nothing done) when the group changed.
  template <typename Launch>
  bool run(const py::list& params_list, Launch launch) {
    ReleaseLaunchLists release{*this};
    torch::NoGradGuard no_grad;
    if (fill_unchanged(params_list)) {
      for (const Kept& k : kept_) {
        launch(k.device, k.lists);
      }
      return true;
    }
    release_launch_lists();  // what fill_unchanged filled before it stopped
    const c10::optional<std::vector<Group>> groups = fill_checked(params_list);
    if (!groups) {
      return false;
    }
    for (size_t b = 0; b < kept_.size(); ++b) {
      launch(kept_[b].device, kept_[b].lists);
      (*groups)[b].bucket.write_back();
    }
    return true;
  }

  std::string name_;
  // The group's parameters as Python objects. Not their tensors, not even weakly:
  // torch.utils.swap_tensors refuses a tensor that anything else references.
  std::vector<py::object> params_;
  std::vector<int64_t> numel_;  // each parameter's size when built
  // Each parameter's bucket in kept_; -1 for one that had no gradient when built.
  std::vector<int> bucket_of_;
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
