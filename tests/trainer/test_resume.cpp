// SPDX-License-Identifier: BSD-3-Clause
// Checkpoints: a run interrupted, saved, and resumed in fresh objects ends exactly where
// the uninterrupted run ends: same weights, same loss and scale at every step, same
// scaler counters. A checkpoint that is corrupt, of another precision or of the earlier
// trainer format is refused with a clear error and changes nothing.

#include <gtest/gtest.h>
#include <lucid/amp/serialize.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <c10/util/Exception.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "../support/scaler_fixtures.h"
#include "../support/scratch_dir.h"
#include "trainer.h"

using namespace lucid::trainer;
namespace apps = lucid::apps;
using lucid_test::Observed;
using lucid_test::ScratchDir;

namespace {

Dataset synthetic(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  Dataset d;
  d.labels = torch::randint(10, {n}, torch::kLong);
  // Class-dependent blobs so that there is something to learn.
  d.images = torch::randn({n, 1, 28, 28}) * 0.5 +
             d.labels.to(torch::kFloat).view({n, 1, 1, 1}) / 5.0 - 1.0;
  return d;
}

TrainConfig resume_config() {
  TrainConfig c;
  c.precision = apps::Precision::kFp16Scaled;
  c.batch_size = 16;
  c.epochs = 2;
  c.seed = 7;
  // A scale too large for float16 at first, and fast growth: the run backs off and grows
  // again several times, so the scale schedule is worth comparing.
  c.init_scale = 1073741824.0;  // 2^30
  c.growth_interval = 3;
  return c;
}

// What a trainer holds that a refused load must leave alone.
struct Held {
  int64_t steps;
  std::vector<double> losses;
  Observed scaler;
  std::vector<at::Tensor> params;

  static Held of(Trainer& t) {
    Held h{t.result().steps, {}, Observed::of(t.scaler()), {}};
    for (const auto& r : t.result().log) h.losses.push_back(r.loss);
    for (const auto& p : t.model()->parameters()) h.params.push_back(p.detach().clone());
    return h;
  }
  void expect_unchanged(Trainer& t) const {
    const Held now = of(t);
    EXPECT_EQ(now.steps, steps);
    EXPECT_EQ(now.losses, losses);
    EXPECT_TRUE(now.scaler == scaler) << now.scaler.str() << " vs " << scaler.str();
    ASSERT_EQ(now.params.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(now.params[i], params[i])) << "parameter " << i;
    }
  }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Small data sets (4 steps per epoch), short runs of resume_config(), and a scratch
// directory for their checkpoints.
class Resume : public ::testing::Test {
 protected:
  // A trainer that has taken `steps` steps.
  std::unique_ptr<Trainer> trained(int64_t steps) {
    TrainConfig c = resume_config();
    c.max_steps = steps;
    auto t = std::make_unique<Trainer>(c, train_, test_);
    t->run();
    return t;
  }
  // The path of a checkpoint, saved as `name`, of a run of `steps` steps.
  std::string saved(int64_t steps, const std::string& name) {
    const std::string path = dir_.file(name);
    trained(steps)->save(path);
    return path;
  }

  const Dataset train_ = synthetic(64, 1), test_ = synthetic(16, 2);
  const ScratchDir dir_{"lucid_resume"};
};

}  // namespace

TEST_F(Resume, ResumedRunEqualsTheUninterruptedOne) {
  const Dataset train = synthetic(256, 1), test = synthetic(64, 2);  // 16 steps per epoch
  Trainer straight(resume_config(), train, test);
  const RunResult full = straight.run();
  ASSERT_EQ(full.steps, 32);
  ASSERT_GT(full.skipped, 0) << "the schedule should include overflows";

  // Stop mid-way through the second epoch, save, and continue in new objects.
  const std::string path = dir_.file("resume.pt");
  {
    TrainConfig first_half = resume_config();
    first_half.max_steps = 21;
    Trainer t(first_half, train, test);
    const RunResult part = t.run();
    ASSERT_EQ(part.steps, 21);
    t.save(path);
  }
  torch::manual_seed(12345);  // whatever the global generator holds must not matter
  Trainer resumed(resume_config(), train, test);
  resumed.load(path);
  EXPECT_EQ(resumed.result().steps, 21);
  const RunResult rest = resumed.run();

  ASSERT_EQ(rest.log.size(), full.log.size());
  for (size_t i = 0; i < full.log.size(); ++i) {
    EXPECT_EQ(rest.log[i].loss, full.log[i].loss) << "step " << i + 1;
    EXPECT_EQ(rest.log[i].scale, full.log[i].scale) << "step " << i + 1;
    EXPECT_EQ(rest.log[i].skipped, full.log[i].skipped) << "step " << i + 1;
  }
  EXPECT_EQ(rest.final_scale, full.final_scale);
  EXPECT_EQ(resumed.scaler().state_dict(), straight.scaler().state_dict());
  // The counters travel with the scaler (GradScaler::save), so they match as well.
  const Observed a_scaler = Observed::of(straight.scaler()), b_scaler = Observed::of(resumed.scaler());
  EXPECT_TRUE(b_scaler == a_scaler) << b_scaler.str() << " vs " << a_scaler.str();
  const auto a = straight.model()->named_parameters(), b = resumed.model()->named_parameters();
  for (const auto& p : a) {
    EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  }
  EXPECT_EQ(rest.epoch_accuracy, full.epoch_accuracy);
  EXPECT_EQ(rest.test_accuracy, full.test_accuracy);
  EXPECT_DOUBLE_EQ(rest.zero_grad_fraction, full.zero_grad_fraction);
}

TEST_F(Resume, TheScalerIsStoredAsGradScalerSaveWritesIt) {
  const auto t = trained(5);
  const std::string path = dir_.file("checkpoint.pt");
  t->save(path);
  // The library's own reader, archive check included, finds the scaler in it.
  lucid::amp::GradScaler scaler;
  lucid::amp::load_scaler(scaler, path);
  EXPECT_TRUE(Observed::of(scaler) == Observed::of(t->scaler()))
      << Observed::of(scaler).str() << " vs " << Observed::of(t->scaler()).str();
}

TEST_F(Resume, CheckpointOfAnotherPrecisionIsRefused) {
  const std::string path = saved(2, "other.pt");
  TrainConfig c = resume_config();
  c.precision = apps::Precision::kFp32;
  Trainer other(c, train_, test_);
  EXPECT_TRUE(lucid_test::ThrowsValueError("resume it with --precision fp16-scaled",
                                           [&] { other.load(path); }));
}

TEST_F(Resume, GarbageCheckpointIsRefusedWithItsPath) {
  const std::string path = dir_.file("garbage.pt");
  write_bytes(path, "not a checkpoint");
  Trainer t(resume_config(), train_, test_);
  EXPECT_TRUE(lucid_test::ThrowsError("cannot read checkpoint " + path, [&] { t.load(path); }));
}

// LibTorch's reader skips the zip's CRC-32s: a flipped byte in the weights or the Adam
// moments would load without a word. The trainer runs load_scaler's archive check over the
// whole file first.
TEST_F(Resume, CorruptCheckpointIsRefusedAndChangesNothing) {
  const std::string path = saved(5, "checkpoint.pt"), bad = dir_.file("corrupt.pt");
  const std::string bytes = read_bytes(path);
  ASSERT_GT(bytes.size(), 4096u);
  const auto target = trained(3);  // a trainer with state of its own
  const Held before = Held::of(*target);
  const auto refused = [&](const std::string& corrupt) {
    write_bytes(bad, corrupt);
    EXPECT_TRUE(lucid_test::ThrowsError("cannot read checkpoint " + bad, [&] { target->load(bad); }));
    before.expect_unchanged(*target);
  };
  // Most of the file is tensor data (weights, then Adam's two moments per weight).
  for (const size_t at : {bytes.size() / 4, bytes.size() / 2, bytes.size() * 3 / 4}) {
    SCOPED_TRACE("byte " + std::to_string(at) + " of " + std::to_string(bytes.size()) + " flipped");
    std::string corrupt = bytes;
    corrupt[at] = static_cast<char>(corrupt[at] ^ 0x10);
    refused(corrupt);
  }
  SCOPED_TRACE("cut short");
  refused(bytes.substr(0, bytes.size() - 100));
  // The intact file still loads into the same trainer.
  target->load(path);
  EXPECT_EQ(target->result().steps, 5);
}

// The earlier trainer format kept the scaler as one float64 tensor per state_dict key
// under "scaler", beside "model", "optimizer" and "trainer".
TEST_F(Resume, CheckpointOfTheEarlierFormatIsRefusedWithWhatToDo) {
  const auto t = trained(2);
  const std::string path = dir_.file("earlier.pt");
  {
    torch::serialize::OutputArchive root, model, optim, scaler, state;
    t->model()->save(model);
    for (const auto& [key, value] : t->scaler().state_dict()) {
      scaler.write(key, at::tensor(value, at::kDouble));
    }
    state.write("steps", at::tensor(int64_t{2}, at::kLong));
    root.write("model", model);
    root.write("optimizer", optim);
    root.write("scaler", scaler);
    root.write("trainer", state);
    root.save_to(path);
  }
  const auto target = trained(3);
  const Held before = Held::of(*target);
  const auto refusal = [&] { target->load(path); };
  EXPECT_TRUE(lucid_test::ThrowsError(
      "checkpoint " + path + " was written by an earlier lucid_amp_trainer", refusal));
  EXPECT_TRUE(lucid_test::ThrowsError(
      "Finish that run with the build that wrote it, or start it again", refusal));
  before.expect_unchanged(*target);
}
