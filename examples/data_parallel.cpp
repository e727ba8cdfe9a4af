// SPDX-License-Identifier: BSD-3-Clause
// Data-parallel training with N processes on one machine: every rank holds the whole
// model, trains on its slice of each global batch, all-reduces the gradients by hand
// (c10d, Gloo on loopback) and steps through a GradScaler bound to the group, so that an
// overflow on one rank makes every rank skip the step and back off together.
//
//   data_parallel --world-size 2 [--steps 12] [--inject-overflow-at 5]
//       starts the ranks itself (fork + exec of this program; they meet over a c10d
//       FileStore in a scratch directory);
//   data_parallel --rank R --world-size N --master-port P [--master-addr 127.0.0.1] ...
//       one rank per command (rank 0 serves a c10d TCPStore at the address), e.g. one
//       command per terminal or host.
//
// Rank 0 prints the loss, the scale and whether the step was taken; at the end every rank
// publishes its scale and a parameter checksum in the store and rank 0 checks they agree.
// --inject-overflow-at K puts an inf into rank 1's gradients at step K, after the gradient
// all-reduce (as if only that rank's unscaled shard overflowed).

#include <lucid/amp.h>
#include <lucid/distributed.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <vector>

// The repository's rank launcher (a fork + exec of /proc/self/exe per rank, then waitpid
// for each) and scratch directory, shared with the tests and bench_agreement.
#include "../tests/support/rank_launcher.h"
#include "../tests/support/scratch_dir.h"

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    flags[std::string(argv[i]).substr(2)] = argv[i + 1];
  }
  return flags;
}

int integer(const std::map<std::string, std::string>& flags, const std::string& name, int fallback) {
  const auto it = flags.find(name);
  return it == flags.end() ? fallback : std::stoi(it->second);
}

// Starts `world` ranks of this program (fork + exec) on a FileStore in a scratch directory
// and waits for them.
int launch(int world, char** argv, int argc) {
  const lucid_test::ScratchDir dir("lucid_dp");
  std::vector<std::vector<std::string>> args;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<std::string> a(argv + 1, argv + argc);
    a.insert(a.end(), {"--rank", std::to_string(rank), "--store-file", dir.file("store")});
    args.push_back(a);
  }
  int result = 0;
  for (const auto& exit : lucid_test::Ranks("/proc/self/exe", args).wait()) {
    if (!exit.succeeded()) {
      result = 1;
    }
  }
  return result;
}

// Sums `tensors` over the group in place, through one flat buffer.
void all_reduce_sum_(c10d::ProcessGroup& group, const std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> flat;
  for (const auto& t : tensors) {
    flat.push_back(t.reshape({-1}));
  }
  std::vector<torch::Tensor> buffer{torch::cat(flat)};
  group.allreduce(buffer)->wait();
  int64_t offset = 0;
  for (const auto& t : tensors) {
    t.copy_(buffer[0].narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

int run_rank(const std::map<std::string, std::string>& flags) {
  const int rank = integer(flags, "rank", 0);
  const int world = integer(flags, "world-size", 1);
  const int steps = integer(flags, "steps", 12);
  const int inject_at = integer(flags, "inject-overflow-at", -1);
  const auto timeout = std::chrono::seconds(30);
  const std::string addr = flags.count("master-addr") ? flags.at("master-addr") : "127.0.0.1";

  // Rendezvous: a FileStore from the launcher, or a TCPStore served by rank 0.
  auto store = flags.count("store-file")
                   ? lucid::distributed::make_file_store(flags.at("store-file"), world, timeout)
                   : lucid::distributed::make_tcp_store(
                         addr, static_cast<uint16_t>(integer(flags, "master-port", 29500)), world,
                         rank == 0, timeout);
  auto group = lucid::distributed::make_gloo_group(
      store, rank, world, lucid::distributed::GroupOptions().timeout(timeout).gloo_hostname(addr));

  torch::manual_seed(0);  // the same initial parameters on every rank
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(), torch::nn::Linear(32, 1));
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.02).momentum(0.9));
  lucid::amp::GradScaler scaler(lucid::amp::GradScalerOptions().growth_interval(4));
  lucid::distributed::bind_to_group(scaler, group,
                                    lucid::distributed::OverflowAgreementOptions().timeout(timeout));

  const torch::Tensor true_weights = torch::linspace(-1.0, 1.0, 16).view({16, 1});
  const int global_batch = 64, rows = global_batch / world;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(100 + step);  // the global batch of this step, the same on every rank
    const torch::Tensor x_all = torch::randn({global_batch, 16});
    const torch::Tensor y_all = x_all.mm(true_weights) + 0.01 * torch::randn({global_batch, 1});
    const torch::Tensor x = x_all.narrow(0, rank * rows, rows), y = y_all.narrow(0, rank * rows, rows);

    optimizer.zero_grad();
    torch::Tensor out;
    {
      lucid::amp::autocast guard(torch::kCPU);  // bfloat16 forward, float32 parameters
      out = model->forward(x);
    }
    const torch::Tensor loss = torch::mse_loss(out.to(torch::kFloat), y);
    scaler.scale(loss).backward();

    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) {
      grads.push_back(p.grad());
    }
    all_reduce_sum_(*group, grads);  // scaled gradients of the global batch ...
    for (auto& g : grads) {
      g.div_(world);  // ... averaged
    }
    if (rank == 1 % world && step == inject_at) {
      grads[0].view({-1})[0] = std::numeric_limits<float>::infinity();
    }
    const bool stepped = scaler.step(optimizer).has_value();  // all ranks decide alike
    scaler.update();
    if (rank == 0) {
      std::printf("step %2d  rank-0 loss %.6f  scale %8.0f  %s\n", step, loss.item<float>(),
                  scaler.get_scale(), stepped ? "stepped" : "skipped (overflow on some rank)");
      std::fflush(stdout);
    }
  }

  // Publish this rank's outcome; rank 0 checks that every rank ended in the same state.
  double checksum = 0.0;
  for (const auto& p : model->parameters()) {
    checksum += p.detach().to(torch::kDouble).sum().item<double>();
  }
  char line[96];
  std::snprintf(line, sizeof(line), "scale %.0f checksum %.12g", scaler.get_scale(), checksum);
  store->set("final/" + std::to_string(rank), std::vector<uint8_t>(line, line + std::strlen(line)));
  if (rank == 0) {
    for (int r = 1; r < world; ++r) {
      const auto other = store->get("final/" + std::to_string(r));
      if (std::string(other.begin(), other.end()) != line) {
        std::printf("rank %d disagrees: %s vs %s\n", r, std::string(other.begin(), other.end()).c_str(), line);
        return 1;
      }
    }
    std::printf("all %d ranks agree: %s\n", world, line);
  }
  // Leave together, so that no rank tears the group down under another.
  std::vector<torch::Tensor> done{torch::zeros({1})};
  group->allreduce(done)->wait(std::chrono::milliseconds(timeout));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto flags = parse(argc, argv);
  try {
    if (!flags.count("rank")) {
      return launch(integer(flags, "world-size", 2), argv, argc);
    }
    return run_rank(flags);
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "data_parallel: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {  // no scratch directory, no fork
    std::fprintf(stderr, "data_parallel: %s\n", e.what());
    return 1;
  }
}
