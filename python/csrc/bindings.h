// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The pieces of the extension module lucid_amp._C (python/csrc/module.cpp).

#include <torch/extension.h>

#include <torch/csrc/Exceptions.h>

namespace lucid {
namespace python {

namespace py = pybind11;

/// lucid_amp._C._GradScaler (python/csrc/grad_scaler.cpp).
void bind_grad_scaler(py::module& m);
/// lucid_amp._C._fused_adam_ and _fused_sgd_ (python/csrc/optim.cpp).
void bind_optim(py::module& m);

}  // namespace python
}  // namespace lucid
