// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The language model's comparison table (the CNN's CSV and plot are reused as they are).

#include <string>
#include <vector>

#include "lm_trainer.h"

namespace lucid {
namespace lm {

/// precision, validation loss before and after (nats per byte), its gap to fp32, bits per
/// byte, the last 20 steps' training loss, time, steps, skipped steps, final scale, share
/// of zero gradient entries.
std::string lm_results_table(const std::vector<LmResult>& runs);

}  // namespace lm
}  // namespace lucid
