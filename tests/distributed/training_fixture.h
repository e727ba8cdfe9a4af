// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The training run every distributed test repeats: a small MLP, a fixed global batch per
// step, SGD with momentum (or lucid::optim::FusedAdamW), a GradScaler that grows every 2
// clean steps, optionally clip_grad_norm_ before each step, and overflows (inf or NaN)
// injected at fixed (step, rank) pairs. The worker (one process per rank) and the tests'
// single-process reference both build it from here, so that they can be compared.

#include <lucid/amp.h>
#include <lucid/optim.h>
#include <torch/torch.h>

#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lucid_test {

constexpr int kGlobalBatch = 8;  // divisible by every world size tested (1, 2, 4)
constexpr int kSteps = 8;

// Which rank owns (unscales and steps) which parameter in a sharded run.
enum class Ownership { kRoundRobin, kAllOnRankZero };

inline int owner_of(size_t param_index, int world_size, Ownership ownership) {
  return ownership == Ownership::kAllOnRankZero ? 0 : static_cast<int>(param_index % world_size);
}

// Four parameter tensors (fc1.weight, fc1.bias, fc2.weight, fc2.bias), identical in every
// process because the initialisation is seeded.
inline torch::nn::Sequential make_model() {
  torch::manual_seed(0);
  return torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
}

inline torch::optim::SGDOptions sgd_options() {
  return torch::optim::SGDOptions(0.05).momentum(0.9);
}

enum class OptimizerKind { kSgd, kFusedAdamW };

// What a run does besides the plain loop: clipping (max_norm 0: none), the optimizer, and
// the value an overflow injects. The defaults are the plain run.
struct Training {
  double max_norm = 0.0;
  double norm_type = 2.0;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  float injected = std::numeric_limits<float>::infinity();
};

// Clips hard enough that every clean step of the run is clipped (the norms are above 0.1).
constexpr double kMaxNorm = 0.1;

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(std::vector<torch::Tensor> params,
                                                               OptimizerKind kind) {
  if (kind == OptimizerKind::kFusedAdamW) {
    return std::make_unique<lucid::optim::FusedAdamW>(std::move(params),
                                                      lucid::optim::FusedAdamWOptions(1e-2));
  }
  return std::make_unique<torch::optim::SGD>(std::move(params), sgd_options());
}

inline lucid::amp::GradScalerOptions scaler_options() {
  return lucid::amp::GradScalerOptions().init_scale(1024.0).growth_interval(2);
}

// The global batch of a step: rows [rank * n, (rank + 1) * n) go to `rank` of `world`.
inline std::pair<torch::Tensor, torch::Tensor> global_batch(int step) {
  torch::manual_seed(1000 + step);
  torch::Tensor x = torch::randn({kGlobalBatch, 4});
  torch::Tensor y = torch::randn({kGlobalBatch, 1});
  return {x, y};
}

// (step, rank) pairs where that rank alone sees an inf in its gradients. The rank must own
// a gradient in a sharded run, so with every parameter on rank 0 only rank 0 overflows.
inline std::vector<std::pair<int, int>> injections(int world_size, Ownership ownership) {
  if (ownership == Ownership::kAllOnRankZero) {
    return {{2, 0}, {5, 0}};
  }
  return {{2, world_size - 1}, {5, 0}};
}

inline bool overflows_at(int step, int rank, const std::vector<std::pair<int, int>>& plan) {
  for (const auto& p : plan) {
    if (p.first == step && p.second == rank) {
      return true;
    }
  }
  return false;
}

inline torch::Tensor flat_parameters(const torch::nn::Sequential& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model->parameters()) {
    flat.push_back(p.detach().reshape({-1}));
  }
  return torch::cat(flat);
}

// What a run produced: the scale after each update, whether each step was skipped, the
// final parameters (flattened), and the norm clip_grad_norm_ returned at each step (empty
// without clipping).
struct RunRecord {
  std::vector<double> scales;
  std::vector<int64_t> skipped;
  torch::Tensor params;
  std::vector<float> norms;
};

// The single-process run on the global batch: an overflow anywhere in the plan is an
// overflow of this one process.
inline RunRecord reference_run(const std::vector<std::pair<int, int>>& plan,
                               const Training& training = {}) {
  auto model = make_model();
  auto optimizer = make_optimizer(model->parameters(), training.optimizer);
  lucid::amp::GradScaler scaler(scaler_options());
  RunRecord record;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = global_batch(step);
    optimizer->zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    for (const auto& p : plan) {
      if (p.first == step) {
        model->parameters()[0].mutable_grad()[0][0] = training.injected;
        break;
      }
    }
    if (training.max_norm > 0.0) {
      record.norms.push_back(
          scaler.clip_grad_norm_(*optimizer, training.max_norm, training.norm_type).item<float>());
    }
    scaler.step(*optimizer);
    record.skipped.push_back(scaler.step_skipped(*optimizer) ? 1 : 0);
    scaler.update();
    record.scales.push_back(scaler.get_scale());
  }
  record.params = flat_parameters(model);
  return record;
}

}  // namespace lucid_test
