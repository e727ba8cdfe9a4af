// SPDX-License-Identifier: BSD-3-Clause
// A short run on a subset of the real Fashion-MNIST (Debian's dataset-fashion-mnist, or the
// copy that $LUCID_AMP_FASHION_MNIST_DIR names; the tests skip where neither exists):
// accuracy rises well above chance, and the program writes its CSV and plot. On a CUDA
// machine the same on the GPU, with real float16 autocast and the scaler's state on the
// device, starting from the CPU's weights and first batch.

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli.h"
#include "report.h"
#include "run_report.h"
#include "trainer.h"

#include "../support/scratch_dir.h"

namespace fs = std::filesystem;
using namespace lucid::trainer;
namespace apps = lucid::apps;

namespace {
bool have_data() {
  return fs::exists(fs::path(fashion_mnist_dir()) / "train-images-idx3-ubyte.gz");
}
}  // namespace

TEST(EndToEnd, AccuracyRisesOnASubsetOfFashionMnist) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const FashionMnist data = load_fashion_mnist(fashion_mnist_dir(), 4800, 1000);
  TrainConfig c;
  c.precision = apps::Precision::kFp16Scaled;
  Trainer t(c, data.train, data.test);
  const double before = t.evaluate();
  const RunResult r = t.run();
  EXPECT_EQ(r.steps, 75);
  ASSERT_EQ(r.epoch_accuracy.size(), 1u);
  EXPECT_LT(before, 25.0);
  EXPECT_GT(r.test_accuracy, 60.0) << "before training: " << before;
  EXPECT_GT(r.test_accuracy, before + 30.0);
}

TEST(EndToEnd, ProgramWritesTableCsvAndPlot) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const lucid_test::ScratchDir scratch("lucid_trainer_e2e");
  const fs::path& out = scratch.path();
  CliOptions o;
  o.compare = true;
  o.modes = {apps::Precision::kFp32, apps::Precision::kFp16Scaled};
  o.train_limit = 640;
  o.test_limit = 500;
  o.out_dir = out.string();
  o.progress = false;
  o.plot = !apps::find_gnuplot().empty();
  run_app(o);
  std::ifstream csv(out / "train_log.csv");
  std::string header, line;
  std::getline(csv, header);
  EXPECT_EQ(header, "precision,step,loss,loss_avg,scale,skipped,overflow");
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  EXPECT_EQ(rows, 2 * 10);
  if (o.plot) {
    EXPECT_GT(fs::file_size(out / "train_curves.png"), 1000u);
  }
}

TEST(EndToEnd, CudaFp16AutocastWithTheScalerOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const FashionMnist data = load_fashion_mnist(fashion_mnist_dir(), 4800, 1000);
  TrainConfig c;
  c.device = "cuda";
  c.precision = apps::Precision::kFp16Scaled;
  Trainer t(c, data.train, data.test);
  const double before = t.evaluate();
  const RunResult r = t.run();
  EXPECT_EQ(r.steps, 75);
  EXPECT_TRUE(t.scaler().scale_tensor().is_cuda());
  EXPECT_GT(r.test_accuracy, 60.0) << "before training: " << before;
  EXPECT_GT(r.test_accuracy, before + 30.0);
}

TEST(EndToEnd, CudaStartsFromTheCpusWeightsAndData) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const FashionMnist data = load_fashion_mnist(fashion_mnist_dir(), 640, 100);
  TrainConfig c;
  c.precision = apps::Precision::kFp32;
  c.max_steps = 1;
  Trainer cpu(c, data.train, data.test);
  c.device = "cuda";
  Trainer gpu(c, data.train, data.test);
  // Same weights and the same first batch: the first loss agrees to float32's rounding
  // (TF32 is off for the fp32 run).
  EXPECT_NEAR(cpu.run().log.at(0).loss, gpu.run().log.at(0).loss, 1e-4);
}
