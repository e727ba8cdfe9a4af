// SPDX-License-Identifier: BSD-3-Clause
// GradScaler on CUDA: run on the GPU machine (LibTorch 2.11 + CUDA); every test skips
// where no GPU is visible.

#include "support/scaler_fixtures.h"

#include "amp/kernel_routing.h"
#include "support/first_overflow_check.h"

#ifdef LUCID_AMP_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "support/syncs_are_errors.h"
#endif

#include <cmath>
#include <functional>
#include <limits>
#include <memory>

namespace {

using namespace lucid_test;

class Cuda : public testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) {
      GTEST_SKIP() << "no CUDA device visible";
    }
  }
  const torch::Device gpu{torch::kCUDA, 0};
};

TEST_F(Cuda, Float32GradientsAreUnscaledOnTheGpuAndTheScaleStaysThere) {
  torch::manual_seed(1);
  torch::nn::Linear model(16, 4);
  model->to(gpu);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  auto x = torch::randn({8, 16}, gpu);
  auto loss = model->forward(x).pow(2).mean();
  auto reference = torch::autograd::grad({loss}, {model->weight}, {}, /*retain_graph=*/true)[0];
  GradScaler scaler;
  scaler.scale(loss).backward();
  ASSERT_TRUE(scaler.scale_tensor().is_cuda());
  scaler.unscale_(optimizer);
  EXPECT_TRUE(torch::allclose(model->weight.grad(), reference, 1e-5, 1e-6));
  EXPECT_TRUE(scaler.step(optimizer).has_value());
  scaler.update();
  EXPECT_TRUE(scaler.scale_tensor().is_cuda());
  EXPECT_EQ(scaler.get_scale(), 65536.0);
}

TEST_F(Cuda, OverflowOnTheGpuSkipsTheStepAndBacksOff) {
  OneParam p(torch::ones({1000}, gpu));
  GradScaler scaler;
  scaler.scale(torch::ones({}, gpu));
  auto g = torch::ones({1000}, gpu);
  g[999] = std::numeric_limits<float>::infinity();
  p.set_grad(g);
  const auto before = p.param.detach().clone();
  EXPECT_FALSE(scaler.step(p.optimizer).has_value());
  EXPECT_TRUE(torch::equal(p.param.detach(), before));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST_F(Cuda, BFloat16GradientsAreUnscaledInFloat32AndRoundedOnce) {
  OneParam p(torch::ones({4097}, torch::TensorOptions().dtype(torch::kBFloat16).device(gpu)));
  GradScaler scaler(GradScalerOptions().init_scale(3.0));
  scale_loss(scaler, gpu);
  const auto g = (torch::randn({4097}, gpu) * 100).to(torch::kBFloat16);
  p.set_grad(g);
  scaler.unscale_(p.optimizer);
  const auto expected = (g.to(torch::kFloat) * static_cast<float>(1.0 / 3.0)).to(torch::kBFloat16);
  EXPECT_EQ(p.param.grad().scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(p.param.grad(), expected));
}

TEST_F(Cuda, BFloat16OverflowIsDetectedOnTheGpu) {
  OneParam p(torch::ones({10}, torch::TensorOptions().dtype(torch::kBFloat16).device(gpu)));
  GradScaler scaler;
  scale_loss(scaler, gpu);
  auto g = torch::ones({10}, torch::TensorOptions().dtype(torch::kBFloat16).device(gpu));
  g[3] = std::numeric_limits<float>::quiet_NaN();
  p.set_grad(g);
  EXPECT_FALSE(scaler.step(p.optimizer).has_value());
}

TEST_F(Cuda, Float64GradientsAreUnscaledInFloat64) {
  OneParam p(torch::ones({100}, torch::TensorOptions().dtype(torch::kDouble).device(gpu)));
  GradScaler scaler(GradScalerOptions().init_scale(3.0));
  scale_loss(scaler, gpu);
  const auto g = torch::randn({100}, torch::TensorOptions().dtype(torch::kDouble).device(gpu));
  p.set_grad(g);
  scaler.unscale_(p.optimizer);
  EXPECT_EQ(p.param.grad().scalar_type(), torch::kDouble);
  EXPECT_TRUE(torch::allclose(p.param.grad(), g / 3.0, 1e-15, 0.0));
}

TEST_F(Cuda, ModelSplitOverCpuAndGpuIsUnscaledAndCheckedOnBothDevices) {
  torch::manual_seed(2);
  torch::nn::Linear first(8, 8);  // stays on the CPU
  torch::nn::Linear second(8, 2);
  second->to(gpu);
  std::vector<torch::Tensor> params = first->parameters();
  for (const auto& p : second->parameters()) {
    params.push_back(p);
  }
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.1));
  auto forward = [&] {
    return second->forward(first->forward(torch::randn({4, 8})).to(gpu)).pow(2).mean();
  };
  GradScaler scaler(GradScalerOptions().init_scale(1024.0));

  auto loss = forward();
  const auto refs = torch::autograd::grad({loss}, {first->weight, second->weight}, {}, true);
  scaler.scale(loss).backward();
  scaler.unscale_(optimizer);
  EXPECT_TRUE(torch::allclose(first->weight.grad(), refs[0], 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(second->weight.grad(), refs[1], 1e-5, 1e-6));
  EXPECT_TRUE(scaler.step(optimizer).has_value());
  scaler.update();

  // An overflow on the CPU side must skip the step although the scale lives on the GPU.
  optimizer.zero_grad();
  scaler.scale(forward()).backward();
  first->weight.mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(scaler.step(optimizer).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 512.0);
}

TEST_F(Cuda, ScheduleOnTheGpuEqualsTheScheduleOnTheCpu) {
  std::vector<double> scales[2];
  for (int d = 0; d < 2; ++d) {
    const torch::Device device = d == 0 ? torch::Device(torch::kCPU) : gpu;
    OneParam p(torch::ones({8}, device));
    GradScaler scaler(GradScalerOptions().init_scale(100.0).growth_factor(1.7).backoff_factor(0.3).growth_interval(2));
    for (int i = 0; i < 12; ++i) {
      scaler.scale(torch::ones({}, device));
      auto g = torch::ones({8}, device);
      if (i % 5 == 2) {
        g[1] = std::numeric_limits<float>::infinity();
      }
      p.set_grad(g);
      scaler.step(p.optimizer);
      scaler.update();
      scales[d].push_back(scaler.get_scale());
    }
  }
  EXPECT_EQ(scales[0], scales[1]);
}

TEST_F(Cuda, GenericBackendForcedOnTheGpuGivesTheSameResults) {
  lucid::amp::detail::ForceGenericBackendGuard guard;
  OneParam p(torch::ones({1000}, torch::TensorOptions().dtype(torch::kBFloat16).device(gpu)));
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  scale_loss(scaler, gpu);
  const auto g = (torch::randn({1000}, gpu) * 10).to(torch::kBFloat16);
  p.set_grad(g);
  scaler.unscale_(p.optimizer);
  EXPECT_TRUE(torch::equal(p.param.grad(), (g.to(torch::kFloat) * 0.25f).to(torch::kBFloat16)));
  EXPECT_TRUE(scaler.step(p.optimizer).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

#ifdef LUCID_AMP_WITH_CUDA
using lucid_test::SyncsAreErrors;

TEST_F(Cuda, ScaleUnscaleAndUpdateNeverSynchroniseWithTheHost) {
  torch::nn::Linear model(32, 32);
  model->to(gpu);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  auto x = torch::randn({4, 32}, gpu);
  {
    SyncsAreErrors no_syncs;
    auto scaled = scaler.scale(model->forward(x).pow(2).mean());
    scaled.backward();
    scaler.unscale_(optimizer);
  }
  EXPECT_TRUE(scaler.step(optimizer).has_value());  // the one allowed 4-byte read
  {
    SyncsAreErrors no_syncs;
    EXPECT_NO_THROW(scaler.update());
  }
}

// ---- the host reads a flag where it became final, not behind later kernels ----------

// About half a second of one GPU thread spinning: long beside everything the scaler
// queues, so the stream is still busy when a call that did not wait for it returns.
constexpr int64_t kBusyCycles = 1'000'000'000;

bool gpu_still_busy() { return !at::cuda::getCurrentCUDAStream().query(); }

// A scaler-aware optimizer whose step only keeps the GPU busy.
struct SlowScalerAwareOptimizer {
  std::vector<torch::Tensor> params;
  lucid::amp::OptimizerView view() {
    lucid::amp::OptimizerView v;
    v.key = this;
    v.param_groups = {params};
    v.step = [] { at::cuda::sleep(kBusyCycles); };
    v.set_grad_scaling = [](const torch::Tensor&, const torch::Tensor&) {};
    return v;
  }
};

TEST_F(Cuda, ScalerAwareStepAndUpdateWaitForNothingQueuedBeforeThem) {
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  SlowScalerAwareOptimizer slow;
  slow.params = {torch::zeros({1000}, gpu).requires_grad_()};
  scaler.scale(torch::ones({}, gpu));  // places the scale on the GPU
  for (const float g : {1.0f, std::numeric_limits<float>::infinity()}) {
    const bool clean = std::isfinite(g);
    SCOPED_TRACE(clean ? "clean" : "overflow");
    slow.params[0].mutable_grad() = torch::full({1000}, g, gpu);
    at::cuda::sleep(kBusyCycles);           // queued ahead of the gradients' check
    EXPECT_TRUE(scaler.step(slow.view()));  // the device decides whether it skips
    EXPECT_TRUE(gpu_still_busy()) << "step() waited for the device";
    scaler.update();
    EXPECT_TRUE(gpu_still_busy()) << "update() waited for the device";
    scaler.history();  // starts a copy of the step log: must not wait for it
    EXPECT_TRUE(gpu_still_busy()) << "history() waited for the device";
    EXPECT_EQ(scaler.step_skipped(&slow), !clean);  // reads it: waits
    EXPECT_EQ(scaler.get_scale(), clean ? 4.0 : 2.0);
  }
  const lucid::amp::ScalerCounters counters = scaler.counters();
  EXPECT_EQ(counters.steps_taken, 1);
  EXPECT_EQ(counters.steps_skipped, 1);
  EXPECT_EQ(counters.backoffs, 1);
  const std::vector<lucid::amp::StepRecord> log = scaler.history(/*wait=*/true);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_FALSE(log[0].found_inf);
  EXPECT_TRUE(log[1].found_inf);
  EXPECT_EQ(log[1].scale, 4.0);
  EXPECT_EQ(log[1].new_scale, 2.0);
  // The flag landed after its update(), when the gradients may have changed: the report
  // names the optimizer and the scale, and leaves the gradients uninspected.
  ASSERT_TRUE(scaler.last_overflow().has_value());
  EXPECT_EQ(scaler.last_overflow()->iteration, 1);
  EXPECT_EQ(scaler.last_overflow()->scale, 4.0);
  EXPECT_EQ(scaler.last_overflow()->uninspected_optimizers, 1);
  EXPECT_TRUE(scaler.last_overflow()->gradients.empty());
}

TEST_F(Cuda, AScalerAwareOverflowThatLandedByUpdateNamesItsGradient) {
  GradScaler scaler(GradScalerOptions().init_scale(4.0));
  SlowScalerAwareOptimizer slow;
  slow.params = {torch::zeros({1000}, gpu).requires_grad_()};
  scaler.set_parameter_name(slow.params[0], "w");
  scaler.scale(torch::ones({}, gpu));
  slow.params[0].mutable_grad() = torch::full({1000}, std::numeric_limits<float>::infinity(), gpu);
  scaler.step(slow.view());
  torch::cuda::synchronize();  // the flag's copy has landed before update()
  scaler.update();
  ASSERT_TRUE(scaler.last_overflow().has_value());
  ASSERT_EQ(scaler.last_overflow()->gradients.size(), 1u);
  EXPECT_EQ(scaler.last_overflow()->gradients[0].name, "w");
  EXPECT_EQ(scaler.last_overflow()->gradients[0].inf_count, 1000);
  EXPECT_EQ(scaler.last_overflow()->scale, 4.0);
  EXPECT_EQ(scaler.last_overflow()->uninspected_optimizers, 0);
}

TEST_F(Cuda, StepOfAPlainOptimizerDoesNotWaitForWhatRanAfterUnscaleOrClip) {
  for (const bool clip : {false, true}) {
    SCOPED_TRACE(clip ? "clip_grad_norm_" : "unscale_");
    torch::nn::Linear model(64, 64);
    model->to(gpu);
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    GradScaler scaler;
    scaler.scale(model->forward(torch::randn({4, 64}, gpu)).pow(2).mean()).backward();
    if (clip) {
      scaler.clip_grad_norm_(optimizer, 1.0);
    } else {
      scaler.unscale_(optimizer);
    }
    at::cuda::sleep(kBusyCycles);  // the caller's own work between the two calls
    const auto before = model->weight.detach().clone();
    EXPECT_TRUE(scaler.step(optimizer).has_value());
    EXPECT_TRUE(gpu_still_busy()) << "step() waited for the work queued after the flag";
    scaler.update();
    EXPECT_FALSE(torch::equal(model->weight.detach(), before));  // the step ran
  }
}
#endif

// ---- own kernels against references -----------------------------------------------

TEST_F(Cuda, OwnUnscaleKernelMatchesAReferenceOnManyTensorsAndDtypes) {
  std::vector<torch::Tensor> grads, expected;
  const float scale = 3.0f;
  for (int i = 0; i < 40; ++i) {
    const auto dtype = i % 3 == 0 ? torch::kFloat : i % 3 == 1 ? torch::kDouble : torch::kBFloat16;
    auto g = (torch::randn({i * 4099 + 1}, torch::TensorOptions().dtype(torch::kDouble).device(gpu)) * 100).to(dtype);
    if (i == 7) g = g.slice(0, 1);  // misaligned start: not a 16-byte boundary
    grads.push_back(g);
    expected.push_back(dtype == torch::kDouble ? g * (1.0 / 3.0)
                                               : (g.to(torch::kFloat) * static_cast<float>(1.0 / 3.0)).to(dtype));
  }
  auto found = torch::zeros({}, gpu);
  lucid::amp::detail::unscale_grads_(grads, torch::full({}, scale, gpu), found);
  EXPECT_EQ(found.item<float>(), 0.0f);
  for (size_t i = 0; i < grads.size(); ++i) {
    EXPECT_TRUE(torch::equal(grads[i], expected[i])) << "tensor " << i;
  }
  grads[25][grads[25].numel() - 1] = std::numeric_limits<float>::infinity();
  lucid::amp::detail::unscale_grads_(grads, torch::full({}, 1.0f, gpu), found);
  EXPECT_EQ(found.item<float>(), 1.0f);
}

// Lists longer than the kernels' shared copy of the offsets (4096 tensors) search them in
// global memory, and so do lists of small tensors, whose chunks are capped at their mean
// size; every way must find every tensor, empty ones included.
TEST_F(Cuda, UnscaleAndCheckFindEveryTensorOfShortAndLongLists) {
  struct List {
    int count;
    int64_t size_step;  // tensor i holds (i % 7) * size_step elements; 0: one each
  };
  for (const List list : {List{300, 1031}, List{5000, 1031}, List{288, 0}, List{300, 9}}) {
    const int count = list.count;
    std::vector<torch::Tensor> grads;
    for (int i = 0; i < count; ++i) {
      const int64_t n = list.size_step == 0 ? 1 : (i % 7) * list.size_step;  // 0: empty
      grads.push_back(torch::full({n}, 8.0f, gpu));
    }
    auto found = torch::zeros({}, gpu);
    lucid::amp::detail::unscale_grads_(grads, torch::full({}, 4.0f, gpu), found);
    EXPECT_EQ(found.item<float>(), 0.0f) << count << " tensors";
    // Every element of every tensor, at once: a tensor the kernel missed still holds 8.
    EXPECT_TRUE(torch::all(torch::cat(grads) == 2.0f).item<bool>()) << count << " tensors";
    for (int bad : {1, count / 2, count - 1}) {
      auto g = grads;
      g[bad][g[bad].numel() - 1] = std::numeric_limits<float>::quiet_NaN();
      auto flag = torch::zeros({}, gpu);
      lucid::amp::detail::check_grads_finite_(g, torch::full({}, 1.0f, gpu), flag);
      EXPECT_EQ(flag.item<float>(), 1.0f) << "check, tensor " << bad << " of " << count;
      flag.zero_();
      lucid::amp::detail::unscale_grads_(g, torch::full({}, 1.0f, gpu), flag);
      EXPECT_EQ(flag.item<float>(), 1.0f) << "unscale, tensor " << bad << " of " << count;
      g[bad][g[bad].numel() - 1] = 2.0f;
    }
  }
}

// The kernels' record of the first non-finite gradient: lists of small tensors (chunks
// capped at their mean size, offsets searched in global memory), of large ones (full
// chunks, offsets in shared memory) and longer than that shared copy, mixed dtypes (one
// launch each), a slot on the GPU and one on the CPU (lowered through one on the GPU).
TEST_F(Cuda, EveryCheckRecordsTheSmallestKeyOfANonFiniteGradient) {
  for (const int count : {1, 40, 5000}) {
    lucid_test::expect_checks_record_the_first_overflow(gpu, gpu, count,
                                                        static_cast<unsigned>(count));
  }
  lucid_test::expect_checks_record_the_first_overflow(gpu, gpu, 40, 7, /*min_size=*/40000);
  lucid_test::expect_checks_record_the_first_overflow(gpu, torch::kCPU, 40, 9);
}

TEST_F(Cuda, ReadOnlyCheckWritesNothingAndFindsOverflowAfterScaling) {
  auto g = torch::full({100003}, 2.0, gpu);
  auto found = torch::zeros({}, gpu);
  lucid::amp::detail::check_grads_finite_({g}, torch::full({}, 0.5f, gpu), found);
  EXPECT_EQ(found.item<float>(), 0.0f);
  EXPECT_TRUE(torch::all(g == 2.0).item<bool>());
  g[100002] = 3e38;  // finite, but times 1/0.5 it overflows float32
  lucid::amp::detail::check_grads_finite_({g}, torch::full({}, 0.5f, gpu), found);
  EXPECT_EQ(found.item<float>(), 1.0f);
}

using Factory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// A large and a small tensor and one of 1M elements: the launches take full chunks.
std::vector<torch::Tensor> mixed_sizes(const torch::Device& device) {
  return {torch::randn({300, 301}, device), torch::randn({7}, device),
          torch::randn({1 << 20}, device)};
}

void expect_fused_matches_torch_on(const torch::Device& device, Factory fused, Factory reference,
                                   std::vector<torch::Tensor> a = {}) {
  torch::manual_seed(5);
  if (a.empty()) {
    a = mixed_sizes(device);
  }
  std::vector<torch::Tensor> b;
  for (auto& p : a) {
    p.requires_grad_(true);
    b.push_back(p.detach().clone().requires_grad_(true));
  }
  auto fo = fused(a);
  auto ro = reference(b);
  for (int step = 0; step < 100; ++step) {
    for (size_t i = 0; i < a.size(); ++i) {
      auto g = torch::randn(a[i].sizes(), device);
      a[i].mutable_grad() = g;
      b[i].mutable_grad() = g.clone();
    }
    fo->step();
    ro->step();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], 1e-4, 1e-5))
        << "param " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}

TEST_F(Cuda, FusedSgdMomentumMatchesTorchOver100Steps) {
  expect_fused_matches_torch_on(
      gpu,
      [](auto p) { return std::make_unique<lucid::optim::FusedSGD>(p, lucid::optim::FusedSGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(1e-4)); },
      [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true).weight_decay(1e-4)); });
}

TEST_F(Cuda, FusedAdamAmsgradMatchesTorchOver100Steps) {
  expect_fused_matches_torch_on(
      gpu,
      [](auto p) { return std::make_unique<lucid::optim::FusedAdam>(p, lucid::optim::FusedAdamOptions(1e-3).amsgrad(true).weight_decay(1e-2)); },
      [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-3).amsgrad(true).weight_decay(1e-2)); });
}

TEST_F(Cuda, FusedAdamWMatchesTorchOver100Steps) {
  expect_fused_matches_torch_on(
      gpu,
      [](auto p) { return std::make_unique<lucid::optim::FusedAdamW>(p, lucid::optim::FusedAdamWOptions(1e-3)); },
      [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3)); });
}

// 300 tensors of 1 to 37 elements: the launches take chunks of about the mean tensor
// size, so blocks begin and end inside and between tensors of every size.
TEST_F(Cuda, FusedOptimizersOnManySmallTensorsMatchTorchOver100Steps) {
  auto small_sizes = [this] {
    torch::manual_seed(6);
    std::vector<torch::Tensor> a;
    for (int i = 0; i < 300; ++i) {
      a.push_back(torch::randn({1 + (i * 7) % 37}, gpu));
    }
    return a;
  };
  expect_fused_matches_torch_on(
      gpu,
      [](auto p) { return std::make_unique<lucid::optim::FusedAdamW>(p, lucid::optim::FusedAdamWOptions(1e-3).weight_decay(0.1)); },
      [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-3).weight_decay(0.1)); },
      small_sizes());
  expect_fused_matches_torch_on(
      gpu,
      [](auto p) { return std::make_unique<lucid::optim::FusedSGD>(p, lucid::optim::FusedSGDOptions(0.01).momentum(0.9)); },
      [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.01).momentum(0.9)); },
      small_sizes());
}

#ifdef LUCID_AMP_WITH_CUDA
TEST_F(Cuda, GraphSafeFusedStepAndUpdateNeverSynchronise) {
  torch::nn::Linear model(256, 256);
  model->to(gpu);
  lucid::optim::FusedAdamW optimizer(model->parameters(), lucid::optim::FusedAdamWOptions(1e-3));
  GradScaler scaler(GradScalerOptions().graph_safe(true));
  auto x = torch::randn({16, 256}, gpu);
  scaler.scale(model->forward(x).pow(2).mean()).backward();
  scaler.step(optimizer);  // first step creates state (allocations only)
  scaler.update();
  SyncsAreErrors no_syncs;
  for (auto& p : model->parameters()) p.mutable_grad().zero_();
  scaler.scale(model->forward(x).pow(2).mean()).backward();
  EXPECT_NO_THROW(scaler.step(optimizer));
  EXPECT_NO_THROW(scaler.update());
}

// A whole training step (forward, backward, scaled fused step, update) captured once in
// a CUDA graph and replayed beside an eager twin fed the same inputs: an inf in the
// static input makes a replay skip on the device and back off, as the eager step does,
// and the device counts what the replays did. The last eager warm-up overflows too, so
// the overflow streak runs from eager updates into replayed ones.
void capture_training_step_and_replay_like_eager(GradScalerOptions options) {
  const torch::Device gpu{torch::kCUDA, 0};
  torch::manual_seed(3);
  torch::nn::Linear model(64, 64);
  torch::nn::Linear twin(64, 64);
  model->to(gpu);
  twin->to(gpu);
  {
    torch::NoGradGuard no_grad;
    twin->weight.copy_(model->weight);
    twin->bias.copy_(model->bias);
  }
  lucid::optim::FusedAdamW optimizer(model->parameters(), lucid::optim::FusedAdamWOptions(1e-2));
  lucid::optim::FusedAdamW twin_optimizer(twin->parameters(),
                                          lucid::optim::FusedAdamWOptions(1e-2));
  const GradScalerOptions schedule = options.init_scale(1024.0).growth_interval(1000);
  GradScaler scaler(schedule);
  GradScaler twin_scaler(schedule);
  auto static_x = torch::randn({8, 64}, gpu);
  auto static_y = torch::randn({8, 64}, gpu);
  auto train_step = [&](torch::nn::Linear& m, lucid::optim::FusedAdamW& opt, GradScaler& s) {
    for (auto& p : m->parameters()) {
      if (p.grad().defined()) p.mutable_grad().zero_();
    }
    auto loss = (m->forward(static_x) - static_y).pow(2).mean();
    s.scale(loss).backward();
    s.step(opt);
    s.update();
  };
  const auto clean_x = static_x.clone();
  const float inf = std::numeric_limits<float>::infinity();
  auto side = c10::cuda::getStreamFromPool();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    for (int i = 0; i < 3; ++i) {
      static_x.copy_(clean_x);
      if (i == 2) static_x[0][0] = inf;
      train_step(model, optimizer, scaler);
      train_step(twin, twin_optimizer, twin_scaler);
    }
  }
  torch::cuda::synchronize();
  ASSERT_TRUE(scaler.step_skipped(optimizer));
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.capture_begin();
    train_step(model, optimizer, scaler);
    graph.capture_end();
  }
  const std::vector<bool> overflows{true, false, true};
  for (size_t i = 0; i < overflows.size(); ++i) {
    SCOPED_TRACE("replay " + std::to_string(i));
    static_x.copy_(clean_x);
    if (overflows[i]) static_x[0][0] = inf;
    const auto before = model->weight.detach().clone();
    graph.replay();
    train_step(twin, twin_optimizer, twin_scaler);  // in stream order after the input's copy
    torch::cuda::synchronize();
    EXPECT_EQ(torch::equal(model->weight.detach(), before), overflows[i])
        << "a replay skips exactly when its gradients overflow";
    EXPECT_TRUE(torch::allclose(model->weight.detach(), twin->weight.detach(), 1e-5, 1e-6));
    EXPECT_EQ(scaler.get_scale(), twin_scaler.get_scale());
    EXPECT_EQ(scaler.step_skipped(optimizer), overflows[i]);
    // The first replay's overflow follows the last warm-up's: a streak of 2.
    EXPECT_TRUE(CountersAre(scaler.counters(), twin_scaler.counters()));
  }
  // The step log holds the replays as the twin's holds its eager updates.
  const std::vector<lucid::amp::StepRecord> log = scaler.history(/*wait=*/true);
  const std::vector<lucid::amp::StepRecord> twin_log = twin_scaler.history(/*wait=*/true);
  ASSERT_EQ(log.size(), 6u);
  ASSERT_EQ(twin_log.size(), 6u);
  for (size_t i = 0; i < log.size(); ++i) {
    SCOPED_TRACE("update " + std::to_string(i));
    EXPECT_EQ(log[i].update, static_cast<int64_t>(i));
    EXPECT_EQ(log[i].update, twin_log[i].update);
    EXPECT_EQ(log[i].scale, twin_log[i].scale);
    EXPECT_EQ(log[i].new_scale, twin_log[i].new_scale);
    EXPECT_EQ(log[i].found_inf, twin_log[i].found_inf);
    EXPECT_EQ(log[i].change, twin_log[i].change);
    EXPECT_EQ(log[i].found_inf, i == 2 || i == 3 || i == 5);
    // The checks name the weight (parameter 0 of the iteration's one optimizer), replays
    // as the eager updates.
    ASSERT_EQ(log[i].first_overflow.has_value(), log[i].found_inf);
    ASSERT_EQ(twin_log[i].first_overflow.has_value(), twin_log[i].found_inf);
    if (log[i].found_inf) {
      EXPECT_EQ(log[i].first_overflow->optimizer, 0);
      EXPECT_EQ(log[i].first_overflow->parameter, 0);
      EXPECT_EQ(twin_log[i].first_overflow->parameter, 0);
    }
  }
  EXPECT_EQ(scaler.get_scale(), 128.0);
  // 3 warm-ups and 3 replays; three overflowed (the last warm-up, replays 0 and 2), each
  // backing off: as the twin counted.
  EXPECT_TRUE(CountersAre(scaler.counters(), {/*taken*/ 3, /*skipped*/ 3, /*updates*/ 6,
                                              /*overflow_updates*/ 3, /*backoffs*/ 3,
                                              /*growths*/ 0, /*streak*/ 1}));
}

TEST_F(Cuda, GraphSafeTrainingStepCapturedInACudaGraphReplaysLikeEager) {
  capture_training_step_and_replay_like_eager(GradScalerOptions().graph_safe(true));
}

// The default mode needs no option for a capture: a captured step of an optimizer that
// skips on the device, and a captured update, read nothing on the host.
TEST_F(Cuda, DefaultModeTrainingStepCapturedInACudaGraphReplaysLikeEager) {
  capture_training_step_and_replay_like_eager(GradScalerOptions());
}

// A plain optimizer's step must read the flag on the host, which a replay cannot: refused
// while capturing, before anything is queued.
TEST_F(Cuda, CapturedStepOfAPlainOptimizerIsRefusedClearly) {
  auto weight = torch::ones({16}, torch::TensorOptions().device(gpu).requires_grad(true));
  torch::optim::SGD optimizer({weight}, torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  auto side = c10::cuda::getStreamFromPool();
  c10::cuda::CUDAStreamGuard guard(side);
  scaler.scale(weight.sum()).backward();
  scaler.step(optimizer);
  scaler.update();
  scaler.scale(weight.sum()).backward();
  torch::cuda::synchronize();
  const auto before = weight.detach().clone();
  at::cuda::CUDAGraph graph;
  graph.capture_begin();
  EXPECT_TRUE(
      ThrowsExactly<c10::Error>("captured in a CUDA graph", [&] { scaler.step(optimizer); }));
  graph.capture_end();
  EXPECT_EQ(scaler.stage(optimizer), OptimizerStage::kReady);
  scaler.step(optimizer);  // eagerly, the same step runs
  scaler.update();
  EXPECT_FALSE(torch::equal(weight.detach(), before));
}
#endif

TEST_F(Cuda, AutocastRunsTheForwardInFloat16AndNestsDtypes) {
  torch::nn::Linear model(8, 8);
  model->to(gpu);
  auto x = torch::randn({2, 8}, gpu);
  {
    lucid::amp::autocast outer(torch::kCUDA);
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kHalf);
    {
      lucid::amp::autocast inner(torch::kCUDA, torch::kBFloat16);
      EXPECT_EQ(model->forward(x).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(model->forward(x).scalar_type(), torch::kHalf);
  }
  EXPECT_EQ(model->forward(x).scalar_type(), torch::kFloat);
  EXPECT_EQ(model->weight.scalar_type(), torch::kFloat);
}

}  // namespace
