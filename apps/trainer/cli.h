// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The command line of lucid_amp_trainer (CLI11) and the program it drives.

#include <optional>
#include <string>
#include <vector>

#include "idx_reader.h"
#include "precision.h"
#include "trainer.h"

namespace lucid {
namespace trainer {

/// Everything the command line sets.
struct CliOptions {
  TrainConfig config;                ///< config.precision is the single run's precision
  bool compare = false;              ///< run `modes` one after the other and tabulate
  std::vector<apps::Precision> modes = apps::all_precisions();
  std::string data_dir = fashion_mnist_dir();
  std::string out_dir = "out";
  std::string save_path;             ///< empty: no checkpoint
  std::string resume_path;           ///< empty: start from scratch
  int64_t train_limit = 0;           ///< 0: all 60000 training images
  int64_t test_limit = 0;            ///< 0: all 10000 test images
  bool progress = true;
  bool plot = true;
  int threads = 0;                   ///< 0: LibTorch's default
};

/// Parses the command line. Returns the options, or nullopt after CLI11 has printed help
/// (exit code 0) or an error (non-zero); `exit_code` says which.
std::optional<CliOptions> parse_cli(int argc, char** argv, int& exit_code);

/// Runs what the options say: trains, prints progress, accuracies and the table, writes
/// the CSV and the plot. Throws c10::Error for bad input (missing or corrupt data, an
/// unwritable path, a checkpoint that does not fit).
void run_app(const CliOptions& options);

/// main(): parse_cli, then run_app; an error goes to stderr as one clear message and
/// gives exit code 1.
int trainer_main(int argc, char** argv);

}  // namespace trainer
}  // namespace lucid
