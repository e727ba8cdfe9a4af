// SPDX-License-Identifier: BSD-3-Clause
// One rank of a distributed test run: a real process, started by the tests
// (support/rank_launcher.h, which forks and calls worker_main, or execs
// lucid_distributed_worker), meeting its peers over a c10d FileStore (or TCPStore) with
// Gloo on loopback. It trains the run of training_fixture.h on its slice of the global
// batch and writes what it saw to <out>/rank<r>.pt (scales, skipped steps, final
// parameters, all-reduce count, the norms clip_grad_norm_ returned). When the agreement
// fails it writes the error to <out>/rank<r>.err and exits with kAgreementError.
//
// Flags (all "--name value"): rank, world-size, out, store (FileStore path) or tcp-port,
// sharded (0/1), ownership (roundrobin|rank0), bind (0/1: scaler bound to the group),
// graph-safe (0/1), sharded-agreement (0/1: OverflowAgreementOptions::sharded),
// timeout-ms (agreement), group-timeout-ms, victim, die-at, stall-at; and the Training of
// training_fixture.h: clip-norm (max_norm, 0: no clipping), norm-type, optimizer
// (sgd|adamw), inject (inf|nan).

#include <lucid/distributed.h>

#include "training_fixture.h"
#include "worker.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <unistd.h>

namespace lucid_test {
namespace {

using lucid_test::Ownership;

struct Flags {
  std::map<std::string, std::string> values;
  std::string get(const std::string& name, const std::string& fallback = "") const {
    const auto it = values.find(name);
    return it == values.end() ? fallback : it->second;
  }
  int integer(const std::string& name, int fallback) const {
    const std::string v = get(name);
    return v.empty() ? fallback : std::stoi(v);
  }
};

Flags parse(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string name = argv[i];
    if (name.rfind("--", 0) == 0) {
      flags.values[name.substr(2)] = argv[i + 1];
    }
  }
  return flags;
}

// Sums `tensors` in place over the group, with one flat all-reduce.
void sum_(const c10::intrusive_ptr<c10d::ProcessGroup>& group, std::vector<torch::Tensor> tensors) {
  std::vector<torch::Tensor> flat{torch::cat([&] {
    std::vector<torch::Tensor> parts;
    for (const auto& t : tensors) {
      parts.push_back(t.reshape({-1}));
    }
    return parts;
  }())};
  group->allreduce(flat)->wait();
  int64_t offset = 0;
  for (auto& t : tensors) {
    t.copy_(flat[0].narrow(0, offset, t.numel()).view_as(t));
    offset += t.numel();
  }
}

bool any_error_reported(const std::string& out) {
  for (const auto& entry : std::filesystem::directory_iterator(out)) {
    if (entry.path().extension() == ".err") {
      return true;
    }
  }
  return false;
}

int run(const Flags& flags) {
  const int rank = flags.integer("rank", 0);
  const int world = flags.integer("world-size", 1);
  const std::string out = flags.get("out");
  const bool sharded = flags.integer("sharded", 0) != 0;
  const Ownership ownership =
      flags.get("ownership", "roundrobin") == "rank0" ? Ownership::kAllOnRankZero : Ownership::kRoundRobin;
  const int victim = flags.integer("victim", -1);
  const int die_at = flags.integer("die-at", -1);
  const int stall_at = flags.integer("stall-at", -1);
  const auto group_timeout = std::chrono::milliseconds(flags.integer("group-timeout-ms", 10000));

  const int tcp_port = flags.integer("tcp-port", 0);
  auto store = tcp_port > 0 ? lucid::distributed::make_tcp_store("127.0.0.1", static_cast<uint16_t>(tcp_port),
                                                                 world, rank == 0, group_timeout)
                            : lucid::distributed::make_file_store(flags.get("store"), world, group_timeout);
  auto group = lucid::distributed::make_gloo_group(
      store, rank, world,
      lucid::distributed::GroupOptions().timeout(group_timeout).gloo_hostname("127.0.0.1"));

  auto model = lucid_test::make_model();
  const std::vector<torch::Tensor> params = model->parameters();
  std::vector<torch::Tensor> owned;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!sharded || lucid_test::owner_of(i, world, ownership) == rank) {
      owned.push_back(params[i]);
    }
  }
  lucid_test::Training training;
  training.max_norm = std::stod(flags.get("clip-norm", "0"));
  training.norm_type = std::stod(flags.get("norm-type", "2"));
  training.optimizer = flags.get("optimizer", "sgd") == "adamw"
                           ? lucid_test::OptimizerKind::kFusedAdamW
                           : lucid_test::OptimizerKind::kSgd;
  if (flags.get("inject", "inf") == "nan") {
    training.injected = std::numeric_limits<float>::quiet_NaN();
  }
  auto optimizer = lucid_test::make_optimizer(owned, training.optimizer);
  lucid::amp::GradScaler scaler(lucid_test::scaler_options());
  std::shared_ptr<lucid::distributed::OverflowAgreement> agreement;
  if (flags.integer("bind", 1) != 0) {
    agreement = lucid::distributed::bind_to_group(
        scaler, group,
        lucid::distributed::OverflowAgreementOptions()
            .timeout(std::chrono::milliseconds(flags.integer("timeout-ms", 10000)))
            .graph_safe(flags.integer("graph-safe", 0) != 0)
            .sharded(flags.integer("sharded-agreement", 0) != 0));
  }
  const auto plan = lucid_test::injections(world, ownership);
  const int rows = lucid_test::kGlobalBatch / world;

  lucid_test::RunRecord record;
  for (int step = 0; step < lucid_test::kSteps; ++step) {
    auto [x, y] = lucid_test::global_batch(step);
    x = x.narrow(0, rank * rows, rows);
    y = y.narrow(0, rank * rows, rows);
    model->zero_grad();
    scaler.scale(torch::mse_loss(model->forward(x), y)).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : params) {
      grads.push_back(p.grad());
    }
    sum_(group, grads);  // data parallel: the mean gradient of the global batch
    for (auto& g : grads) {
      g.div_(world);
    }
    if (sharded) {
      for (size_t i = 0; i < params.size(); ++i) {
        if (lucid_test::owner_of(i, world, ownership) != rank) {
          params[i].mutable_grad() = torch::Tensor();  // ZeRO: keep only the owned shard
        }
      }
    }
    if (lucid_test::overflows_at(step, rank, plan)) {  // this rank alone overflows
      owned.front().mutable_grad().view({-1})[0] = training.injected;
    }
    if (rank == victim && step == die_at) {
      _exit(3);  // dies between backward and step, without a word to its peers
    }
    if (rank == victim && step == stall_at) {
      // Alive, but never steps: waits (at most 30 s) until a peer has reported its error.
      for (int i = 0; i < 3000 && !any_error_reported(out); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      return kStalled;
    }
    const auto before = std::chrono::steady_clock::now();
    try {
      if (training.max_norm > 0.0) {
        record.norms.push_back(
            scaler.clip_grad_norm_(*optimizer, training.max_norm, training.norm_type)
                .item<float>());
      }
      scaler.step(*optimizer);
      record.skipped.push_back(scaler.step_skipped(*optimizer) ? 1 : 0);
    } catch (const c10::Error& e) {
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
      std::ofstream(out + "/rank" + std::to_string(rank) + ".err")
          << waited << "\n" << e.what_without_backtrace() << "\n";
      return kAgreementError;
    }
    scaler.update();
    record.scales.push_back(scaler.get_scale());
    if (sharded) {
      // Re-assemble the full parameters: each owner contributes its shard, zeros elsewhere.
      std::vector<torch::Tensor> contributions;
      for (size_t i = 0; i < params.size(); ++i) {
        contributions.push_back(lucid_test::owner_of(i, world, ownership) == rank
                                    ? params[i].detach().clone()
                                    : torch::zeros_like(params[i]));
      }
      sum_(group, contributions);  // x + 0 + ... + 0: exact
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].copy_(contributions[i]);
      }
    }
  }
  const int64_t all_reduces = agreement ? agreement->all_reduces() : 0;
  torch::save(std::vector<torch::Tensor>{torch::tensor(record.scales, torch::kDouble),
                                         torch::tensor(record.skipped, torch::kLong),
                                         lucid_test::flat_parameters(model),
                                         torch::tensor(all_reduces, torch::kLong),
                                         torch::tensor(record.norms, torch::kFloat)},
              out + "/rank" + std::to_string(rank) + ".pt");
  return 0;
}

}  // namespace

int worker_main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "worker: %s\n", e.what_without_backtrace());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker: %s\n", e.what());
    return 2;
  }
}

}  // namespace lucid_test
