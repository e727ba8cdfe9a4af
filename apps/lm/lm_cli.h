// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The command line of lucid_amp_lm (CLI11) and the program it drives.

#include <optional>
#include <string>
#include <vector>

#include "lm_trainer.h"

namespace lucid {
namespace lm {

/// Everything the command line sets.
struct LmOptions {
  LmConfig config;               ///< config.precision is the single run's precision
  bool compare = false;          ///< run `modes` one after the other and tabulate
  std::vector<apps::Precision> modes = apps::all_precisions();
  std::string corpus_dir = fortunes_dir();
  std::string out_dir = "out_lm";
  int64_t limit_bytes = 0;       ///< 0: the whole corpus
  bool progress = true;
  bool plot = true;
  int threads = 0;               ///< 0: LibTorch's default
};

/// Parses the command line; nullopt after CLI11 printed help (exit code 0) or an error.
std::optional<LmOptions> parse_lm_cli(int argc, char** argv, int& exit_code);

/// Trains what the options say; prints the table, writes lm_log.csv and lm_curves.png
/// into out_dir. Returns the runs. c10::Error for bad input (corpus, output folder).
std::vector<LmResult> run_lm_app(const LmOptions& options);

/// main(): parse, run; an error goes to stderr as one message and gives exit code 1.
int lm_main(int argc, char** argv);

}  // namespace lm
}  // namespace lucid
