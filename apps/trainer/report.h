// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The table the trainer prints after --compare.

#include <string>
#include <vector>

#include "trainer.h"

namespace lucid {
namespace trainer {

/// Test accuracy, its gap to fp32 (when fp32 ran), time, steps, skipped steps, final
/// scale, share of zero gradient entries; one row per run.
std::string results_table(const std::vector<RunResult>& runs);

}  // namespace trainer
}  // namespace lucid
