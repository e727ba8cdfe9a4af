// SPDX-License-Identifier: BSD-3-Clause
// lucid::amp::autocast on CPU (bfloat16 and float16).

#include <gtest/gtest.h>

#include <lucid/amp.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace {

using lucid::amp::autocast;
using lucid::amp::autocast_dtype;
using lucid::amp::is_autocast_enabled;

TEST(Autocast, GuardEnablesCpuAutocastAndRestoresOnExit) {
  ASSERT_FALSE(is_autocast_enabled(torch::kCPU));
  {
    autocast guard(torch::kCPU);
    EXPECT_TRUE(is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(guard.device_type(), torch::kCPU);
  }
  EXPECT_FALSE(is_autocast_enabled(torch::kCPU));
}

TEST(Autocast, ForwardRunsInBFloat16WhileParametersStayFloat32) {
  torch::nn::Linear model(4, 3);
  auto x = torch::randn({2, 4});
  torch::Tensor out;
  {
    autocast guard(torch::kCPU, torch::kBFloat16);
    out = model->forward(x);
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->weight.scalar_type(), torch::kFloat);
  out.to(torch::kFloat).sum().backward();
  EXPECT_EQ(model->weight.grad().scalar_type(), torch::kFloat);
  // Outside the guard the same forward is float32 again.
  EXPECT_EQ(model->forward(x).scalar_type(), torch::kFloat);
}

// CPU autocast takes float16 as well as bfloat16, which lets the inner level change the
// dtype.
constexpr auto kInnerCpuDtype = torch::kHalf;

TEST(Autocast, NestedLevelsRestoreEnabledFlagAndDtype) {
  const auto dtype_before = autocast_dtype(torch::kCPU);
  {
    autocast outer(torch::kCPU, torch::kBFloat16, true);
    {
      autocast inner(torch::kCPU, kInnerCpuDtype, /*enabled=*/false);
      EXPECT_FALSE(is_autocast_enabled(torch::kCPU));
      EXPECT_EQ(autocast_dtype(torch::kCPU), kInnerCpuDtype);
    }
    EXPECT_TRUE(is_autocast_enabled(torch::kCPU));
    EXPECT_EQ(autocast_dtype(torch::kCPU), torch::kBFloat16);
  }
  EXPECT_FALSE(is_autocast_enabled(torch::kCPU));
  EXPECT_EQ(autocast_dtype(torch::kCPU), dtype_before);
}

TEST(Autocast, DefaultDtypeIsTheDevicesAutocastDefault) {
  const auto dtype_before = autocast_dtype(torch::kCPU);
  autocast guard(torch::kCPU);
  EXPECT_EQ(autocast_dtype(torch::kCPU), dtype_before);
}

// The weight cache holds one low-precision copy of each float32 leaf per autocast
// region: the same copy inside nested levels, a new one after the outermost exit.
TEST(Autocast, OutermostExitClearsTheWeightCacheInnerExitDoesNot) {
  auto weight = torch::randn({4, 4}, torch::requires_grad());
  torch::Tensor first, after_inner;
  {
    autocast outer(torch::kCPU, torch::kBFloat16);
    first = at::autocast::cached_cast(torch::kBFloat16, weight, torch::kCPU);
    EXPECT_TRUE(first.is_same(at::autocast::cached_cast(torch::kBFloat16, weight, torch::kCPU)));
    { autocast inner(torch::kCPU, torch::kBFloat16); }
    after_inner = at::autocast::cached_cast(torch::kBFloat16, weight, torch::kCPU);
    EXPECT_TRUE(first.is_same(after_inner));
  }
  autocast again(torch::kCPU, torch::kBFloat16);
  EXPECT_FALSE(first.is_same(at::autocast::cached_cast(torch::kBFloat16, weight, torch::kCPU)));
}

TEST(Autocast, NonFloatingDtypeIsAValueError) {
  EXPECT_THROW(autocast(torch::kCPU, torch::kInt), c10::ValueError);
  EXPECT_FALSE(is_autocast_enabled(torch::kCPU));
}

TEST(Autocast, DeviceWithoutAutocastIsNotImplemented) {
  try {
    autocast guard(c10::DeviceType::FPGA);
    FAIL() << "expected c10::NotImplementedError";
  } catch (const c10::NotImplementedError& e) {
    EXPECT_NE(std::string(e.what()).find("autocast"), std::string::npos);
  }
}

}  // namespace
