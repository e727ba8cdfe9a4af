// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the step log, what every update() did, kept on the scale's device.
//
// NOTE: [Step log]
// A float64 tensor beside the scale holds the last detail::kStepLogRows updates, one row
// each (detail::StepLogField): the scale the gradients were divided by, the scale after,
// the overflow flag, what the update did, the iteration's clip norm, and where its
// gradients held inf/NaN (NOTE: [Overflow site] in scale_rule.h, whose site lives here). The
// update's own
// kernel writes its row (detail::log_update, after detail::count_update), so eager,
// captured and replayed updates are logged alike, at no cost on the host. Reading it never
// stalls training: a read copies the whole log to the host behind the work queued so far,
// without waiting (start_flag_read_), and returns what the last copy that has landed held;
// a read that is told to wait copies and waits. Nothing in step() or update() reads it.
// The log is made with the scale, by the first scale(), before any capture (its zero fill
// would otherwise be part of the graph). A checkpoint loaded with its counters clears it:
// its run goes on from there, numbered from the checkpoint's count of updates.

#include <lucid/amp/diagnostics.h>

#include "amp/flag_read.h"

#include <ATen/ATen.h>

#include <vector>

namespace lucid {
namespace amp {
namespace detail {

class StepLog {
 public:
  // Makes the log on `device` (the scale's), eagerly, before anything is logged.
  void place(const at::Device& device);
  // The log the update kernel writes (UpdateRecord::log); undefined until placed.
  const at::Tensor& rows() const { return log_; }
  // The site the checks record into and the update logs and sets back (UpdateRecord::
  // overflow_site, OverflowSite::slot); undefined until placed.
  const at::Tensor& overflow_site() const { return overflow_site_; }
  // Sets the site back where an iteration ends without the update kernel
  // (update(new_scale)): the next iteration records only its own gradients.
  void forget_overflow_site();
  // The records of the last copy that has landed, oldest first; starts a copy when none is
  // on its way. `wait`: copies now and waits for it, so every update queued so far is in.
  // Under a CUDA capture nothing is copied.
  std::vector<StepRecord> read(bool wait);
  // Forgets what was logged; later updates are numbered from `first_update`.
  void clear(int64_t first_update);

 private:
  at::Tensor log_;             // float64, 1 + kStepLogRows rows of kStepLogFields
  at::Tensor overflow_site_;   // int64, kOverflowSiteFields entries, beside log_
  PendingFlagRead in_flight_;  // the copy on its way to the host
  at::Tensor landed_;          // the last copy that landed (CPU)
  int64_t first_update_ = 0;   // the number of the log's update 0
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
