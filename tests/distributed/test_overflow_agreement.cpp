// SPDX-License-Identifier: BSD-3-Clause
// lucid::distributed: ranks of a c10d group agree on overflow. Each multi-rank test starts
// real processes (worker.cpp, fork + exec) that meet over a FileStore in a scratch
// directory, or a TCPStore on loopback, with Gloo; they are compared with each other and
// with the single-process run of training_fixture.h on the same global batch.

#include <gtest/gtest.h>

#include <lucid/distributed.h>

#include "../support/expect_throws.h"
#include "../support/rank_launcher.h"
#include "../support/scratch_dir.h"
#include "training_fixture.h"
#include "worker.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace {

using lucid_test::Ownership;
using lucid_test::RankExit;
using lucid_test::RunRecord;

using lucid_test::kAgreementError;

using lucid_test::ScratchDir;

struct RunConfig {
  int world = 2;
  bool sharded = false;
  Ownership ownership = Ownership::kRoundRobin;
  bool bind = true;
  bool graph_safe = false;
  bool tcp = false;
  int timeout_ms = 10000;
  int group_timeout_ms = 10000;
  int victim = -1;
  int die_at = -1;
  int stall_at = -1;
  bool sharded_agreement = false;  // OverflowAgreementOptions::sharded
  lucid_test::Training training;
};

// A double as a flag value, exactly ("inf" for infinity).
std::string flag_value(double value) {
  std::ostringstream os;
  os << std::setprecision(17) << value;
  return os.str();
}

// A port nothing listens on right now (bound, read back, released).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class RanksRun {
 public:
  explicit RanksRun(const RunConfig& config, double deadline_s = 45.0) : config_(config) {
    const int port = config.tcp ? free_port() : 0;
    std::vector<std::vector<std::string>> args;
    for (int rank = 0; rank < config.world; ++rank) {
      std::vector<std::string> a = {
          "--rank",
          std::to_string(rank),
          "--world-size",
          std::to_string(config.world),
          "--out",
          dir_.path().string(),
          "--sharded",
          config.sharded ? "1" : "0",
          "--ownership",
          config.ownership == Ownership::kAllOnRankZero ? "rank0" : "roundrobin",
          "--bind",
          config.bind ? "1" : "0",
          "--graph-safe",
          config.graph_safe ? "1" : "0",
          "--timeout-ms",
          std::to_string(config.timeout_ms),
          "--group-timeout-ms",
          std::to_string(config.group_timeout_ms),
          "--victim",
          std::to_string(config.victim),
          "--die-at",
          std::to_string(config.die_at),
          "--stall-at",
          std::to_string(config.stall_at)};
      const lucid_test::Training& training = config.training;
      const bool adamw = training.optimizer == lucid_test::OptimizerKind::kFusedAdamW;
      a.insert(a.end(), {"--sharded-agreement", config.sharded_agreement ? "1" : "0"});
      a.insert(a.end(), {"--clip-norm", flag_value(training.max_norm)});
      a.insert(a.end(), {"--norm-type", flag_value(training.norm_type)});
      a.insert(a.end(), {"--optimizer", adamw ? "adamw" : "sgd"});
      a.insert(a.end(), {"--inject", std::isnan(training.injected) ? "nan" : "inf"});
      if (config.tcp) {
        a.insert(a.end(), {"--tcp-port", std::to_string(port)});
      } else {
        a.insert(a.end(), {"--store", (dir_.path() / "store").string()});
      }
      args.push_back(a);
    }
    lucid_test::Ranks ranks(LUCID_DISTRIBUTED_WORKER, args, lucid_test::worker_main);
    exits_ = ranks.wait(deadline_s);
  }

  const std::vector<RankExit>& exits() const { return exits_; }

  RunRecord record(int rank) const {
    std::vector<torch::Tensor> saved;
    torch::load(saved, (dir_.path() / ("rank" + std::to_string(rank) + ".pt")).string());
    RunRecord r;
    const auto scales = saved.at(0).contiguous();
    const auto skipped = saved.at(1).contiguous();
    r.scales.assign(scales.data_ptr<double>(), scales.data_ptr<double>() + scales.numel());
    r.skipped.assign(skipped.data_ptr<int64_t>(), skipped.data_ptr<int64_t>() + skipped.numel());
    r.params = saved.at(2);
    all_reduces_ = saved.at(3).item<int64_t>();
    const auto norms = saved.at(4).contiguous();
    r.norms.assign(norms.data_ptr<float>(), norms.data_ptr<float>() + norms.numel());
    return r;
  }
  int64_t last_all_reduces() const { return all_reduces_; }

  // The first line of <out>/rank<r>.err is the seconds step() waited, the rest the message.
  std::pair<double, std::string> error(int rank) const {
    std::ifstream in(dir_.path() / ("rank" + std::to_string(rank) + ".err"));
    double waited = -1.0;
    in >> waited;
    std::stringstream rest;
    rest << in.rdbuf();
    return {waited, rest.str()};
  }

  std::string describe() const {
    std::ostringstream os;
    for (size_t i = 0; i < exits_.size(); ++i) {
      os << "rank " << i << ": exited " << exits_[i].exited << " code " << exits_[i].code
         << " signal " << exits_[i].signal << " killed " << exits_[i].killed_at_deadline
         << " after " << exits_[i].seconds << " s\n";
    }
    return os.str();
  }

 private:
  RunConfig config_;
  ScratchDir dir_{"lucid_dist"};
  std::vector<RankExit> exits_;
  mutable int64_t all_reduces_ = 0;
};

void expect_all_succeeded(const RanksRun& run) {
  for (const auto& e : run.exits()) {
    ASSERT_TRUE(e.succeeded()) << run.describe();
  }
}

// The skip and scale schedule every rank must follow (the injected overflows are at steps 2
// and 5; growth every 2 clean updates from 1024).
const std::vector<int64_t> kExpectedSkips = {0, 0, 1, 0, 0, 1, 0, 0};
const std::vector<double> kExpectedScales = {1024, 2048, 1024, 1024, 2048, 1024, 1024, 2048};

void expect_close_to(const torch::Tensor& params, const torch::Tensor& reference) {
  EXPECT_TRUE(torch::allclose(params, reference, /*rtol=*/1e-5, /*atol=*/1e-6))
      << "max |diff| " << (params - reference).abs().max().item<float>();
}

class DataParallel : public ::testing::TestWithParam<int> {};

TEST_P(DataParallel, OverflowOnOneRankMakesEveryRankSkipAndBackOff) {
  RunConfig config;
  config.world = GetParam();
  RanksRun run(config);
  expect_all_succeeded(run);
  for (int rank = 0; rank < config.world; ++rank) {
    const RunRecord r = run.record(rank);
    EXPECT_EQ(r.skipped, kExpectedSkips) << "rank " << rank;
    EXPECT_EQ(r.scales, kExpectedScales) << "rank " << rank;
    EXPECT_EQ(run.last_all_reduces(), lucid_test::kSteps) << "one agreement all-reduce per step";
  }
}

TEST_P(DataParallel, ParametersEqualASingleProcessRunOnTheGlobalBatch) {
  RunConfig config;
  config.world = GetParam();
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord reference =
      lucid_test::reference_run(lucid_test::injections(config.world, config.ownership));
  ASSERT_EQ(reference.skipped, kExpectedSkips);
  const RunRecord first = run.record(0);
  expect_close_to(first.params, reference.params);
  for (int rank = 1; rank < config.world; ++rank) {
    EXPECT_TRUE(torch::equal(run.record(rank).params, first.params))
        << "rank " << rank << " drifted from rank 0";
  }
  // The comparison can tell: a run that did not skip the overflowed steps ends elsewhere.
  const RunRecord unskipped = lucid_test::reference_run({});
  EXPECT_FALSE(torch::allclose(unskipped.params, reference.params, 1e-3, 1e-4));
}

INSTANTIATE_TEST_SUITE_P(Gloo, DataParallel, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

class Sharded : public ::testing::TestWithParam<int> {};

// ZeRO style: each rank unscales and steps only the parameters it owns (half of them with
// 2 ranks, a quarter with 4); the overflow is in one rank's shard only.
TEST_P(Sharded, OverflowInOneShardMakesEveryRankSkipAndMatchesOneProcess) {
  RunConfig config;
  config.world = GetParam();
  config.sharded = true;
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord reference =
      lucid_test::reference_run(lucid_test::injections(config.world, config.ownership));
  for (int rank = 0; rank < config.world; ++rank) {
    const RunRecord r = run.record(rank);
    EXPECT_EQ(r.skipped, kExpectedSkips) << "rank " << rank;
    EXPECT_EQ(r.scales, kExpectedScales) << "rank " << rank;
    expect_close_to(r.params, reference.params);
  }
}

INSTANTIATE_TEST_SUITE_P(Gloo, Sharded, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(ShardedGloo, RankThatOwnsNoParametersStillSkipsAndBacksOff) {
  RunConfig config;
  config.world = 2;
  config.sharded = true;
  config.ownership = Ownership::kAllOnRankZero;
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord idle = run.record(1);
  EXPECT_EQ(idle.skipped, kExpectedSkips);
  EXPECT_EQ(idle.scales, kExpectedScales);
  EXPECT_EQ(run.last_all_reduces(), lucid_test::kSteps);
  expect_close_to(idle.params,
                  lucid_test::reference_run(lucid_test::injections(2, config.ownership)).params);
}

// The control: without the agreement the same sharded run drifts apart, which is what the
// tests above would catch.
TEST(ShardedGloo, WithoutTheAgreementRanksDriftApart) {
  RunConfig config;
  config.world = 2;
  config.sharded = true;
  config.bind = false;
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord r0 = run.record(0), r1 = run.record(1);
  EXPECT_NE(r0.scales, r1.scales);
  EXPECT_NE(r0.skipped, r1.skipped);
  EXPECT_FALSE(torch::allclose(
      r0.params, lucid_test::reference_run(lucid_test::injections(2, config.ownership)).params,
      1e-5, 1e-6));
}

// ---- Clipping by the global norm in sharded runs ---------------------------------------

constexpr double kInf = std::numeric_limits<double>::infinity();

torch::Tensor as_tensor(const std::vector<float>& values) {
  return torch::tensor(values, torch::kFloat);
}

// Norms equal within float32 rounding; inf equals inf, NaN equals NaN.
void expect_norms_close(const std::vector<float>& norms, const std::vector<float>& reference) {
  ASSERT_EQ(norms.size(), reference.size());
  EXPECT_TRUE(torch::allclose(as_tensor(norms), as_tensor(reference), /*rtol=*/1e-5, /*atol=*/0.0,
                              /*equal_nan=*/true))
      << "norms " << (as_tensor(norms) - as_tensor(reference)) / as_tensor(reference)
      << " (relative difference)";
}

struct ClipCase {
  const char* name;
  lucid_test::OptimizerKind optimizer;
  double norm_type;
};

void PrintTo(const ClipCase& clip, std::ostream* os) { *os << clip.name; }

class ShardedClip : public ::testing::TestWithParam<std::tuple<int, ClipCase>> {};

// Each rank owns a shard of the parameters, clips it with the scaler bound in sharded
// mode, and steps it: the norms, the skipped steps and the final parameters equal one
// process clipping all the parameters, with one all-reduce per clip_grad_norm_ (step
// agrees nothing more after it).
TEST_P(ShardedClip, ClipsByTheGlobalNormLikeOneProcessWithOneAllReducePerCall) {
  const auto [world, clip] = GetParam();
  RunConfig config;
  config.world = world;
  config.sharded = true;
  config.sharded_agreement = true;
  config.training.max_norm = lucid_test::kMaxNorm;
  config.training.norm_type = clip.norm_type;
  config.training.optimizer = clip.optimizer;
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord reference =
      lucid_test::reference_run(lucid_test::injections(world, config.ownership), config.training);
  ASSERT_EQ(reference.skipped, kExpectedSkips);
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const RunRecord r = run.record(rank);
    expect_norms_close(r.norms, reference.norms);
    EXPECT_EQ(r.skipped, kExpectedSkips);
    EXPECT_EQ(r.scales, kExpectedScales);
    expect_close_to(r.params, reference.params);
    EXPECT_EQ(run.last_all_reduces(), lucid_test::kSteps) << "one all-reduce per clip_grad_norm_";
  }
  for (size_t step = 0; step < reference.norms.size(); ++step) {
    if (kExpectedSkips[step] == 0) {
      EXPECT_GT(reference.norms[step], lucid_test::kMaxNorm) << "step " << step << " is clipped";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gloo, ShardedClip,
    ::testing::Combine(
        ::testing::Values(2, 4),
        ::testing::Values(ClipCase{"Sgd2", lucid_test::OptimizerKind::kSgd, 2.0},
                          ClipCase{"FusedAdamW2", lucid_test::OptimizerKind::kFusedAdamW, 2.0},
                          ClipCase{"SgdInf", lucid_test::OptimizerKind::kSgd, kInf},
                          ClipCase{"FusedAdamW3", lucid_test::OptimizerKind::kFusedAdamW, 3.0})),
    [](const auto& info) {
      return std::to_string(std::get<0>(info.param)) + "ranks" + std::get<1>(info.param).name;
    });

class ShardedClipNaN : public ::testing::TestWithParam<double> {};

// A NaN in one rank's shard: every rank skips, and returns NaN as one process would, for
// a summed partial (2) and for a maximum (inf), which a backend's MAX could lose.
TEST_P(ShardedClipNaN, ANaNInOneShardMakesEveryRankSkipAndReturnNaN) {
  RunConfig config;
  config.world = 4;
  config.sharded = true;
  config.sharded_agreement = true;
  config.training.max_norm = lucid_test::kMaxNorm;
  config.training.norm_type = GetParam();
  config.training.injected = std::numeric_limits<float>::quiet_NaN();
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord reference =
      lucid_test::reference_run(lucid_test::injections(4, config.ownership), config.training);
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const RunRecord r = run.record(rank);
    ASSERT_EQ(r.norms.size(), static_cast<size_t>(lucid_test::kSteps));
    EXPECT_TRUE(std::isnan(r.norms[2]) && std::isnan(r.norms[5])) << as_tensor(r.norms);
    expect_norms_close(r.norms, reference.norms);
    EXPECT_EQ(r.skipped, kExpectedSkips);
    EXPECT_EQ(r.scales, kExpectedScales);
    expect_close_to(r.params, reference.params);
  }
}

INSTANTIATE_TEST_SUITE_P(Gloo, ShardedClipNaN, ::testing::Values(2.0, kInf), [](const auto& info) {
  return std::isinf(info.param) ? std::string("NormInf") : std::string("Norm2");
});

// The default (data parallel) agreement keeps each rank's own norm. With every parameter
// on every rank that is the global norm already (but for an overflow one rank alone saw);
// with the parameters sharded it is the shard's, which is why sharded runs opt in (and
// what the tests above would catch).
TEST(ShardedClipGloo, DataParallelRunsKeepTheirOwnNormAndOneAllReducePerStep) {
  RunConfig config;
  config.training.max_norm = lucid_test::kMaxNorm;
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord reference =
      lucid_test::reference_run(lucid_test::injections(2, config.ownership), config.training);
  const auto plan = lucid_test::injections(2, config.ownership);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const RunRecord r = run.record(rank);
    ASSERT_EQ(r.norms.size(), static_cast<size_t>(lucid_test::kSteps));
    for (int step = 0; step < lucid_test::kSteps; ++step) {
      if (lucid_test::overflows_at(step, rank, plan)) {
        EXPECT_TRUE(std::isinf(r.norms[step])) << "step " << step;
      } else if (kExpectedSkips[step] != 0) {
        // A peer overflowed after the gradient all-reduce: this rank's own norm is finite.
        EXPECT_TRUE(std::isfinite(r.norms[step])) << "step " << step;
      } else {
        EXPECT_NEAR(r.norms[step], reference.norms[step], 1e-5 * reference.norms[step])
            << "step " << step;
      }
    }
    EXPECT_EQ(r.skipped, kExpectedSkips);
    expect_close_to(r.params, reference.params);
    EXPECT_EQ(run.last_all_reduces(), lucid_test::kSteps);
  }
}

TEST(ShardedClipGloo, WithoutShardedModeEachRankClipsByItsShardsNorm) {
  RunConfig config;
  config.sharded = true;
  config.training.max_norm = lucid_test::kMaxNorm;
  RanksRun run(config);
  expect_all_succeeded(run);
  const RunRecord reference =
      lucid_test::reference_run(lucid_test::injections(2, config.ownership), config.training);
  const RunRecord r0 = run.record(0), r1 = run.record(1);
  EXPECT_EQ(run.last_all_reduces(), lucid_test::kSteps);
  // Step 0 starts from the same parameters: the shards' norms are the parts of the global one.
  EXPECT_LT(r0.norms[0], reference.norms[0]);
  EXPECT_LT(r1.norms[0], reference.norms[0]);
  EXPECT_NEAR(std::hypot(r0.norms[0], r1.norms[0]), reference.norms[0], 1e-5 * reference.norms[0]);
  EXPECT_EQ(r0.skipped, kExpectedSkips);  // the flags are still agreed
  EXPECT_FALSE(torch::allclose(r0.params, reference.params, 1e-5, 1e-6));
}

TEST(DataParallelGloo, GraphSafeModeTakesTheSameDecisions) {
  RunConfig config;
  config.graph_safe = true;
  RanksRun run(config);
  expect_all_succeeded(run);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(run.record(rank).skipped, kExpectedSkips);
    EXPECT_EQ(run.record(rank).scales, kExpectedScales);
  }
}

TEST(DataParallelGloo, RendezvousOverATcpStoreOnLoopback) {
  RunConfig config;
  config.tcp = true;
  RanksRun run(config);
  expect_all_succeeded(run);
  EXPECT_EQ(run.record(1).scales, kExpectedScales);
}

class RankFailure : public ::testing::TestWithParam<int> {};

// A rank dies between backward and step: every surviving rank's step() throws a c10::Error
// that names it, well within the timeout, and the process ends.
TEST_P(RankFailure, ADeadRankEndsEveryPeerWithAClearErrorWithinTheTimeout) {
  RunConfig config;
  config.world = GetParam();
  config.victim = config.world - 1;
  config.die_at = 3;
  config.timeout_ms = 3000;
  config.group_timeout_ms = 5000;
  RanksRun run(config, /*deadline_s=*/30.0);
  const auto& exits = run.exits();
  EXPECT_EQ(exits[config.victim].code, 3) << run.describe();
  for (int rank = 0; rank < config.world - 1; ++rank) {
    ASSERT_TRUE(exits[rank].exited && exits[rank].code == kAgreementError) << run.describe();
    const auto [waited, message] = run.error(rank);
    EXPECT_LT(waited, 3.0 + 1.0) << message;
    EXPECT_NE(message.find("rank " + std::to_string(rank) + " of " + std::to_string(config.world)),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("overflow agreement all-reduce #4"), std::string::npos) << message;
    EXPECT_NE(message.find("a peer rank may have died"), std::string::npos) << message;
    EXPECT_LT(exits[rank].seconds, 25.0) << run.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Gloo, RankFailure, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// A rank that stays alive but never calls step(): its peer times out after `timeout`.
TEST(RankFailureGloo, ARankThatStopsSteppingTimesOutItsPeerWithAClearError) {
  RunConfig config;
  config.victim = 1;
  config.stall_at = 2;
  config.timeout_ms = 1500;
  config.group_timeout_ms = 4000;
  RanksRun run(config, /*deadline_s=*/30.0);
  const RankExit& peer = run.exits()[0];
  ASSERT_TRUE(peer.exited && peer.code == kAgreementError) << run.describe();
  const auto [waited, message] = run.error(0);
  EXPECT_GE(waited, 1.4) << message;
  EXPECT_LT(waited, 1.5 + 1.5) << message;
  EXPECT_NE(message.find("rank 0 of 2: overflow agreement all-reduce #3 timed out after"),
            std::string::npos)
      << message;
  // The process itself ends once Gloo's own timeout (the group's) releases its worker.
  EXPECT_LT(peer.seconds, 4.0 + 8.0) << run.describe();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(StoreFailure, AnUnreachableTcpStoreFailsWithinTheTimeout) {
  const int port = free_port();
  const auto start = std::chrono::steady_clock::now();
  const std::string message = lucid_test::message_of([&] {
    lucid::distributed::make_tcp_store("127.0.0.1", static_cast<uint16_t>(port), 2,
                                       /*is_server=*/false, std::chrono::milliseconds(1000));
  });
  EXPECT_LT(seconds_since(start), 1.0 + 4.0);
  EXPECT_NE(message.find("cannot reach the c10d TCPStore at 127.0.0.1:" + std::to_string(port) +
                         " within 1 s"),
            std::string::npos)
      << message;
}

TEST(StoreFailure, ARankThatNeverJoinsFailsTheRendezvousWithinTheTimeout) {
  if (!lucid::distributed::has_gloo()) {
    GTEST_SKIP() << "built without Gloo";
  }
  ScratchDir dir("lucid_dist");
  auto store = lucid::distributed::make_file_store((dir.path() / "store").string(), 2,
                                                   std::chrono::milliseconds(1000));
  const auto start = std::chrono::steady_clock::now();
  const std::string message = lucid_test::message_of([&] {
    lucid::distributed::make_gloo_group(store, 0, 2,
                                        lucid::distributed::GroupOptions()
                                            .timeout(std::chrono::milliseconds(1000))
                                            .gloo_hostname("127.0.0.1"));
  });
  EXPECT_LT(seconds_since(start), 1.0 + 4.0);
  EXPECT_NE(message.find("rank 0 of 2 could not join the Gloo group within 1 s"), std::string::npos)
      << message;
}

// In-process checks of the API itself (a group of one).
class SingleRank : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!lucid::distributed::has_gloo()) {
      GTEST_SKIP() << "built without Gloo";
    }
    store_ = lucid::distributed::make_file_store((dir_.path() / "store").string(), 1,
                                                 std::chrono::milliseconds(5000));
    group_ = lucid::distributed::make_gloo_group(
        store_, 0, 1, lucid::distributed::GroupOptions().gloo_hostname("127.0.0.1"));
  }
  ScratchDir dir_{"lucid_dist"};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
};

TEST_F(SingleRank, AgreeKeepsTheFlagAndCountsTheAllReduce) {
  lucid::distributed::OverflowAgreement agreement(group_);
  torch::Tensor flag = torch::ones({});
  agreement.agree_(flag);
  EXPECT_EQ(flag.item<float>(), 1.0f);
  EXPECT_EQ(flag.dim(), 0);
  EXPECT_EQ(agreement.all_reduces(), 1);
  EXPECT_EQ(agreement.rank(), 0);
  EXPECT_EQ(agreement.world_size(), 1);
}

TEST_F(SingleRank, BindingAScalerRunsOneAllReducePerOptimizerStep) {
  lucid::amp::GradScaler scaler(lucid::amp::GradScalerOptions().init_scale(8.0));
  auto agreement = lucid::distributed::bind_to_group(scaler, group_);
  torch::Tensor a = torch::ones({3}, torch::requires_grad()),
                b = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt_a({a}, torch::optim::SGDOptions(0.1)),
      opt_b({b}, torch::optim::SGDOptions(0.1));
  scaler.scale(torch::ones({}));
  a.mutable_grad() = torch::full({3}, 8.0);
  b.mutable_grad() = torch::full({3}, std::numeric_limits<float>::infinity());
  EXPECT_TRUE(scaler.step(opt_a).has_value());
  EXPECT_FALSE(scaler.step(opt_b).has_value());
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_EQ(agreement->all_reduces(), 2);
  scaler.set_found_inf_hook(nullptr);  // unbinds
  scaler.scale(torch::ones({}));
  a.mutable_grad() = torch::full({3}, 4.0);
  scaler.step(opt_a);
  EXPECT_EQ(agreement->all_reduces(), 2);
}

TEST_F(SingleRank, RejectsAFlagThatIsNotOneFloat32Element) {
  lucid::distributed::OverflowAgreement agreement(group_);
  torch::Tensor wrong = torch::zeros({2});
  EXPECT_NE(lucid_test::message_of([&] {
              agreement.agree_(wrong);
            }).find("expects a 1-element float32 overflow flag"),
            std::string::npos);
  torch::Tensor dbl = torch::zeros({}, torch::kDouble);
  EXPECT_NE(lucid_test::message_of([&] { agreement.agree_(dbl); }).find("got a Double tensor"),
            std::string::npos);
  EXPECT_EQ(agreement.all_reduces(), 0);
}

TEST_F(SingleRank, AgreeWithANormPartialCombinesBothInOneAllReduce) {
  lucid::distributed::OverflowAgreement agreement(group_);
  torch::Tensor flag = torch::ones({}), partial = torch::full({}, 25.0f);
  agreement.agree_with_norm_(flag, partial, 2.0);
  EXPECT_EQ(flag.item<float>(), 1.0f);
  EXPECT_EQ(partial.item<float>(), 25.0f);
  EXPECT_EQ(partial.dim(), 0);
  torch::Tensor clean = torch::zeros({}),
                nan = torch::full({}, std::numeric_limits<float>::quiet_NaN());
  agreement.agree_with_norm_(clean, nan, std::numeric_limits<double>::infinity());
  EXPECT_EQ(clean.item<float>(), 0.0f);  // the scaler, not the agreement, makes NaN an overflow
  EXPECT_TRUE(std::isnan(nan.item<float>()));
  EXPECT_EQ(agreement.all_reduces(), 2);
}

TEST_F(SingleRank, RejectsABadNormPartialOrNormType) {
  lucid::distributed::OverflowAgreement agreement(group_);
  torch::Tensor flag = torch::zeros({}), partial = torch::zeros({});
  EXPECT_TRUE(lucid_test::ThrowsValueError(
      "norm_type must be > 0", [&] { agreement.agree_with_norm_(flag, partial, 0.0); }));
  torch::Tensor two = torch::zeros({2});
  EXPECT_NE(lucid_test::message_of([&] {
              agreement.agree_with_norm_(flag, two, 2.0);
            }).find("expects a 1-element float32 norm partial"),
            std::string::npos);
  EXPECT_EQ(agreement.all_reduces(), 0);
}

TEST_F(SingleRank, ShardedBindingAgreesClipAndStepInOneAllReduce) {
  lucid::amp::GradScaler scaler(lucid::amp::GradScalerOptions().init_scale(8.0));
  auto agreement = lucid::distributed::bind_to_group(
      scaler, group_, lucid::distributed::OverflowAgreementOptions().sharded(true));
  EXPECT_TRUE(agreement->options().sharded());
  torch::Tensor a = torch::zeros({2}, torch::requires_grad()),
                b = torch::ones({3}, torch::requires_grad());
  torch::optim::SGD opt_a({a}, torch::optim::SGDOptions(1.0)),
      opt_b({b}, torch::optim::SGDOptions(0.1));
  scaler.scale(torch::ones({}));
  a.mutable_grad() = torch::tensor({24.0f, 32.0f});
  b.mutable_grad() = torch::full({3}, 8.0);
  EXPECT_EQ(scaler.clip_grad_norm_(opt_a, 1.0).item<float>(), 5.0f);
  EXPECT_EQ(agreement->all_reduces(), 1);
  EXPECT_TRUE(scaler.step(opt_a).has_value());
  EXPECT_EQ(agreement->all_reduces(), 1);
  EXPECT_TRUE(scaler.step(opt_b).has_value());  // unscale_ and step: the flag alone
  EXPECT_EQ(agreement->all_reduces(), 2);
  EXPECT_TRUE(torch::allclose(a.detach(), -torch::tensor({0.6f, 0.8f}), 1e-5, 1e-6));
}

TEST(OverflowAgreementOptionsTest, RejectsANullGroupAndANonPositiveTimeout) {
  EXPECT_THROW(lucid::distributed::OverflowAgreement(c10::intrusive_ptr<c10d::ProcessGroup>()),
               c10::ValueError);
  ScratchDir dir("lucid_dist");
  if (!lucid::distributed::has_gloo()) {
    GTEST_SKIP() << "built without Gloo";
  }
  auto store =
      lucid::distributed::make_file_store((dir.path() / "s").string(), 1, std::chrono::seconds(5));
  auto group = lucid::distributed::make_gloo_group(
      store, 0, 1, lucid::distributed::GroupOptions().gloo_hostname("127.0.0.1"));
  EXPECT_TRUE(lucid_test::ThrowsValueError("timeout must be > 0 ms, got 0 ms", [&] {
    lucid::distributed::OverflowAgreement(
        group,
        lucid::distributed::OverflowAgreementOptions().timeout(std::chrono::milliseconds(0)));
  }));
}

TEST(GroupFactories, RejectBadRanksAndMissingBackends) {
  EXPECT_THROW(lucid::distributed::make_file_store("/tmp/x", 0, std::chrono::seconds(1)),
               c10::ValueError);
  ScratchDir dir("lucid_dist");
  auto store =
      lucid::distributed::make_file_store((dir.path() / "s").string(), 2, std::chrono::seconds(1));
  EXPECT_THROW(lucid::distributed::make_gloo_group(store, 2, 2), c10::ValueError);
  if (!lucid::distributed::has_nccl()) {
    EXPECT_THROW(lucid::distributed::make_nccl_group(store, 0, 2), c10::NotImplementedError);
  }
}

}  // namespace
