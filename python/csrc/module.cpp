// The extension module lucid_amp._C: lucid-amp's C++ core, bound for the Python package.

#include "bindings.h"

#include <lucid/amp/version.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "lucid-amp's C++ core (GradScaler, fused optimizers) for lucid_amp";
  lucid::python::bind_grad_scaler(m);
#ifdef LUCID_AMP_WITH_CUDA
  m.attr("with_cuda") = true;
#else
  m.attr("with_cuda") = false;
#endif
}
