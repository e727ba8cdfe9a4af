// SPDX-License-Identifier: BSD-3-Clause
// lucid::distributed on CUDA with NCCL, one process (NCCL allows one rank per GPU, and the
// GPU machine has one): the agreement on a CUDA flag, its graph-safe mode without host
// synchronisation, and inside a captured CUDA graph. Built only with the NCCL path.

#include <gtest/gtest.h>

#include <lucid/distributed.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <limits>
#include <string>

#include "../support/scratch_dir.h"

namespace {

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no GPU";
    }
    store_ = lucid::distributed::make_file_store(dir_.file("store"), 1, std::chrono::seconds(30));
    group_ = lucid::distributed::make_nccl_group(store_, 0, 1);
  }
  torch::Device gpu{torch::kCUDA, 0};
  lucid_test::ScratchDir dir_{"lucid_nccl"};  // before the store and group: they go first
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

TEST_F(Nccl, BoundScalerSkipsAndBacksOffOnACudaFlag) {
  torch::Tensor param = torch::ones({64}, torch::TensorOptions().device(gpu).requires_grad(true));
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(0.1));
  lucid::amp::GradScaler scaler(lucid::amp::GradScalerOptions().init_scale(8.0));
  auto agreement = lucid::distributed::bind_to_group(scaler, group_);
  scaler.scale(torch::ones({}, gpu));
  param.mutable_grad() = torch::full({64}, 8.0, gpu);
  EXPECT_TRUE(scaler.step(optimizer).has_value());
  scaler.update();
  param.mutable_grad() = torch::full({64}, std::numeric_limits<float>::infinity(), gpu);
  EXPECT_FALSE(scaler.step(optimizer).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(agreement->all_reduces(), 2);
  EXPECT_TRUE(scaler.scale_tensor().is_cuda());
}

TEST_F(Nccl, GraphSafeAgreementDoesNotSynchroniseWithTheHost) {
  lucid::distributed::OverflowAgreement agreement(
      group_, lucid::distributed::OverflowAgreementOptions().graph_safe(true));
  torch::Tensor flag = torch::zeros({}, gpu);
  agreement.agree_(flag);  // the first collective creates the communicator
  torch::cuda::synchronize();
  flag.fill_(1.0f);
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  EXPECT_NO_THROW(agreement.agree_(flag));
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  EXPECT_EQ(flag.item<float>(), 1.0f);
}

TEST_F(Nccl, GraphSafeAgreementReplaysInACapturedCudaGraph) {
  lucid::distributed::OverflowAgreement agreement(
      group_, lucid::distributed::OverflowAgreementOptions().graph_safe(true));
  torch::Tensor flag = torch::zeros({}, gpu);
  agreement.agree_(flag);  // communicator first, outside the capture
  torch::cuda::synchronize();
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard side(c10::cuda::getStreamFromPool());
    graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    agreement.agree_(flag);
    graph.capture_end();
  }
  flag.fill_(1.0f);
  graph.replay();
  EXPECT_EQ(flag.item<float>(), 1.0f);
  flag.fill_(0.0f);
  graph.replay();
  EXPECT_EQ(flag.item<float>(), 0.0f);
}

TEST_F(Nccl, AFlagOnTheWrongDeviceFailsWithTheRankInTheMessage) {
  lucid::distributed::OverflowAgreement agreement(group_);
  torch::Tensor cpu_flag = torch::zeros({});
  try {
    agreement.agree_(cpu_flag);
    FAIL() << "an NCCL group cannot reduce a CPU tensor";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("rank 0 of 1: overflow agreement all-reduce #1 failed"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
