// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// What a training run of either program (the CNN trainer, the language model) records:
// the step log that the CSV and the plot are made from, what a progress bar shows after
// each step, and the run's totals.

#include <cstdint>
#include <vector>

#include "precision.h"

namespace lucid {
namespace apps {

/// One line of the step log.
struct StepRecord {
  int64_t step;     ///< 1-based, counted over all epochs
  double loss;      ///< mean cross-entropy of this step's batch (however it was normalised)
  double scale;     ///< the loss scale after this step's update (1 without scaling)
  int64_t skipped;  ///< steps skipped so far (overflow), this one included
};

/// What the progress bar shows after each step.
struct StepEvent {
  int64_t epoch;            ///< 0-based
  int64_t epochs;
  int64_t step_in_epoch;    ///< 1-based
  int64_t steps_per_epoch;
  int64_t step;             ///< 1-based, over all epochs
  int64_t total_steps;      ///< of the whole run (a step limit taken into account)
  double loss, scale;
  int64_t skipped;
  double elapsed_s;         ///< training time of this run so far, resumed parts included
};

/// A run's totals and step log (also available part-way through).
struct RunRecord {
  Precision precision = Precision::kFp32;
  double train_seconds = 0;  ///< training time, evaluation excluded
  int64_t steps = 0;
  int64_t skipped = 0;
  double final_scale = 1.0;
  /// Of all gradient entries that crossed a conv or linear backwards (activations,
  /// weights, biases), the share that was exactly 0 (GradZeroCounter).
  double zero_grad_fraction = 0;
  std::vector<StepRecord> log;
};

}  // namespace apps
}  // namespace lucid
