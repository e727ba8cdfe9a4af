// SPDX-License-Identifier: BSD-3-Clause
// Python bindings of lucid::amp::GradScaler (lucid_amp._C._GradScaler).
//
// The Python class lucid_amp.GradScaler (python/lucid_amp/grad_scaler.py) handles the
// arguments and PyTorch's optimizer protocol; everything the scaler decides happens here,
// in the C++ core, on OptimizerViews (include/lucid/amp/optimizer_view.h) built per call
// from a Python optimizer: its id() as the key, its param_groups' parameters, and Python
// callables for the step and, for scaler-aware optimizers, the scale/flag hand-off.
//
// Every binding goes through torch::wrap_pybind_function (HANDLE_TH_ERRORS), so that
// c10::Error, c10::ValueError and c10::NotImplementedError reach Python as RuntimeError,
// ValueError and NotImplementedError, and TORCH_WARN as Python warnings, as in PyTorch's
// own bindings.

#include "bindings.h"

#include <lucid/amp/clip_grad.h>
#include <lucid/amp/grad_scaler.h>
#include <lucid/amp/serialize.h>

#include <torch/csrc/DynamicTypes.h>

#include "amp/norm_agreement.h"
#include "amp/scaler_state.h"

#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace lucid {
namespace python {
namespace {

using amp::GradScaler;
using amp::GradScalerOptions;
using amp::OptimizerView;

// Parameters of one optimizer, one list per param group, as Python hands them over (a
// sequence of sequences of tensors), for one call. The tensors are borrowed, not copied: a
// copy of a tensor that Python owns costs about 40 ns (its reference count, and through
// it the Python object's), a large part of a step's host time at hundreds of parameters.
// Each group is held as a tuple, which nobody can change, so every borrowed tensor lives
// as long as this object; whoever keeps one beyond the call copies it.
class ParamGroups {
 public:
  explicit ParamGroups(py::handle groups) {
    const py::object outer = as_tuple(groups, "param groups must be a sequence of lists of tensors");
    const Py_ssize_t n = PyTuple_GET_SIZE(outer.ptr());
    held_.reserve(static_cast<size_t>(n));
    lists_.resize(static_cast<size_t>(n));
    for (Py_ssize_t g = 0; g < n; ++g) {
      held_.push_back(as_tuple(PyTuple_GET_ITEM(outer.ptr(), g), "a param group must be a list of tensors"));
      PyObject* params = held_.back().ptr();
      std::vector<at::Tensor>& list = lists_[static_cast<size_t>(g)].tensors;
      list.reserve(static_cast<size_t>(PyTuple_GET_SIZE(params)));
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(params); ++i) {
        PyObject* item = PyTuple_GET_ITEM(params, i);
        TORCH_CHECK_TYPE(THPVariable_Check(item), "lucid_amp: parameter ", i, " of param group ",
                         g, " is a ", Py_TYPE(item)->tp_name, ", not a tensor.");
        list.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(THPVariable_Unpack(item)));
      }
    }
  }

  // One group's tensors, as an OptimizerView takes them.
  c10::ArrayRef<at::Tensor> group(size_t g) const { return lists_[g].tensors; }
  size_t size() const { return lists_.size(); }

 private:
  // Borrowed tensors, given back without a decrement of what was never incremented; a
  // member, so that this runs when the constructor throws half way too.
  struct Borrowed {
    Borrowed() = default;
    Borrowed(const Borrowed&) = delete;
    Borrowed& operator=(const Borrowed&) = delete;
    Borrowed(Borrowed&&) = default;
    ~Borrowed() {
      for (at::Tensor& t : tensors) {
        c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
      }
    }
    std::vector<at::Tensor> tensors;
  };

  // `obj` as a tuple (itself when it is one), TypeError `message` otherwise.
  static py::object as_tuple(py::handle obj, const char* message) {
    PyObject* tuple = PySequence_Tuple(obj.ptr());
    if (tuple == nullptr) {
      PyErr_Clear();
      TORCH_CHECK_TYPE(false, "lucid_amp: ", message, ", not a ", Py_TYPE(obj.ptr())->tp_name, ".");
    }
    return py::reinterpret_steal<py::object>(tuple);
  }

  // Declared first, destroyed last: the tuples keep the tensors alive while lists_ goes.
  std::vector<py::object> held_;
  std::vector<Borrowed> lists_;
};

OptimizerView make_view(uintptr_t key, const ParamGroups& groups) {
  TORCH_CHECK(key != 0, "lucid_amp: an optimizer key must not be 0.");
  OptimizerView view;
  view.key = amp::OptimizerKey::from_id(key);
  view.param_groups.reserve(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    view.param_groups.push_back(groups.group(g));
  }
  return view;
}

// Python's set_found_inf_hook(fn, norm_fn=None) as the core's one hook: fn(found_inf)
// agrees a flag, norm_fn(found_inf, norm_partial, norm_type) a clip's flag and norm, each
// in place. Called with the GIL held: the scaler is only called from Python.
class PythonFoundInfHook final : public amp::FoundInfHook {
 public:
  PythonFoundInfHook(py::object fn, py::object norm_fn)
      : fn_(std::move(fn)), norm_fn_(std::move(norm_fn)) {}
  void agree_(at::Tensor& found_inf) override { fn_(found_inf); }
  bool combines_norm() const override { return !norm_fn_.is_none(); }
  void agree_with_norm_(at::Tensor& found_inf, at::Tensor& norm_partial, double norm_type) override {
    norm_fn_(found_inf, norm_partial, norm_type);
  }

 private:
  py::object fn_;
  py::object norm_fn_;
};

py::object tensor_or_none(const at::Tensor& t) {
  return t.defined() ? py::cast(t) : py::none();
}

py::object dtype_object(c10::ScalarType dtype) {
  return py::reinterpret_borrow<py::object>(
      reinterpret_cast<PyObject*>(torch::getTHPDtype(dtype)));
}

py::dict report_dict(const amp::OverflowReport& report) {
  py::list gradients;
  for (const auto& g : report.gradients) {
    py::dict d;
    d["optimizer_key"] = g.optimizer.id();
    d["param_group"] = g.param_group;
    d["index"] = g.index;
    d["name"] = g.name;
    d["nan_count"] = g.nan_count;
    d["inf_count"] = g.inf_count;
    d["numel"] = g.numel;
    d["sizes"] = py::tuple(py::cast(g.sizes));
    d["dtype"] = dtype_object(g.dtype);
    d["device"] = py::cast(g.device);
    gradients.append(d);
  }
  py::dict d;
  d["iteration"] = report.iteration;
  d["scale"] = report.scale;
  d["optimizers"] = report.optimizers;
  d["uninspected_optimizers"] = report.uninspected_optimizers;
  d["gradients"] = gradients;
  d["text"] = report.to_string();
  return d;
}

// ScaleChange as the Python records spell it.
const char* scale_change_name(amp::ScaleChange change) {
  switch (change) {
    case amp::ScaleChange::kGrowth:
      return "growth";
    case amp::ScaleChange::kAbsorbed:
      return "absorbed";
    case amp::ScaleChange::kBackoff:
      return "backoff";
    case amp::ScaleChange::kNone:
      break;
  }
  return "none";
}

py::dict counters_dict(const amp::ScalerCounters& c) {
  py::dict d;
  d["steps_taken"] = c.steps_taken;
  d["steps_skipped"] = c.steps_skipped;
  d["updates"] = c.updates;
  d["overflow_updates"] = c.overflow_updates;
  d["backoffs"] = c.backoffs;
  d["growths"] = c.growths;
  d["overflow_streak"] = c.overflow_streak;
  d["updates_without_checks"] = c.updates_without_checks;
  d["steps_without_gradients"] = c.steps_without_gradients;
  d["min_scale_holds"] = c.min_scale_holds;
  return d;
}

// The options as Python values, by the option table (NOTE: [One declaration per option]
// in src/amp/scaler_state.h): an enum by its name.
py::dict options_dict(const GradScalerOptions& o) {
  py::dict d;
  for (const amp::detail::OptionEntry& entry : amp::detail::option_table()) {
    switch (entry.kind) {
      case amp::detail::OptionKind::kDouble:
        d[entry.key] = entry.get(o).toDouble();
        break;
      case amp::detail::OptionKind::kInt:
        d[entry.key] = entry.get(o).toInt();
        break;
      case amp::detail::OptionKind::kBool:
        d[entry.key] = entry.get(o).toBool();
        break;
      case amp::detail::OptionKind::kEnum:
        d[entry.key] = amp::detail::enum_name(entry, o);
        break;
    }
  }
  return d;
}

// A scaler from keyword arguments named as the option table's keys (each optional, the
// C++ default otherwise): a float or an int for a float option, an int for an integer, a
// bool, an enum by its name. TypeError for an unknown keyword or a value of another
// type, ValueError (the core's checks) for one out of range.
std::unique_ptr<GradScaler> make_scaler(const py::kwargs& kwargs) {
  GradScalerOptions options;
  for (const auto& item : kwargs) {
    const std::string key = py::str(item.first);
    const amp::detail::OptionEntry* entry = amp::detail::find_option(key);
    if (entry == nullptr) {
      throw py::type_error("GradScaler: unexpected keyword argument '" + key + "'.");
    }
    const py::handle value = item.second;
    const bool is_bool = py::isinstance<py::bool_>(value);
    const bool is_int = py::isinstance<py::int_>(value) && !is_bool;
    auto refuse = [&](const char* expected) {
      throw py::type_error("GradScaler: " + key + " must be " + expected + ", got " +
                           std::string(Py_TYPE(value.ptr())->tp_name) + ".");
    };
    switch (entry->kind) {
      case amp::detail::OptionKind::kDouble:
        if (!is_int && !py::isinstance<py::float_>(value)) {
          refuse("a float");
        }
        entry->set(options, c10::IValue(value.cast<double>()));
        break;
      case amp::detail::OptionKind::kInt:
        if (!is_int) {
          refuse("an int");
        }
        entry->set(options, c10::IValue(value.cast<int64_t>()));
        break;
      case amp::detail::OptionKind::kBool:
        if (!is_bool) {
          refuse("a bool");
        }
        entry->set(options, c10::IValue(value.cast<bool>()));
        break;
      case amp::detail::OptionKind::kEnum:
        if (!py::isinstance<py::str>(value)) {
          refuse("a str");
        }
        entry->set(options, c10::IValue(amp::detail::enum_value(*entry, value.cast<std::string>())));
        break;
    }
  }
  return std::make_unique<GradScaler>(options);
}

}  // namespace

void bind_grad_scaler(py::module& m) {
  m.attr("step_log_capacity") = amp::kStepLogCapacity;
  m.attr("step_log_optimizers") = amp::kStepLogOptimizers;
  m.def("clip_grad_norm_",
        torch::wrap_pybind_function([](const std::vector<at::Tensor>& parameters, double max_norm,
                                       double norm_type, bool error_if_nonfinite) {
          return amp::clip_grad_norm_(parameters, max_norm, norm_type, error_if_nonfinite);
        }),
        py::arg("parameters"), py::arg("max_norm"), py::arg("norm_type") = 2.0,
        py::arg("error_if_nonfinite") = false);
  // A sharded clip's agreement (NOTE: [Sharded norm agreement] in src/amp/norm_agreement.h)
  // for lucid_amp.distributed, whose process group does the all-reduce: the payload and
  // whether it reduces with MAX (else SUM), then the reduced payload written back.
  m.def("_norm_agreement_payload",
        torch::wrap_pybind_function([](const at::Tensor& found_inf, const at::Tensor& norm_partial,
                                       double norm_type) {
          amp::detail::NormAgreementPayload payload = amp::detail::norm_agreement_payload(
              found_inf, norm_partial, norm_type, "lucid_amp.distributed");
          return std::make_tuple(payload.values, payload.reduce_max);
        }),
        py::arg("found_inf"), py::arg("norm_partial"), py::arg("norm_type"));
  m.def("_apply_norm_agreement",
        torch::wrap_pybind_function([](const at::Tensor& reduced, at::Tensor found_inf,
                                       at::Tensor norm_partial, double norm_type) {
          amp::detail::apply_norm_agreement(reduced, found_inf, norm_partial, norm_type);
        }),
        py::arg("reduced"), py::arg("found_inf"), py::arg("norm_partial"), py::arg("norm_type"));
  py::class_<GradScaler>(m, "_GradScaler",
                         "lucid::amp::GradScaler; use lucid_amp.GradScaler, which wraps it.")
      .def(py::init(torch::wrap_pybind_function(make_scaler)))
      .def("scale", torch::wrap_pybind_function([](GradScaler& self, const at::Tensor& outputs) {
             return self.scale(outputs);
           }))
      .def("unscale_",
           torch::wrap_pybind_function([](GradScaler& self, uintptr_t key, py::handle param_lists) {
             if (!self.is_enabled()) {
               return;
             }
             const ParamGroups groups(param_lists);
             self.unscale_(make_view(key, groups));
           }))
      // The norm of the unscaled gradients; `scaler_aware`: the optimizer takes the scale
      // in its step (PyTorch's fused protocol), so the clip is folded into it there.
      .def("clip_grad_norm_",
           torch::wrap_pybind_function([](GradScaler& self, uintptr_t key, py::handle param_lists,
                                          double max_norm, double norm_type, bool scaler_aware) {
             const ParamGroups groups(param_lists);
             OptimizerView view = make_view(key, groups);
             if (scaler_aware) {
               view.set_grad_scaling = [](at::Tensor, at::Tensor) {};
             }
             return self.clip_grad_norm_(view, max_norm, norm_type);
           }))
      // Returns whether the optimizer's step ran. `step_fn` runs it; `set_grad_scaling`
      // is None, or for a scaler-aware optimizer a callable(scale or None, found_inf).
      // A scaler-aware step returns at once, as PyTorch's: its outcome reaches the host
      // when its flag's copy has landed or when asked for (OptimizerView::
      // set_grad_scaling), and the Python front returns the optimizer's own result.
      .def("step",
           torch::wrap_pybind_function([](GradScaler& self, uintptr_t key, py::handle param_lists,
                                          py::function step_fn, py::object set_grad_scaling) {
             const ParamGroups groups(param_lists);
             OptimizerView view = make_view(key, groups);
             view.step = [&step_fn] { step_fn(); };
             if (!set_grad_scaling.is_none()) {
               view.set_grad_scaling = [&set_grad_scaling](at::Tensor scale, at::Tensor found_inf) {
                 set_grad_scaling(tensor_or_none(scale), tensor_or_none(found_inf));
               };
             }
             return self.step(view);
           }))
      .def("update", torch::wrap_pybind_function([](GradScaler& self, c10::optional<double> new_scale) {
             self.update(new_scale.has_value() ? std::optional<double>(*new_scale)
                                               : std::nullopt);
           }),
           py::arg("new_scale") = py::none())
      .def("get_scale", torch::wrap_pybind_function([](GradScaler& self) { return self.get_scale(); }))
      .def("scale_tensor", torch::wrap_pybind_function([](GradScaler& self) {
             return tensor_or_none(self.scale_tensor());
           }))
      .def("is_enabled", torch::wrap_pybind_function([](GradScaler& self) { return self.is_enabled(); }))
      .def("options", torch::wrap_pybind_function([](GradScaler& self) {
             return options_dict(self.options());
           }))
      // 0 ready, 1 unscaled, 2 stepped.
      .def("stage", torch::wrap_pybind_function([](GradScaler& self, uintptr_t key) {
             return static_cast<int>(self.stage(amp::OptimizerKey::from_id(key)));
           }))
      .def("step_skipped", torch::wrap_pybind_function([](GradScaler& self, uintptr_t key) {
             return self.step_skipped(amp::OptimizerKey::from_id(key));
           }))
      .def("overflowed",
           torch::wrap_pybind_function([](GradScaler& self, uintptr_t key, py::handle param_lists) {
             const ParamGroups groups(param_lists);
             return self.overflowed(make_view(key, groups));
           }))
      .def("state_dict", torch::wrap_pybind_function([](GradScaler& self) {
             return self.state_dict();
           }))
      .def("load_state_dict",
           torch::wrap_pybind_function([](GradScaler& self, const std::map<std::string, double>& state) {
             self.load_state_dict(state);
           }))
      // The whole scaler (state, options but `enabled`, counters) as bytes: lucid-amp's
      // checkpoint format (include/lucid/amp/serialize.h), used for pickling.
      .def("save_bytes", torch::wrap_pybind_function([](GradScaler& self) {
             std::ostringstream out;
             amp::save_scaler(self, out);
             return py::bytes(out.str());
           }))
      .def("load_bytes", torch::wrap_pybind_function([](GradScaler& self, const std::string& data) {
             std::istringstream in(data);
             amp::load_scaler(self, in);
           }))
      .def("counters", torch::wrap_pybind_function([](GradScaler& self) {
             return counters_dict(self.counters());
           }))
      .def("last_overflow", torch::wrap_pybind_function([](GradScaler& self) -> py::object {
             const auto& report = self.last_overflow();
             if (!report.has_value()) {
               return py::none();
             }
             return report_dict(*report);
           }))
      .def(
          "history",
          torch::wrap_pybind_function([](GradScaler& self, bool wait) {
            py::list records;
            for (const amp::StepRecord& r : self.history(wait)) {
              py::dict d;
              d["update"] = r.update;
              d["scale"] = r.scale;
              d["new_scale"] = r.new_scale;
              d["found_inf"] = r.found_inf;
              d["overflowed_optimizers"] = py::tuple(py::cast(r.overflowed_optimizers));
              d["first_overflow"] = r.first_overflow.has_value()
                                        ? py::object(py::make_tuple(r.first_overflow->optimizer,
                                                                    r.first_overflow->parameter))
                                        : py::object(py::none());
              d["nan_count"] = r.nan_count;
              d["inf_count"] = r.inf_count;
              d["change"] = scale_change_name(r.change);
              d["grad_norm"] = r.grad_norm.has_value() ? py::object(py::float_(*r.grad_norm))
                                                       : py::object(py::none());
              records.append(std::move(d));
            }
            return records;
          }),
          py::arg("wait") = false)
      // fn(event: dict) on every backoff; None removes it.
      .def("set_backoff_callback", torch::wrap_pybind_function([](GradScaler& self, py::object fn) {
             if (fn.is_none()) {
               self.set_backoff_callback(nullptr);
               return;
             }
             self.set_backoff_callback([fn](const amp::BackoffEvent& event) {
               py::dict d;
               d["iteration"] = event.iteration;
               d["old_scale"] = event.old_scale;
               d["new_scale"] = event.new_scale;
               d["overflow_streak"] = event.overflow_streak;
               d["report"] = event.report != nullptr ? py::object(report_dict(*event.report))
                                                     : py::object(py::none());
               fn(d);
             });
           }))
      // fn(found_inf), norm_fn(found_inf, norm_partial, norm_type) or None (amp::FoundInfHook);
      // fn None removes the hook.
      .def("set_found_inf_hook",
           torch::wrap_pybind_function([](GradScaler& self, py::object fn, py::object norm_fn) {
             if (fn.is_none()) {
               TORCH_CHECK_VALUE(norm_fn.is_none(),
                                 "set_found_inf_hook: a norm hook needs a found-inf hook too.");
               self.set_found_inf_hook(nullptr);
               return;
             }
             self.set_found_inf_hook(
                 std::make_shared<PythonFoundInfHook>(std::move(fn), std::move(norm_fn)));
           }),
           py::arg("fn"), py::arg("norm_fn") = py::none())
      .def("set_parameter_name",
           torch::wrap_pybind_function([](GradScaler& self, const at::Tensor& parameter, const std::string& name) {
             self.set_parameter_name(parameter, name);
           }));
}

}  // namespace python
}  // namespace lucid
