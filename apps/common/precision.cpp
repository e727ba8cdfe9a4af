// SPDX-License-Identifier: BSD-3-Clause
#include "precision.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

namespace lucid {
namespace apps {

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kFp16: return "fp16";
    case Precision::kFp16Scaled: return "fp16-scaled";
    case Precision::kBf16: return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  for (Precision p : all_precisions()) {
    if (to_string(p) == name) return p;
  }
  TORCH_CHECK_VALUE(false, "unknown precision '", name,
                    "': choose one of fp32, fp16, fp16-scaled, bf16.");
}

const std::vector<Precision>& all_precisions() {
  static const std::vector<Precision> all = {Precision::kFp32, Precision::kFp16,
                                             Precision::kFp16Scaled, Precision::kBf16};
  return all;
}

c10::Device parse_training_device(const std::string& name) {
  TORCH_CHECK_VALUE(name == "cpu" || name == "cuda", "unknown device '", name,
                    "': choose cpu or cuda.");
  if (name == "cuda") {
    TORCH_CHECK(torch::cuda::is_available(),
                "--device cuda: no CUDA device is visible to this LibTorch (Debian's "
                "libtorch-dev is CPU-only); run on the CPU, the default.");
  }
  return c10::Device(name);
}

void use_exact_cuda_float32() {
  auto& context = at::globalContext();
  context.setAllowTF32CuDNN(false);
  context.setAllowTF32CuBLAS(false);
  context.setBenchmarkCuDNN(false);
  context.setDeterministicCuDNN(true);
}

}  // namespace apps
}  // namespace lucid
