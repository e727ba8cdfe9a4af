// SPDX-License-Identifier: BSD-3-Clause
#include "lm_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace lucid {
namespace lm {

std::string lm_results_table(const std::vector<LmResult>& runs) {
  const LmResult* fp32 = nullptr;
  for (const auto& r : runs) {
    if (r.run.precision == apps::Precision::kFp32) fp32 = &r;
  }
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-12s %9s %9s %9s %8s %10s %8s %6s %8s %12s %11s\n",
                "precision", "val start", "val loss", "vs fp32", "bits/B", "train loss", "time",
                "steps", "skipped", "final scale", "zero grads");
  out << line;
  for (const auto& r : runs) {
    char gap[32] = "-";
    if (fp32 && &r != fp32) std::snprintf(gap, sizeof gap, "%+.3f", r.val_loss - fp32->val_loss);
    std::snprintf(line, sizeof line,
                  "%-12s %9.3f %9.3f %9s %8.3f %10.3f %6.1f s %6lld %8lld %12g %9.2f %%\n",
                  apps::to_string(r.run.precision).c_str(), r.val_loss_start, r.val_loss, gap,
                  r.val_loss / std::log(2.0), r.train_loss_last, r.run.train_seconds,
                  static_cast<long long>(r.run.steps), static_cast<long long>(r.run.skipped),
                  r.run.final_scale, 100.0 * r.run.zero_grad_fraction);
    out << line;
  }
  return out.str();
}

}  // namespace lm
}  // namespace lucid
