// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// A test suite run once per backend: the CPU kernels, the generic ATen-ops path forced on
// the CPU, and CUDA (skipped without a GPU). Derive the suite from BackendTest and
// instantiate it with LUCID_TEST_INSTANTIATE_BACKENDS(Suite).

#include "amp/kernel_routing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

namespace lucid_test {

enum class Backend { kCpu, kGeneric, kCuda };

class BackendTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kCuda && !torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device";
    }
    if (GetParam() == Backend::kGeneric) {
      force_ = std::make_unique<lucid::amp::detail::ForceGenericBackendGuard>();
    }
  }
  torch::Device device() const {
    return GetParam() == Backend::kCuda ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
  }
  torch::TensorOptions on(torch::Dtype dtype = torch::kFloat) const {
    return torch::TensorOptions().dtype(dtype).device(device());
  }

 private:
  std::unique_ptr<lucid::amp::detail::ForceGenericBackendGuard> force_;
};

inline const char* backend_name(const ::testing::TestParamInfo<Backend>& info) {
  switch (info.param) {
    case Backend::kCpu:
      return "Cpu";
    case Backend::kGeneric:
      return "Generic";
    case Backend::kCuda:
      return "Cuda";
  }
  return "?";
}

}  // namespace lucid_test

#define LUCID_TEST_INSTANTIATE_BACKENDS(Suite)                                              \
  INSTANTIATE_TEST_SUITE_P(, Suite,                                                          \
                           ::testing::Values(::lucid_test::Backend::kCpu,                    \
                                             ::lucid_test::Backend::kGeneric,                \
                                             ::lucid_test::Backend::kCuda),                  \
                           ::lucid_test::backend_name)
