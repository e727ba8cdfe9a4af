// SPDX-License-Identifier: BSD-3-Clause
// Python bindings of lucid-amp's fused optimizer kernels (lucid_amp._C._FusedGroup), for
// lucid_amp.optim's torch.optim.Optimizer subclasses (python/lucid_amp/optim/fused.py),
// which keep the state in torch.optim's form. A _FusedGroup holds one param group's
// state lists, checked and bucketed by device and dtype once; each step reads the
// gradients, checks what the kernels will use, and launches through the same routing and
// the same checks as lucid::optim's C++ optimizers (optim/fused_launch.h).

#include "bindings.h"

#include "optim/fused_launch.h"
#include "optim/kept_lists.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

namespace lucid {
namespace python {
namespace {

using optim::detail::AdamHyper;
using optim::detail::Bucket;
using optim::detail::SgdHyper;
using TensorList = std::vector<at::Tensor>;

at::Tensor or_undefined(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? *t : at::Tensor();
}

// Whether any of a set of Python dicts was changed (an item added, replaced, deleted)
// since they were recorded: here the optimizer's state and each parameter's state dict,
// from which a group's state lists were taken, so that an entry replaced by assignment is
// seen. CPython's dict watchers tell it from 3.12 on, at no cost per step; before 3.12,
// each dict's version tag (PEP 509), one load per dict and step.
class DictWatch {
 public:
  explicit DictWatch(const py::list& dicts) {
    for (const py::handle d : dicts) {
      TORCH_CHECK(PyDict_Check(d.ptr()), "_FusedGroup: a watched object is not a dict.");
      dicts_.push_back(py::reinterpret_borrow<py::object>(d));
#if PY_VERSION_HEX >= 0x030C0000
      if (PyDict_Watch(watcher(), d.ptr()) != 0) {
        throw py::error_already_set();
      }
#else
      versions_.push_back(reinterpret_cast<PyDictObject*>(d.ptr())->ma_version_tag);
#endif
    }
#if PY_VERSION_HEX >= 0x030C0000
    recorded_ = changes();
#endif
  }

  bool changed() const {
#if PY_VERSION_HEX >= 0x030C0000
    return changes() != recorded_;
#else
    for (size_t i = 0; i < dicts_.size(); ++i) {
      if (reinterpret_cast<PyDictObject*>(dicts_[i].ptr())->ma_version_tag != versions_[i]) {
        return true;
      }
    }
    return false;
#endif
  }

 private:
#if PY_VERSION_HEX >= 0x030C0000
  // Every event of every watched dict counts: a change to another group's dicts only
  // makes this group gather its lists once more.
  static uint64_t& changes() {
    static uint64_t count = 0;
    return count;
  }
  static int watcher() {
    static const int id =
        PyDict_AddWatcher([](PyDict_WatchEvent, PyObject*, PyObject*, PyObject*) -> int {
          ++changes();
          return 0;
        });
    TORCH_CHECK(id >= 0, "lucid_amp: no dict watcher is left in this interpreter.");
    return id;
  }
  uint64_t recorded_ = 0;
#else
  std::vector<uint64_t> versions_;
#endif
  std::vector<py::object> dicts_;  // held, so that an address is not reused
};

// One param group of a lucid_amp.optim optimizer, its launch lists kept between steps
// (NOTE: [Kept launch lists] in src/optim/kept_lists.h). A step takes the parameters and
// gradients from the group's parameter list anew and launches with the kept lists when
// nothing a kernel uses changed; a tensor of another layout goes through a copy, and sizes,
// dtypes or devices that no longer match raise before anything is written. When the
// parameter list, the set of parameters with a gradient, a device or dtype, or a watched
// state dict changed, a step does nothing and returns false, and Python gathers the state
// anew (python/lucid_amp/optim/fused.py, _CachedListsMixin): as torch.optim would, it
// then finds replaced state entries, or makes fresh ones.
class FusedGroup {
 public:
  // `group`: the param group's index; `params_list`: its parameters; `states`: the state
  // lists aligned with the parameters that have a gradient now, named by `state_names`
  // (Adam: exp_avg, exp_avg_sq, [max_exp_avg_sq], step; SGD: [momentum_buffer], step),
  // step counters last; `watched`: the dicts they were taken from.
  FusedGroup(std::string name, size_t group, const py::list& params_list,
             std::vector<TensorList> states, std::vector<std::string> state_names,
             const py::list& watched)
      : name_(std::move(name)),
        group_(group),
        state_names_(std::move(state_names)),
        watch_(watched) {
    TORCH_CHECK(!states.empty() && states.size() == state_names_.size(), name_,
                ": one name per state list, step counters last.");
    TensorList with_grad;
    size_t i = 0;
    for (const py::handle item : params_list) {
      TORCH_CHECK(THPVariable_Check(item.ptr()), name_, ": parameter ", i, " of param group ",
                  group_, " is not a tensor.");
      const at::Tensor& p = THPVariable_Unpack(item.ptr());
      params_.push_back(py::reinterpret_borrow<py::object>(item));
      bucket_of_.push_back(-1);
      if (p.grad().defined()) {
        with_grad.push_back(p);
        with_grad_index_.push_back(i);
      }
      ++i;
    }
    for (const TensorList& s : states) {
      TORCH_CHECK(s.size() == with_grad.size(), name_, ": a state list of ", s.size(),
                  " tensors for ", with_grad.size(), " parameters with a gradient.");
    }
    for (const Bucket& b :
         optim::detail::bucket_params(with_grad, with_grad_index_, group_, name_.c_str())) {
      std::vector<TensorList> kept;
      for (size_t s = 0; s < states.size(); ++s) {
        TensorList picked;
        for (size_t k = 0; k < b.position.size(); ++k) {
          const at::Tensor& p = b.originals[k];
          const at::Tensor& t = states[s][b.position[k]];
          if (s + 1 == states.size()) {
            optim::detail::check_step_counter(p, t, name_.c_str(), group_, b.index[k]);
          } else {
            optim::detail::check_like_param(p, t, name_.c_str(), state_names_[s].c_str(), group_,
                                            b.index[k]);
          }
          picked.push_back(t);
        }
        kept.push_back(std::move(picked));
      }
      for (size_t k = 0; k < b.index.size(); ++k) {
        bucket_of_[b.index[k]] = static_cast<int>(kept_.buckets().size());
      }
      kept_.keep(b.device, b.dtype, b.index, std::move(kept));
    }
  }

  // Takes the parameters and gradients of `params_list` and checks every tensor a launch
  // will use, raising before anything is written; false (nothing prepared) when the group
  // changed and must be gathered anew. An optimizer prepares all its groups before it
  // launches any, so an error in one leaves every group as it was.
  bool prepare_(const py::list& params_list) {
    release_();
    if (watch_.changed()) {
      return false;
    }
    if (fill_unchanged(params_list)) {
      prepared_ = true;
      return true;
    }
    release_();  // what fill_unchanged filled before it stopped
    prepared_ = fill_checked(params_list);
    return prepared_;
  }

  void adam_(double lr, double beta1, double beta2, double eps, double weight_decay, bool amsgrad,
             bool decoupled_weight_decay, const c10::optional<at::Tensor>& grad_scale,
             const c10::optional<at::Tensor>& found_inf) {
    const AdamHyper hyper{lr, beta1, beta2, eps, weight_decay, amsgrad, decoupled_weight_decay};
    launch([&](const at::Device& device, const std::vector<TensorList>& lists) {
      optim::detail::launch_adam(device, lists, hyper, or_undefined(grad_scale),
                                 or_undefined(found_inf));
    });
  }

  void sgd_(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
            const c10::optional<at::Tensor>& grad_scale,
            const c10::optional<at::Tensor>& found_inf) {
    const SgdHyper hyper{lr, momentum, dampening, weight_decay, nesterov};
    launch([&](const at::Device& device, const std::vector<TensorList>& lists) {
      optim::detail::launch_sgd(device, lists, hyper, or_undefined(grad_scale),
                                or_undefined(found_inf));
    });
  }

  // Drops what prepare_ took, so that no tensor of a parameter is held between steps.
  void release_() {
    kept_.release();
    checked_buckets_.clear();
    checked_lists_.clear();
    prepared_ = false;
  }

 private:
  // The parameters of `params_list` that have a gradient, when they are the objects this
  // group was built from, with gradients exactly where they were; null otherwise.
  // Compared by Python object, as torch.optim keys its state: a module conversion may swap
  // the tensor under a Parameter (torch.utils.swap_tensors), which keeps its state.
  c10::optional<TensorList> same_parameters(const py::list& params_list) const {
    if (PyList_GET_SIZE(params_list.ptr()) != static_cast<Py_ssize_t>(params_.size())) {
      return c10::nullopt;
    }
    TensorList with_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      PyObject* item = PyList_GET_ITEM(params_list.ptr(), static_cast<Py_ssize_t>(i));
      // params_ holds the objects, so an address is not reused while they are compared.
      if (item != params_[i].ptr()) {
        return c10::nullopt;
      }
      const at::Tensor& p = THPVariable_Unpack(item);
      if (p.grad().defined() != (bucket_of_[i] >= 0)) {
        return c10::nullopt;
      }
      if (bucket_of_[i] >= 0) {
        with_grad.push_back(p);
      }
    }
    return with_grad;
  }

  // Calls release_() when it goes out of scope.
  struct Release {
    FusedGroup& group;
    ~Release() { group.release_(); }
  };

  // Fills the kept lists when the parameters are the objects this group was built from,
  // with gradients where they were, and every tensor passes KeptLists::take. This is every
  // step of a steady training loop, so it checks only that; false sends the step through
  // the checked way, which tells what changed or raises.
  bool fill_unchanged(const py::list& params_list) {
    if (PyList_GET_SIZE(params_list.ptr()) != static_cast<Py_ssize_t>(params_.size())) {
      return false;
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      PyObject* item = PyList_GET_ITEM(params_list.ptr(), static_cast<Py_ssize_t>(i));
      if (item != params_[i].ptr()) {
        return false;
      }
      // The parameter object is the one checked when the group was built, and its dispatch
      // keys cannot change since (.data = refuses other ones).
      const at::Tensor& p = THPVariable_Unpack(item);
      const int b = bucket_of_[i];
      if (b < 0) {
        if (p.grad().defined()) {
          return false;
        }
        continue;
      }
      if (kept_.take(static_cast<size_t>(b), p) < 0) {
        return false;
      }
    }
    return true;
  }

  // The checked way to the launch lists: the same checks as lucid::optim's C++
  // optimizers; tensors of another layout go through copies, written back after the
  // launch. False, with nothing filled, when the group changed (another parameter list,
  // set of gradients, device or dtype).
  bool fill_checked(const py::list& params_list) {
    const c10::optional<TensorList> with_grad = same_parameters(params_list);
    if (!with_grad) {
      return false;
    }
    std::vector<Bucket> buckets =
        optim::detail::bucket_params(*with_grad, with_grad_index_, group_, name_.c_str());
    const std::vector<optim::detail::KeptBucket>& kept = kept_.buckets();
    if (buckets.size() != kept.size()) {
      return false;  // a parameter moved to another device or dtype (model.to(...))
    }
    std::vector<std::vector<TensorList>> lists(kept.size());
    for (size_t b = 0; b < kept.size(); ++b) {
      Bucket& bucket = buckets[b];
      const optim::detail::KeptBucket& k = kept[b];
      if (bucket.device != k.device || bucket.dtype != k.dtype || bucket.index != k.index) {
        return false;
      }
      lists[b] = {bucket.params, bucket.grads};
      const size_t steps = k.lists.size() - 1;
      for (size_t s = 2; s < steps; ++s) {
        TensorList launch_states;
        for (size_t n = 0; n < k.index.size(); ++n) {
          launch_states.push_back(
              bucket.state(n, k.lists[s][n], name_.c_str(), state_names_[s - 2].c_str()));
        }
        lists[b].push_back(std::move(launch_states));
      }
      for (size_t n = 0; n < k.index.size(); ++n) {
        optim::detail::check_step_counter(bucket.originals[n], k.lists[steps][n], name_.c_str(),
                                          group_, k.index[n]);
      }
      lists[b].push_back(k.lists[steps]);
    }
    checked_buckets_ = std::move(buckets);
    checked_lists_ = std::move(lists);
    return true;
  }

  // launch(device, lists) once per bucket of what prepare_ took, then releases it.
  template <typename Launch>
  void launch(Launch launch_bucket) {
    Release release{*this};
    TORCH_CHECK(prepared_, name_, ": a launch without prepare_().");
    torch::NoGradGuard no_grad;
    if (checked_lists_.empty()) {
      kept_.launch(launch_bucket);
      return;
    }
    for (size_t b = 0; b < checked_lists_.size(); ++b) {
      launch_bucket(checked_buckets_[b].device, checked_lists_[b]);
      checked_buckets_[b].write_back();
    }
  }

  std::string name_;
  size_t group_;
  std::vector<std::string> state_names_;
  DictWatch watch_;
  // The group's parameters as Python objects. Not their tensors, not even weakly:
  // torch.utils.swap_tensors refuses a tensor that anything else references.
  std::vector<py::object> params_;
  // Each parameter's bucket in kept_; -1 for one that had no gradient when built.
  std::vector<int> bucket_of_;
  std::vector<size_t> with_grad_index_;  // the indices of those that had one
  optim::detail::KeptLists kept_;
  // What prepare_ took: kept_'s lists (filled with the parameters and gradients), or
  // through the checked way, the buckets and their launch lists.
  bool prepared_ = false;
  std::vector<Bucket> checked_buckets_;
  std::vector<std::vector<TensorList>> checked_lists_;
};

}  // namespace

void bind_optim(py::module& m) {
  py::class_<FusedGroup>(m, "_FusedGroup",
                         "One param group's kernel arguments, kept between steps "
                         "(lucid_amp.optim).")
      .def(py::init(torch::wrap_pybind_function(
               [](std::string name, size_t group, const py::list& params_list,
                  std::vector<TensorList> states, std::vector<std::string> state_names,
                  const py::list& watched) {
                 return std::make_unique<FusedGroup>(std::move(name), group, params_list,
                                                     std::move(states), std::move(state_names),
                                                     watched);
               })),
           py::arg("name"), py::arg("group"), py::arg("params"), py::arg("states"),
           py::arg("state_names"), py::arg("watched"))
      .def("prepare_", torch::wrap_pybind_function([](FusedGroup& self, const py::list& params) {
             return self.prepare_(params);
           }),
           py::arg("params"),
           "Takes the group's parameters and gradients for the next launch and checks every "
           "tensor it will use; false (nothing taken) if its parameters, the set of them "
           "with a gradient, or a watched state dict changed since it was built.")
      .def("adam_",
           torch::wrap_pybind_function([](FusedGroup& self, double lr, double beta1, double beta2,
                                          double eps, double weight_decay, bool amsgrad,
                                          bool decoupled_weight_decay,
                                          const c10::optional<at::Tensor>& grad_scale,
                                          const c10::optional<at::Tensor>& found_inf) {
             self.adam_(lr, beta1, beta2, eps, weight_decay, amsgrad, decoupled_weight_decay,
                        grad_scale, found_inf);
           }),
           "Steps what prepare_ took with Adam/AdamW, then releases it.")
      .def("sgd_",
           torch::wrap_pybind_function([](FusedGroup& self, double lr, double momentum,
                                          double dampening, double weight_decay, bool nesterov,
                                          const c10::optional<at::Tensor>& grad_scale,
                                          const c10::optional<at::Tensor>& found_inf) {
             self.sgd_(lr, momentum, dampening, weight_decay, nesterov, grad_scale, found_inf);
           }),
           "Steps what prepare_ took with SGD, then releases it.")
      .def("release_", torch::wrap_pybind_function([](FusedGroup& self) { self.release_(); }),
           "Drops what prepare_ took without launching.");
}

}  // namespace python
}  // namespace lucid
