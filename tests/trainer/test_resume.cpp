// Checkpoints: a run interrupted, saved, and resumed in fresh objects ends exactly where
// the uninterrupted run ends: same weights, same loss and scale at every step.

#include <gtest/gtest.h>
#include <torch/utils.h>

#include <c10/util/Exception.h>

#include <filesystem>
#include <fstream>

#include "trainer.h"

namespace fs = std::filesystem;
using namespace lucid::trainer;

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
  c.precision = Precision::kFp16Scaled;
  c.batch_size = 16;
  c.epochs = 2;
  c.seed = 7;
  // A scale too large for float16 at first, and fast growth: the run backs off and grows
  // again several times, so the scale schedule is worth comparing.
  c.init_scale = 1073741824.0;  // 2^30
  c.growth_interval = 3;
  return c;
}

std::string temp_path(const std::string& name) {
  return (fs::temp_directory_path() /
          (name + "_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed())))
      .string();
}

}  // namespace

TEST(Resume, ResumedRunEqualsTheUninterruptedOne) {
  const Dataset train = synthetic(256, 1), test = synthetic(64, 2);  // 16 steps per epoch
  Trainer straight(resume_config(), train, test);
  const RunResult full = straight.run();
  ASSERT_EQ(full.steps, 32);
  ASSERT_GT(full.skipped, 0) << "the schedule should include overflows";

  // Stop mid-way through the second epoch, save, and continue in new objects.
  const std::string path = temp_path("lucid_resume.pt");
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
  fs::remove(path);

  ASSERT_EQ(rest.log.size(), full.log.size());
  for (size_t i = 0; i < full.log.size(); ++i) {
    EXPECT_EQ(rest.log[i].loss, full.log[i].loss) << "step " << i + 1;
    EXPECT_EQ(rest.log[i].scale, full.log[i].scale) << "step " << i + 1;
    EXPECT_EQ(rest.log[i].skipped, full.log[i].skipped) << "step " << i + 1;
  }
  EXPECT_EQ(rest.final_scale, full.final_scale);
  EXPECT_EQ(resumed.scaler().state_dict(), straight.scaler().state_dict());
  const auto a = straight.model()->named_parameters(), b = resumed.model()->named_parameters();
  for (const auto& p : a) {
    EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  }
  EXPECT_EQ(rest.epoch_accuracy, full.epoch_accuracy);
  EXPECT_EQ(rest.test_accuracy, full.test_accuracy);
  EXPECT_DOUBLE_EQ(rest.zero_grad_fraction, full.zero_grad_fraction);
}

TEST(Resume, CheckpointOfAnotherPrecisionIsRefused) {
  const Dataset train = synthetic(64, 1), test = synthetic(16, 2);
  TrainConfig c = resume_config();
  c.max_steps = 2;
  const std::string path = temp_path("lucid_resume_other.pt");
  Trainer t(c, train, test);
  t.run();
  t.save(path);
  c.precision = Precision::kFp32;
  Trainer other(c, train, test);
  try {
    other.load(path);
    ADD_FAILURE() << "no exception";
  } catch (const c10::ValueError& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("resume it with --precision fp16-scaled"),
              std::string::npos)
        << e.what_without_backtrace();
  }
  fs::remove(path);
}

TEST(Resume, GarbageCheckpointIsRefusedWithItsPath) {
  const Dataset train = synthetic(64, 1), test = synthetic(16, 2);
  const std::string path = temp_path("lucid_garbage.pt");
  std::ofstream(path) << "not a checkpoint";
  Trainer t(resume_config(), train, test);
  try {
    t.load(path);
    ADD_FAILURE() << "no exception";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("cannot read checkpoint " + path),
              std::string::npos)
        << e.what_without_backtrace();
  }
  fs::remove(path);
}
