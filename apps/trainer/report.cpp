// SPDX-License-Identifier: BSD-3-Clause
#include "report.h"

#include <cstdio>
#include <sstream>

namespace lucid {
namespace trainer {

std::string results_table(const std::vector<RunResult>& runs) {
  const RunResult* fp32 = nullptr;
  for (const auto& r : runs) {
    if (r.precision == apps::Precision::kFp32) fp32 = &r;
  }
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %9s %9s %8s %6s %8s %12s %11s\n", "precision",
                "test acc", "vs fp32", "time", "steps", "skipped", "final scale", "zero grads");
  out << line;
  for (const auto& r : runs) {
    char gap[32] = "-";
    if (fp32 && &r != fp32) {
      std::snprintf(gap, sizeof gap, "%+.2f pp", r.test_accuracy - fp32->test_accuracy);
    }
    std::snprintf(line, sizeof line, "%-12s %7.2f %% %9s %6.1f s %6lld %8lld %12g %9.2f %%\n",
                  apps::to_string(r.precision).c_str(), r.test_accuracy, gap, r.train_seconds,
                  static_cast<long long>(r.steps), static_cast<long long>(r.skipped),
                  r.final_scale, 100.0 * r.zero_grad_fraction);
    out << line;
  }
  return out.str();
}

}  // namespace trainer
}  // namespace lucid
