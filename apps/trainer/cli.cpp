// SPDX-License-Identifier: BSD-3-Clause
#include "cli.h"

#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>

#include "guarded_main.h"

namespace lucid {
namespace trainer {

std::optional<CliOptions> parse_cli(int argc, char** argv, int& exit_code) {
  CliOptions o;
  TrainConfig& c = o.config;
  std::string precision = apps::to_string(c.precision);
  std::vector<std::string> modes;
  for (apps::Precision p : o.modes) modes.push_back(apps::to_string(p));

  CLI::App app{
      "lucid_amp_trainer: trains a small CNN on Fashion-MNIST in fp32, fp16 without loss "
      "scaling, fp16 with lucid::amp::GradScaler, or bf16, and shows what float16 underflow "
      "does to learning and how loss scaling cures it. On the CPU, float16's range is "
      "emulated (activations, weights and gradients rounded through float16, forward and "
      "backward); on CUDA fp16 and bf16 use real autocast.",
      "lucid_amp_trainer"};
  app.get_formatter()->column_width(34);
  const std::vector<std::string> names = {"fp32", "fp16", "fp16-scaled", "bf16"};
  auto* prec = app.add_option("-p,--precision", precision,
                              "Precision of a single run: fp32, fp16 (no scaling), "
                              "fp16-scaled (GradScaler) or bf16")
                   ->check(CLI::IsMember(names))
                   ->capture_default_str();
  auto* cmp = app.add_flag("--compare", o.compare,
                           "Run every precision of --modes with the same seed and data "
                           "order, then print a table: test accuracy, time, steps skipped, "
                           "final scale, share of zero gradient entries");
  app.add_option("--modes", modes, "Precisions that --compare runs, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app.add_option("--data", o.data_dir,
                 "Folder holding train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
                 "t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz (Debian package "
                 "dataset-fashion-mnist; the default is $LUCID_AMP_FASHION_MNIST_DIR where "
                 "set)")
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu, or cuda (real float16 autocast)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("-e,--epochs", c.epochs, "Passes over the training set")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-b,--batch-size", c.batch_size, "Images per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", c.lr, "Adam's learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--head-gain", c.head_init_gain,
                 "Factor on the last layer's initial weights; small makes early gradients "
                 "small, the regime where float16 underflows")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string subnormals = "flush";
  app.add_option("--fp16-subnormals", subnormals,
                 "CPU float16 emulation: flush results below 2^-14 to zero (Metal, the reference "
                 "page's device) or keep them as IEEE subnormals (CUDA)")
      ->check(CLI::IsMember({"flush", "keep"}))
      ->capture_default_str();
  std::string loss_norm = "dataset";
  app.add_option("--loss-norm", loss_norm,
                 "dataset: per-step loss = batch sum / training-set size (tiny gradients, "
                 "float16 underflows); batch: the batch mean")
      ->check(CLI::IsMember({"dataset", "batch"}))
      ->capture_default_str();
  app.add_option("--loss-weight", c.loss_weight,
                 "Factor on the per-step loss: below 1 pushes float16's gradients further "
                 "into underflow (float32 and Adam hardly notice)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the initial weights and of every epoch's data order")
      ->capture_default_str();
  app.add_option("--train-limit", o.train_limit,
                 "Use only the first N training images (0: all 60000)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--test-limit", o.test_limit, "Use only the first N test images (0: all 10000)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-steps", c.max_steps,
                 "Stop after N steps in all, even mid-epoch (0: no limit); with --save, "
                 "a checkpoint to --resume from")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--init-scale", c.init_scale, "GradScaler's initial loss scale (fp16-scaled)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--growth-interval", c.growth_interval,
                 "GradScaler: clean steps before the scale doubles (fp16-scaled)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-o,--out", o.out_dir,
                 "Output folder for train_log.csv, train_curves.png and the gnuplot script")
      ->capture_default_str();
  auto* save = app.add_option("--save", o.save_path,
                              "Write model, optimizer and scaler state (and the loop's "
                              "position) to this file at the end of the run");
  auto* resume = app.add_option("--resume", o.resume_path,
                                "Continue the run saved in this file: same weights, optimizer "
                                "moments, loss scale schedule and data order");
  app.add_flag("!--no-progress", o.progress, "No progress bar");
  app.add_flag("!--no-plot", o.plot, "No PNG plot (gnuplot is then not needed)");
  app.add_option("--threads", o.threads, "CPU threads for LibTorch (0: its default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmp->excludes(prec);
  save->excludes(cmp);
  resume->excludes(cmp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    exit_code = app.exit(e);
    return std::nullopt;
  }
  c.precision = apps::parse_precision(precision);
  c.loss_norm = loss_norm == "batch" ? LossNorm::kBatchMean : LossNorm::kDatasetSum;
  c.flush_subnormals = subnormals == "flush";
  o.modes.clear();
  for (const auto& m : modes) o.modes.push_back(apps::parse_precision(m));
  exit_code = 0;
  return o;
}

int trainer_main(int argc, char** argv) {
  return apps::guarded_main(argc, argv, parse_cli, run_app);
}

}  // namespace trainer
}  // namespace lucid
