// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// A one-line progress bar on stderr: step, loss, scale, skipped steps, ETA.

#include <chrono>
#include <cstdio>
#include <string>

#include "run_record.h"

namespace lucid {
namespace apps {

/// Redraws one line (on a terminal, at most ten times a second) or, when stderr is not a
/// terminal, prints a plain line every tenth of the run, so that logs stay short.
class ProgressBar {
 public:
  /// `label` names the run (its precision); `out` is where the bar goes.
  explicit ProgressBar(std::string label, std::FILE* out = stderr);
  /// Shows the state after a step.
  void update(const StepEvent& e);
  /// Ends the bar's line (call before printing anything else).
  void finish();

  /// The text of the bar for `e`, `width` characters of bar (exposed for tests).
  static std::string render(const std::string& label, const StepEvent& e, int width = 24);

 private:
  std::string label_;
  std::FILE* out_;
  bool tty_;
  bool open_ = false;
  int64_t last_decile_ = -1;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace apps
}  // namespace lucid
