// SPDX-License-Identifier: BSD-3-Clause
// The extension module lucid_amp._C: lucid-amp's C++ core, bound for the Python package.

#include "bindings.h"

#include <lucid/amp/version.h>

#include <string>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lucid-amp's C++ core (GradScaler, fused optimizers) for lucid_amp";
  lucid::python::bind_grad_scaler(m);
  lucid::python::bind_optim(m);
#ifdef LUCID_AMP_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("version") = std::to_string(LUCID_AMP_VERSION_MAJOR) + "." +
                      std::to_string(LUCID_AMP_VERSION_MINOR) + "." +
                      std::to_string(LUCID_AMP_VERSION_PATCH);
}
