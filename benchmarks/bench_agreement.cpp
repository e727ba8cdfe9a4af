// SPDX-License-Identifier: BSD-3-Clause
// What the overflow agreement costs per step, measured in one run beside references:
//   raw      a bare c10d all-reduce (MAX) of one float32 and its wait: the floor
//   agree    OverflowAgreement::agree_ on the same flag (blocking mode)
//   graph    agree_ in graph-safe mode (CUDA only): host time to enqueue, and device time
//            per agreement over a batch of them
//   step     a 1-float all-reduce (where a data-parallel step reduces its gradients),
//            then GradScaler step (unscale, check, optimizer.step) + update of a model's
//            gradients, bound to the group vs not: the difference is the agreement's
//            share of a real step
//   grads    (context) the gradient all-reduce a data-parallel step already pays
// Medians of per-iteration times, in microseconds, printed by rank 0.
//
// Usage:
//   bench_agreement gloo [world_size=2] [iters=2000]   CPU, Gloo on loopback; starts the
//                                                       ranks itself (fork + exec)
//   bench_agreement nccl [iters=5000]                  one process, one GPU, NCCL

#include <lucid/amp.h>
#include <lucid/distributed.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "../tests/support/rank_launcher.h"
#include "../tests/support/scratch_dir.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time of fn in microseconds; `sync` runs after each call, inside the timing.
double time_us(int iters, const std::function<void()>& fn, const std::function<void()>& sync = [] {}) {
  for (int i = 0; i < std::max(10, iters / 20); ++i) {
    fn();
  }
  sync();
  std::vector<double> times;
  times.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    fn();
    sync();
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median(times);
}

struct Bench {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  torch::Device device;
  int iters;
  int rank;
  std::function<void()> sync;  // device sync (CUDA) or nothing
};

void print(int rank, const char* what, double us, const char* note = "") {
  if (rank == 0) {
    std::printf("  %-34s %10.2f us  %s\n", what, us, note);
    std::fflush(stdout);
  }
}

void run(Bench& b) {
  const auto timeout = std::chrono::seconds(60);
  torch::Tensor flag = torch::zeros({}, torch::TensorOptions().device(b.device));
  std::vector<torch::Tensor> raw{flag.view({1})};
  c10d::AllreduceOptions max_opts;
  max_opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
  print(b.rank, "raw all-reduce MAX, 1 float", time_us(b.iters, [&] {
          b.group->allreduce(raw, max_opts)->wait(std::chrono::milliseconds(timeout));
        }, b.sync));

  lucid::distributed::OverflowAgreement blocking(
      b.group, lucid::distributed::OverflowAgreementOptions().timeout(timeout));
  print(b.rank, "agree_ (blocking)", time_us(b.iters, [&] { blocking.agree_(flag); }, b.sync));

  if (b.device.is_cuda()) {
    lucid::distributed::OverflowAgreement graph_safe(
        b.group, lucid::distributed::OverflowAgreementOptions().timeout(timeout).graph_safe(true));
    print(b.rank, "agree_ (graph-safe), host enqueue", time_us(b.iters, [&] { graph_safe.agree_(flag); }),
          "no host wait");
    const int batch = 100;
    print(b.rank, "agree_ (graph-safe), per agreement",
          time_us(std::max(10, b.iters / batch), [&] {
            for (int i = 0; i < batch; ++i) {
              graph_safe.agree_(flag);
            }
          }, b.sync) / batch,
          "100 back to back, then one sync");
  }

  // A scaler step over a model's gradients (scale 1, so values stay put), bound or not.
  const int64_t params = b.device.is_cuda() ? (int64_t{16} << 20) : (int64_t{1} << 20);
  std::vector<torch::Tensor> weights;
  for (int64_t placed = 0; placed < params; placed += 1 << 18) {
    weights.push_back(torch::zeros({1 << 18}, torch::TensorOptions().device(b.device).requires_grad(true)));
    weights.back().mutable_grad() = torch::randn({1 << 18}, torch::TensorOptions().device(b.device));
  }
  torch::optim::SGD optimizer(weights, torch::optim::SGDOptions(0.0));
  const auto options = lucid::amp::GradScalerOptions().init_scale(1.0).growth_interval(1 << 30);
  lucid::amp::GradScaler unbound_scaler(options), bound_scaler(options);
  lucid::distributed::bind_to_group(bound_scaler, b.group,
                                    lucid::distributed::OverflowAgreementOptions().timeout(timeout));
  unbound_scaler.scale(flag);
  bound_scaler.scale(flag);
  std::vector<torch::Tensor> line_up{torch::zeros({1}, torch::TensorOptions().device(b.device))};
  // As in a data-parallel step, the ranks meet just before the step (there: the gradient
  // all-reduce; here a 1-float one), so that the agreement does not also absorb the skew
  // the previous iteration left between them. Both variants pay for the line-up, and
  // they alternate iteration by iteration, so that a change in machine load hits both.
  std::vector<double> unbound_times, bound_times;
  const int step_iters = std::max(50, b.iters / 10);
  for (int i = 0; i < step_iters + 10; ++i) {
    for (bool bound : {false, true}) {
      lucid::amp::GradScaler& scaler = bound ? bound_scaler : unbound_scaler;
      const auto t0 = Clock::now();
      b.group->allreduce(line_up)->wait(std::chrono::milliseconds(timeout));
      scaler.step(optimizer);
      scaler.update();
      b.sync();
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      if (i >= 10) {  // warm-up
        (bound ? bound_times : unbound_times).push_back(us);
      }
    }
  }
  const double unbound = median(unbound_times), bound = median(bound_times);
  char label[64];
  std::snprintf(label, sizeof(label), "line-up + step, %lldM params, unbound", static_cast<long long>(params >> 20));
  print(b.rank, label, unbound);
  std::snprintf(label, sizeof(label), "line-up + step, %lldM params, bound", static_cast<long long>(params >> 20));
  print(b.rank, label, bound);
  print(b.rank, "  difference", bound - unbound, "the agreement inside a step");

  std::vector<torch::Tensor> grads{torch::randn({params}, torch::TensorOptions().device(b.device))};
  std::snprintf(label, sizeof(label), "(context) grad all-reduce, %lldM fp32", static_cast<long long>(params >> 20));
  print(b.rank, label, time_us(std::max(20, b.iters / 50), [&] {
          b.group->allreduce(grads)->wait(std::chrono::milliseconds(timeout));
        }, b.sync));
}

int gloo_rank(int rank, int world, int iters, const std::string& store_path) {
  const auto timeout = std::chrono::seconds(60);
  auto store = lucid::distributed::make_file_store(store_path, world, timeout);
  Bench b{lucid::distributed::make_gloo_group(
              store, rank, world, lucid::distributed::GroupOptions().timeout(timeout).gloo_hostname("127.0.0.1")),
          torch::Device(torch::kCPU), iters, rank, [] {}};
  if (rank == 0) {
    std::printf("Gloo, %d processes on loopback, CPU flag, %d iterations (torch threads: %d)\n", world,
                iters, at::get_num_threads());
  }
  run(b);
  std::vector<torch::Tensor> done{torch::zeros({1})};
  b.group->allreduce(done)->wait(std::chrono::milliseconds(timeout));
  return 0;
}

// Each rank is this program again (fork + exec), in gloo-rank mode.
int gloo(int world, int iters) {
  const lucid_test::ScratchDir dir("lucid_bench");
  std::vector<std::vector<std::string>> args;
  for (int rank = 0; rank < world; ++rank) {
    args.push_back({"gloo-rank", std::to_string(rank), std::to_string(world), std::to_string(iters),
                    dir.file("store")});
  }
  int result = 0;
  for (const auto& exit : lucid_test::Ranks("/proc/self/exe", args).wait()) {
    result |= !exit.succeeded();
  }
  return result;
}

int nccl(int iters) {
  if (!lucid::distributed::has_nccl() || !torch::cuda::is_available()) {
    std::printf("nccl: this build has no NCCL path or there is no GPU\n");
    return 2;
  }
  // Declared first, so that the group and its store go before their file: removing the
  // file while the group was alive crashed at exit on the H200.
  const lucid_test::ScratchDir dir("lucid_bench");
  const auto timeout = std::chrono::seconds(60);
  auto store = lucid::distributed::make_file_store(dir.file("store"), 1, timeout);
  Bench b{lucid::distributed::make_nccl_group(store, 0, 1, lucid::distributed::GroupOptions().timeout(timeout)),
          torch::Device(torch::kCUDA, 0), iters, 0, [] { torch::cuda::synchronize(); }};
  std::printf("NCCL, 1 process, CUDA flag, %d iterations\n", iters);
  run(b);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "gloo";
  try {
    if (mode == "gloo-rank" && argc == 6) {
      return gloo_rank(std::stoi(argv[2]), std::stoi(argv[3]), std::stoi(argv[4]), argv[5]);
    }
    if (mode == "gloo") {
      return gloo(argc > 2 ? std::stoi(argv[2]) : 2, argc > 3 ? std::stoi(argv[3]) : 2000);
    }
    if (mode == "nccl") {
      return nccl(argc > 2 ? std::stoi(argv[2]) : 5000);
    }
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "bench_agreement: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {  // no scratch directory, no fork
    std::fprintf(stderr, "bench_agreement: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: bench_agreement gloo [world_size] [iters] | nccl [iters]\n");
  return 2;
}
