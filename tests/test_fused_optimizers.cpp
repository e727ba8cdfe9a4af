// SPDX-License-Identifier: BSD-3-Clause
// lucid::optim fused optimizers against torch::optim, and with GradScaler (CPU here;
// the same checks run on CUDA in test_cuda.cpp).

#include "support/scaler_fixtures.h"

#include <functional>
#include <limits>
#include <memory>
#include <sstream>

namespace {

using namespace lucid::optim;  // FusedAdam, FusedAdamW, FusedSGD and their options
using namespace lucid_test;

using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// Parameters of mixed shapes, one of them non-contiguous (a transposed view's base is
// contiguous, so use a strided parameter made by as_strided on fresh storage).
std::vector<torch::Tensor> make_params(torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto opts = torch::TensorOptions().dtype(dtype);
  std::vector<torch::Tensor> params{torch::randn({37, 11}, opts), torch::randn({5}, opts),
                                    torch::randn({70000}, opts),
                                    torch::randn({6, 9}, opts).t().contiguous().t()};
  for (auto& p : params) p.requires_grad_(true);
  return params;
}

std::vector<torch::Tensor> clone_params(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) {
    // Keep the strides (the last one is non-contiguous on purpose).
    auto c = torch::empty_strided(p.sizes(), p.strides(), p.options());
    c.copy_(p.detach());
    out.push_back(c.requires_grad_(true));
  }
  return out;
}

void set_grads(std::vector<torch::Tensor>& params, int step, double scale = 1.0) {
  torch::manual_seed(1000 + step);
  for (auto& p : params) {
    p.mutable_grad() = (torch::randn(p.sizes(), p.options()) * scale);
  }
}

void expect_close(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                  double rtol, double atol) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i], b[i], rtol, atol))
        << "param " << i << " max diff " << (a[i] - b[i]).abs().max().item<double>();
  }
}

struct Pair {
  const char* name;
  OptimizerFactory fused;
  OptimizerFactory reference;
};

std::vector<Pair> pairs() {
  return {
      {"SgdPlain", [](auto p) { return std::make_unique<FusedSGD>(p, FusedSGDOptions(0.05)); },
       [](auto p) { return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05)); }},
      {"SgdMomentumDampeningDecay",
       [](auto p) {
         return std::make_unique<FusedSGD>(
             p, FusedSGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(1e-3));
       },
       [](auto p) {
         return std::make_unique<torch::optim::SGD>(
             p, torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(1e-3));
       }},
      {"SgdNesterov",
       [](auto p) { return std::make_unique<FusedSGD>(p, FusedSGDOptions(0.05).momentum(0.9).nesterov(true)); },
       [](auto p) {
         return std::make_unique<torch::optim::SGD>(
             p, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
       }},
      {"Adam", [](auto p) { return std::make_unique<FusedAdam>(p, FusedAdamOptions(1e-2)); },
       [](auto p) { return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2)); }},
      {"AdamAmsgradDecay",
       [](auto p) {
         return std::make_unique<FusedAdam>(p, FusedAdamOptions(1e-2).amsgrad(true).weight_decay(1e-2));
       },
       [](auto p) {
         return std::make_unique<torch::optim::Adam>(
             p, torch::optim::AdamOptions(1e-2).amsgrad(true).weight_decay(1e-2));
       }},
      {"AdamW", [](auto p) { return std::make_unique<FusedAdamW>(p, FusedAdamWOptions(1e-2)); },
       [](auto p) { return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2)); }},
      {"AdamWAmsgrad",
       [](auto p) {
         return std::make_unique<FusedAdamW>(p, FusedAdamWOptions(1e-2).amsgrad(true).betas({0.8, 0.99}));
       },
       [](auto p) {
         return std::make_unique<torch::optim::AdamW>(
             p, torch::optim::AdamWOptions(1e-2).amsgrad(true).betas({0.8, 0.99}));
       }},
  };
}

void PrintTo(const Pair& pair, std::ostream* os) { *os << pair.name; }

class FusedVsTorch : public testing::TestWithParam<Pair> {};

TEST_P(FusedVsTorch, HundredStepsWithinFloat32Rounding) {
  auto a = make_params(torch::kFloat, 1), b = clone_params(a);
  auto fused = GetParam().fused(a);
  auto reference = GetParam().reference(b);
  for (int step = 0; step < 100; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    fused->step();
    reference->step();
  }
  expect_close(a, b, 1e-4, 1e-5);
  EXPECT_FALSE(a[3].is_contiguous());  // updated through a contiguous copy, strides kept
}

TEST_P(FusedVsTorch, Float64ParametersMatchTightly) {
  auto a = make_params(torch::kDouble, 2), b = clone_params(a);
  auto fused = GetParam().fused(a);
  auto reference = GetParam().reference(b);
  for (int step = 0; step < 30; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    fused->step();
    reference->step();
  }
  expect_close(a, b, 1e-10, 1e-12);
}

TEST_P(FusedVsTorch, UnderGradScalerWithInjectedOverflowsMatchesControlThatSkips) {
  auto a = make_params(torch::kFloat, 3), b = clone_params(a);
  auto fused = GetParam().fused(a);
  auto reference = GetParam().reference(b);
  GradScaler scaler(GradScalerOptions().init_scale(1024.0).growth_interval(4));
  for (int step = 0; step < 20; ++step) {
    const bool overflow = step == 3 || step == 11;
    scaler.scale(torch::ones({}));
    set_grads(a, step, scaler.get_scale());
    if (overflow) {
      a[1].mutable_grad()[2] = std::numeric_limits<float>::infinity();
    }
    const auto grad_before = a[0].grad().clone();
    // The optimizer skips on the device: step() returns its value either way.
    EXPECT_TRUE(scaler.step(*fused).has_value()) << "step " << step;
    EXPECT_EQ(scaler.step_skipped(*fused), overflow) << "step " << step;
    // The fused path only reads the gradients: they keep their scaled values.
    EXPECT_TRUE(torch::equal(a[0].grad(), grad_before));
    scaler.update();
    if (!overflow) {
      set_grads(b, step);
      reference->step();
    }
  }
  expect_close(a, b, 1e-4, 1e-5);
  // 1024, backoff at 3 -> 512, growth at 7 -> 1024, backoff at 11 -> 512, growths at
  // 15 and 19 -> 2048.
  EXPECT_EQ(scaler.get_scale(), 2048.0);
}

TEST_P(FusedVsTorch, UnscaleBeforeStepIsNotDividedTwice) {
  auto a = make_params(torch::kFloat, 4), b = clone_params(a);
  auto fused = GetParam().fused(a);
  auto reference = GetParam().reference(b);
  GradScaler scaler(GradScalerOptions().init_scale(64.0));
  for (int step = 0; step < 5; ++step) {
    scaler.scale(torch::ones({}));
    set_grads(a, step, 64.0);
    scaler.unscale_(*fused);
    torch::nn::utils::clip_grad_norm_(a, 5.0);
    EXPECT_TRUE(scaler.step(*fused).has_value());
    scaler.update();
    set_grads(b, step);
    torch::nn::utils::clip_grad_norm_(b, 5.0);
    reference->step();
  }
  expect_close(a, b, 1e-4, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FusedVsTorch, testing::ValuesIn(pairs()),
                         [](const testing::TestParamInfo<Pair>& info) { return std::string(info.param.name); });

TEST(FusedOptimizers, SkippedStepLeavesStateAndStepCountersUnchanged) {
  auto params = make_params(torch::kFloat, 5);
  FusedAdam adam(params, FusedAdamOptions(1e-2));
  set_grads(params, 0);
  adam.step();
  const auto key_state = [&]() -> lucid::optim::FusedAdamParamState& {
    return static_cast<lucid::optim::FusedAdamParamState&>(*adam.state().begin()->second);
  };
  const auto step_before = key_state().step().clone();
  const auto avg_before = key_state().exp_avg().clone();
  const auto p_before = params[0].detach().clone();
  set_grads(params, 1);
  adam.set_grad_scaling(torch::full({}, 2.0f), torch::ones({}));
  adam.step();
  EXPECT_TRUE(torch::equal(key_state().step(), step_before));
  EXPECT_TRUE(torch::equal(key_state().exp_avg(), avg_before));
  EXPECT_TRUE(torch::equal(params[0].detach(), p_before));
  // The scaling applies to one step only.
  adam.step();
  EXPECT_EQ(key_state().step().item<float>(), 2.0f);
}

TEST(FusedOptimizers, ParamGroupsAndLrSchedulerFollowTorch) {
  auto a = make_params(torch::kFloat, 6), b = clone_params(a);
  std::vector<torch::optim::OptimizerParamGroup> ga{
      torch::optim::OptimizerParamGroup({a[0], a[1]}),
      torch::optim::OptimizerParamGroup({a[2], a[3]}, std::make_unique<FusedAdamOptions>(1e-3))};
  std::vector<torch::optim::OptimizerParamGroup> gb{
      torch::optim::OptimizerParamGroup({b[0], b[1]}),
      torch::optim::OptimizerParamGroup({b[2], b[3]}, std::make_unique<torch::optim::AdamOptions>(1e-3))};
  FusedAdam fused(std::move(ga), FusedAdamOptions(1e-2));
  torch::optim::Adam reference(std::move(gb), torch::optim::AdamOptions(1e-2));
  // Each group starts with the lr that torch::optim gives it (LibTorch 2.13 gives the
  // second group the defaults' lr, not the 1e-3 of its own options): the fused optimizer
  // follows torch::optim's rule, whichever it is.
  const double lr0 = reference.param_groups()[1].options().get_lr();
  EXPECT_DOUBLE_EQ(fused.param_groups()[1].options().get_lr(), lr0);
  torch::optim::StepLR sched_a(fused, 3, 0.5), sched_b(reference, 3, 0.5);
  for (int step = 0; step < 12; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    fused.step();
    reference.step();
    sched_a.step();
    sched_b.step();
  }
  EXPECT_DOUBLE_EQ(fused.param_groups()[1].options().get_lr(),
                   reference.param_groups()[1].options().get_lr());
  EXPECT_LT(fused.param_groups()[1].options().get_lr(), lr0 * 0.2);  // it did decay
  expect_close(a, b, 1e-4, 1e-5);
}

// Runs `steps` steps on one copy of the parameters, saves the optimizer after `saved_at`
// of them, loads the archive into a fresh optimizer over a third copy (taken at the
// save) and finishes with it: the result must equal the uninterrupted run bit for bit.
// make(params) builds the optimizer (as with torch::optim, the archive carries the
// state; options come from the constructor).
template <typename Make>
void expect_save_and_load_continue_exactly(uint64_t seed, int saved_at, int steps, Make make) {
  auto a = make_params(torch::kFloat, seed), b = clone_params(a);
  auto first = make(a), straight = make(b);
  for (int step = 0; step < saved_at; ++step) {
    set_grads(a, step);
    set_grads(b, step);
    first->step();
    straight->step();
  }
  std::stringstream stream;
  torch::save(*first, stream);
  auto c = clone_params(a);
  auto resumed = make(c);
  torch::load(*resumed, stream);
  for (int step = saved_at; step < steps; ++step) {
    set_grads(c, step);
    set_grads(b, step);
    resumed->step();
    straight->step();
  }
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_TRUE(torch::equal(c[i], b[i])) << "param " << i;
  }
}

TEST(FusedOptimizers, SaveAndLoadContinueExactly) {
  expect_save_and_load_continue_exactly(7, 5, 10, [](std::vector<torch::Tensor>& params) {
    return std::make_unique<FusedAdamW>(params, FusedAdamWOptions(1e-2).amsgrad(true));
  });
}

TEST(FusedOptimizers, SgdMomentumSaveAndLoadContinueExactly) {
  expect_save_and_load_continue_exactly(8, 3, 6, [](std::vector<torch::Tensor>& params) {
    return std::make_unique<FusedSGD>(params, FusedSGDOptions(0.1).momentum(0.9));
  });
}

TEST(FusedOptimizers, InvalidOptionsAreValueErrors) {
  auto p = make_params(torch::kFloat, 9);
  EXPECT_THROW(FusedSGD(p, FusedSGDOptions(-1.0)), c10::ValueError);
  EXPECT_THROW(FusedSGD(p, FusedSGDOptions(0.1).nesterov(true)), c10::ValueError);
  EXPECT_THROW(FusedAdam(p, FusedAdamOptions(1e-3).betas({1.0, 0.999})), c10::ValueError);
  EXPECT_THROW(FusedAdamW(p, FusedAdamWOptions(1e-3).eps(-1)), c10::ValueError);
}

TEST(FusedOptimizers, UnsupportedGradientsAreRefusedBeforeAnythingChanges) {
  auto p = make_params(torch::kFloat, 10);
  FusedAdam adam(p);
  set_grads(p, 0);
  const auto before = p[0].detach().clone();
  p[2].mutable_grad() = p[2].grad().to_sparse();
  EXPECT_THROW(adam.step(), c10::NotImplementedError);
  EXPECT_TRUE(torch::equal(p[0].detach(), before));
  auto half = torch::ones({4}, torch::kHalf).requires_grad_(true);
  half.mutable_grad() = torch::ones({4}, torch::kHalf);
  FusedSGD sgd({half}, FusedSGDOptions(0.1));
  EXPECT_THROW(sgd.step(), c10::NotImplementedError);
}

// NOTE: [Launch layout]: a gradient or state that no longer matches its parameter (resized
// or replaced in place since the last step, another dtype) is refused, named, before any
// parameter of any group is written, where torch::optim's update fails too.
TEST(FusedOptimizers, TensorsThatNoLongerMatchTheirParameterAreRefusedBeforeAnyWrite) {
  using Change = std::function<void(torch::optim::Optimizer&, torch::Tensor&)>;
  auto adam_state = [](torch::optim::Optimizer& o, const torch::Tensor& p) -> FusedAdamParamState& {
    return static_cast<FusedAdamParamState&>(*o.state().at(p.unsafeGetTensorImpl()));
  };
  auto sgd_state = [](torch::optim::Optimizer& o, const torch::Tensor& p) -> FusedSGDParamState& {
    return static_cast<FusedSGDParamState&>(*o.state().at(p.unsafeGetTensorImpl()));
  };
  const std::vector<std::tuple<const char*, bool, Change, const char*>> cases = {
      {"gradient set_ to 2 elements", true,
       [](torch::optim::Optimizer&, torch::Tensor& p) { p.mutable_grad().set_(torch::ones({2})); },
       "the gradient of parameter 0 of param group 1"},
      {"exp_avg replaced by float64", true,
       [&](torch::optim::Optimizer& o, torch::Tensor& p) {
         adam_state(o, p).exp_avg(torch::zeros_like(p, torch::kDouble));
       },
       "the exp_avg of parameter 0 of param group 1"},
      {"exp_avg_sq resized in place", true,
       [&](torch::optim::Optimizer& o, torch::Tensor& p) {
         adam_state(o, p).exp_avg_sq().resize_({3});
       },
       "the exp_avg_sq of parameter 0 of param group 1"},
      {"step counter set_ to no element", true,
       [&](torch::optim::Optimizer& o, torch::Tensor& p) {
         adam_state(o, p).step().set_(torch::zeros({0}));
       },
       "the step counter of parameter 0 of param group 1"},
      {"momentum_buffer set_ to 2 elements", false,
       [&](torch::optim::Optimizer& o, torch::Tensor& p) {
         sgd_state(o, p).momentum_buffer().set_(torch::zeros({2}));
       },
       "the momentum_buffer of parameter 0 of param group 1"},
  };
  for (const auto& [name, adam, change, message] : cases) {
    auto a = torch::zeros({28, 28}).requires_grad_(true);
    auto b = torch::zeros({784}).requires_grad_(true);
    std::vector<torch::optim::OptimizerParamGroup> groups = {
        torch::optim::OptimizerParamGroup({a}), torch::optim::OptimizerParamGroup({b})};
    std::unique_ptr<torch::optim::Optimizer> opt;
    if (adam) {
      opt = std::make_unique<FusedAdamW>(groups, FusedAdamWOptions(0.1));
    } else {
      opt = std::make_unique<FusedSGD>(groups, FusedSGDOptions(0.1).momentum(0.9));
    }
    for (int i = 0; i < 2; ++i) {
      a.mutable_grad() = torch::ones_like(a);
      b.mutable_grad() = torch::ones_like(b);
      opt->step();
    }
    const auto a_before = a.detach().clone(), b_before = b.detach().clone();
    change(*opt, b);
    EXPECT_TRUE(ThrowsError(message, [&] { opt->step(); })) << name;
    EXPECT_TRUE(torch::equal(a.detach(), a_before)) << name << ": group 0 was written";
    EXPECT_TRUE(torch::equal(b.detach(), b_before)) << name;
  }
}

// NOTE: [Kept launch lists]: from the second step on, a step launches from the lists kept
// by the last one. Every change a caller can make between steps is seen, and the steps
// follow torch::optim's through them: a gradient that goes away and comes back, a state
// tensor replaced through state(), a new learning rate, a gradient of another layout, a
// new param group, a state loaded from an archive.
TEST(FusedOptimizers, KeptListsFollowEveryChangeBetweenSteps) {
  auto params = make_params(torch::kFloat, 21);
  params.pop_back();  // the strided one: its contiguous gradients would take the checked way
  auto ref_params = clone_params(params);
  FusedAdamW fused(params, FusedAdamWOptions(1e-2).weight_decay(1e-2));
  torch::optim::AdamW reference(ref_params, torch::optim::AdamWOptions(1e-2).weight_decay(1e-2));
  auto fused_state = [&](size_t i) -> FusedAdamParamState& {
    return static_cast<FusedAdamParamState&>(*fused.state().at(params[i].unsafeGetTensorImpl()));
  };
  auto ref_state = [&](size_t i) -> torch::optim::AdamWParamState& {
    return static_cast<torch::optim::AdamWParamState&>(
        *reference.state().at(ref_params[i].unsafeGetTensorImpl()));
  };
  torch::Tensor extra = torch::randn({13}).requires_grad_(true);
  torch::Tensor ref_extra = extra.detach().clone().requires_grad_(true);
  for (int step = 0; step < 12; ++step) {
    set_grads(params, step);
    set_grads(ref_params, step);
    switch (step) {
      case 3:  // a gradient goes away for one step
        params[1].mutable_grad() = torch::Tensor();
        ref_params[1].mutable_grad() = torch::Tensor();
        break;
      case 5:  // a state tensor replaced through state()
        fused_state(0).exp_avg(torch::zeros_like(params[0]));
        ref_state(0).exp_avg(torch::zeros_like(ref_params[0]));
        break;
      case 6:  // a new learning rate
        fused.param_groups()[0].options().set_lr(3e-3);
        reference.param_groups()[0].options().set_lr(3e-3);
        break;
      case 7: {  // a gradient of another layout (transposed storage)
        const torch::Tensor g = params[0].grad().t().contiguous().t();
        params[0].mutable_grad() = g;
        break;
      }
      case 8:  // a new param group
        fused.add_param_group(torch::optim::OptimizerParamGroup({extra}));
        reference.add_param_group(torch::optim::OptimizerParamGroup({ref_extra}));
        break;
      case 10: {  // the state saved and loaded back (new state objects and tensors)
        std::stringstream archive;
        torch::save(fused, archive);
        torch::load(fused, archive);
        break;
      }
      default:
        break;
    }
    if (step >= 8) {
      torch::manual_seed(2000 + step);
      extra.mutable_grad() = torch::randn({13});
      ref_extra.mutable_grad() = extra.grad().clone();
    }
    fused.step();
    reference.step();
    expect_close(params, ref_params, 1e-5, 1e-6);
    EXPECT_TRUE(torch::allclose(extra, ref_extra, 1e-5, 1e-6)) << "step " << step;
    if (step == 5) {
      EXPECT_FALSE(torch::equal(fused_state(0).exp_avg(), torch::zeros_like(params[0])))
          << "the replaced exp_avg was not the one stepped";
    }
  }
}

// An option that adds a state list (amsgrad, momentum) turned on after steps makes the
// state it needs, as the first step with it on would.
TEST(FusedOptimizers, KeptListsFollowAStateListTurnedOn) {
  auto params = make_params(torch::kFloat, 22);
  params.pop_back();
  FusedAdam adam(params, FusedAdamOptions(1e-2));
  auto sgd_params = clone_params(params);
  FusedSGD sgd(sgd_params, FusedSGDOptions(1e-2));
  for (int step = 0; step < 4; ++step) {
    set_grads(params, step);
    set_grads(sgd_params, step);
    if (step == 2) {
      static_cast<FusedAdamOptions&>(adam.param_groups()[0].options()).amsgrad(true);
      static_cast<FusedSGDOptions&>(sgd.param_groups()[0].options()).momentum(0.9);
    }
    adam.step();
    sgd.step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& a =
        static_cast<const FusedAdamParamState&>(*adam.state().at(params[i].unsafeGetTensorImpl()));
    ASSERT_TRUE(a.max_exp_avg_sq().defined()) << i;
    EXPECT_TRUE(torch::all(a.max_exp_avg_sq() >= a.exp_avg_sq()).item<bool>()) << i;
    const auto& s = static_cast<const FusedSGDParamState&>(
        *sgd.state().at(sgd_params[i].unsafeGetTensorImpl()));
    ASSERT_TRUE(s.momentum_buffer().defined()) << i;
    EXPECT_GT(s.momentum_buffer().abs().max().item<double>(), 0.0) << i;
  }
}

// Channels-last parameters step in place, their state made in the same layout; a state
// of another layout (loaded, or made contiguous by hand) goes through a copy that is
// written back into it. Both match torch::optim.
TEST(FusedOptimizers, ChannelsLastParametersKeepTheirLayoutAndMatchTorch) {
  torch::manual_seed(4);
  const auto w = torch::randn({4, 3, 5, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  auto a = w.clone().requires_grad_(true), b = w.clone().requires_grad_(true);
  FusedAdamW fused({a}, FusedAdamWOptions(1e-2));
  torch::optim::AdamW ref({b}, torch::optim::AdamWOptions(1e-2));
  for (int i = 0; i < 6; ++i) {
    const auto g = torch::randn({4, 3, 5, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
    a.mutable_grad() = g.clone();
    b.mutable_grad() = g.clone();
    fused.step();
    ref.step();
    auto& state = static_cast<FusedAdamParamState&>(*fused.state().at(a.unsafeGetTensorImpl()));
    if (i == 0) {
      EXPECT_TRUE(state.exp_avg().is_contiguous(torch::MemoryFormat::ChannelsLast));
    }
    if (i == 2) {
      state.exp_avg_sq(state.exp_avg_sq().contiguous());  // another layout from here on
    }
    EXPECT_TRUE(torch::allclose(a, b, 1e-5, 1e-6)) << "step " << i;
  }
  EXPECT_TRUE(a.is_contiguous(torch::MemoryFormat::ChannelsLast));
  auto& state = static_cast<FusedAdamParamState&>(*fused.state().at(a.unsafeGetTensorImpl()));
  EXPECT_TRUE(state.exp_avg_sq().is_contiguous()) << "the state keeps its own layout";
}

TEST(FusedOptimizers, ClosureIsEvaluatedAndItsLossReturned) {
  auto p = make_params(torch::kFloat, 11);
  FusedSGD sgd(p, FusedSGDOptions(0.1));
  auto loss = sgd.step([&] {
    sgd.zero_grad();
    auto l = p[0].sum();
    l.backward();
    return l;
  });
  ASSERT_TRUE(loss.defined());
  EXPECT_TRUE(torch::allclose(p[0].grad(), torch::ones_like(p[0])));
}

TEST(GraphSafeMode, RefusesOptimizersThatCannotSkipOnTheDevice) {
  auto p = make_params(torch::kFloat, 12);
  torch::optim::SGD sgd(p, torch::optim::SGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().graph_safe(true));
  scale_loss(scaler);
  set_grads(p, 0);
  try {
    scaler.step(sgd);
    FAIL() << "expected c10::Error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("graph_safe"), std::string::npos);
  }
}

// However the host learns a scaler-aware step's outcome (asked during the iteration, read
// by overflowed() before the step, or at update()), the step is counted once, and the
// report of the overflowing one names the gradient.
TEST(FusedOptimizers, AScalerAwareStepIsCountedOnceWhenItsFlagWasReadBeforeTheStep) {
  for (const int asked : {0, 1, 2}) {
    SCOPED_TRACE(asked == 0   ? "overflowed() before step()"
                 : asked == 1 ? "step_skipped() before update()"
                              : "not asked");
    auto p = make_params(torch::kFloat, 17);
    FusedSGD sgd(p, FusedSGDOptions(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(8.0));
    scaler.set_parameter_name(p[1], "b");
    for (const bool overflow : {false, true}) {
      scaler.scale(torch::ones({}));
      set_grads(p, 0, 8.0);
      if (overflow) {
        p[1].mutable_grad()[0] = std::numeric_limits<float>::infinity();
      }
      if (asked == 0) {
        scaler.unscale_(sgd);
        EXPECT_EQ(scaler.overflowed(sgd), overflow);
      }
      EXPECT_TRUE(scaler.step(sgd).has_value());
      if (asked == 1) {
        EXPECT_EQ(scaler.step_skipped(sgd), overflow);
      }
      scaler.update();
      EXPECT_EQ(scaler.step_skipped(sgd), overflow);
    }
    const lucid::amp::ScalerCounters counters = scaler.counters();
    EXPECT_EQ(counters.steps_taken, 1);
    EXPECT_EQ(counters.steps_skipped, 1);
    EXPECT_EQ(counters.overflow_updates, 1);
    ASSERT_TRUE(scaler.last_overflow().has_value());
    EXPECT_EQ(scaler.last_overflow()->optimizers, 1);
    ASSERT_EQ(scaler.last_overflow()->gradients.size(), 1u);
    EXPECT_EQ(scaler.last_overflow()->gradients[0].name, "b");
  }
}

TEST(FusedOptimizers, TheOverflowReportOfAStepInspectsTheParametersThatOutliveIt) {
  // The step's outcome is read by update(), after the optimizer and three of its four
  // parameters are gone: the report lists the one left, at its own index.
  GradScaler scaler(GradScalerOptions().init_scale(8.0));
  scaler.scale(torch::ones({}));
  torch::Tensor kept;
  {
    auto p = make_params(torch::kFloat, 5);
    set_grads(p, 0, 8.0);
    p[0].mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
    p[2].mutable_grad()[0] = std::numeric_limits<float>::quiet_NaN();
    kept = p[2];
    FusedSGD sgd(p, FusedSGDOptions(0.1));
    EXPECT_TRUE(scaler.step(sgd).has_value());
  }
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  ASSERT_TRUE(scaler.last_overflow().has_value());
  EXPECT_EQ(scaler.last_overflow()->optimizers, 1);
  ASSERT_EQ(scaler.last_overflow()->gradients.size(), 1u);
  EXPECT_EQ(scaler.last_overflow()->gradients[0].index, 2u);
  EXPECT_EQ(scaler.last_overflow()->gradients[0].nan_count, 1);
}

TEST(GraphSafeMode, StepReturnsTheOptimizersValueAndSkipsOnTheDevice) {
  auto p = make_params(torch::kFloat, 13);
  FusedSGD sgd(p, FusedSGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().graph_safe(true).init_scale(8.0));
  scaler.scale(torch::ones({}));
  set_grads(p, 0, 8.0);
  p[0].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
  const auto before = p[0].detach().clone();
  EXPECT_TRUE(scaler.step(sgd).has_value());  // no host read: the caller isn't told
  EXPECT_TRUE(torch::equal(p[0].detach(), before));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
}

}  // namespace
