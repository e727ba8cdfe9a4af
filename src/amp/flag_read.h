// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: an overflow flag on its way to the host (detail::start_flag_read_).

#include <ATen/ATen.h>

#include <functional>

namespace lucid {
namespace amp {

// The host's copy of a device flag, taken where the flag became final (or of the step
// log, NOTE: [Step log] in step_log.h, taken when asked for). Reading it waits
// for the work queued before that point only, so a step's outcome is known without
// waiting for the optimizer kernel queued after its check, and ready() tells, without
// waiting, whether reading it would wait at all.
struct PendingFlagRead {
  at::Tensor host;              // CPU: the flag (or the step log), once wait() has returned
  std::function<void()> wait;   // blocks until the copy has landed
  std::function<bool()> ready;  // whether the copy has landed (never blocks)

  bool started() const { return host.defined(); }
  // Whether reading it now would not wait: its copy has landed, or it has no wait.
  bool landed() const { return !ready || ready(); }
  // The value, once the copy has landed (waits for it).
  float value() const {
    if (wait) {
      wait();
    }
    return host.item<float>();
  }
};

}  // namespace amp
}  // namespace lucid
