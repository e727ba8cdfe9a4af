// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the one interface every device's loss-scaling kernels implement. Each device
// folder defines one table: src/amp/cpu, src/amp/cuda (CUDA builds only), src/amp/generic
// (ATen ops, for every device without a table of its own, and for whatever a table does
// not take). Routing (kernel_routing.cpp) finds a device's table in the one registry of
// device kernels (common/device_kernels.h).

#include "amp/flag_read.h"
#include "amp/scale_rule.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace lucid {
namespace amp {

// What one scale update writes besides the scale and its trackers, each beside the scale
// and undefined where not wanted.
struct UpdateRecord {
  // int64, detail::kUpdateCountFields entries: advanced by detail::count_update (NOTE:
  // [Counting on the device] in device_tally.h).
  at::Tensor counts;
  // float64, 1 + detail::kStepLogRows rows of detail::kStepLogFields: one row written by
  // detail::log_update (NOTE: [Step log] in step_log.h).
  at::Tensor log;
  // float32, 0-dim: the norm the log records for the iteration; undefined: none (-1).
  at::Tensor grad_norm;
  // int64, detail::kOverflowSiteFields entries: the iteration's overflow site (NOTE:
  // [Overflow site] in scale_rule.h), logged with the row and set back; undefined: not
  // logged.
  at::Tensor overflow_site;
  // float32, one entry per flag: each stepped ordinal's outcome (detail::count_steps, NOTE:
  // [Steps counted by the update] in scale_rule.h), counted into `counts`; undefined: no
  // step is counted.
  at::Tensor step_outcomes;
  detail::SteppedOrdinals stepped;
};

// Where a check records the gradients it finds non-finite (NOTE: [Overflow site] in
// scale_rule.h): in `slot` (int64, detail::kOverflowSiteFields entries, contiguous, on any
// device) the first entry is lowered to the smallest key among the gradients that hold a
// non-finite value once unscaled, and the NaN and inf entries met are added to the counts;
// keys[i] is the key of the list's gradient i. An undefined slot records nothing.
struct OverflowSite {
  at::Tensor slot;
  std::vector<int64_t> keys;
};

// Sets an overflow site's `slot` (any device) to what an iteration that met nothing
// holds: detail::reset_overflow_site, as tensor ops.
inline void reset_overflow_site_slot(const at::Tensor& slot) {
  slot.narrow(0, detail::kSiteNanCount, 2).zero_();
  slot.select(0, detail::kSiteFirstKey).fill_(detail::kNoOverflowKey);
}

// The norms a device table accumulates itself; every other norm type is computed from
// ATen operations by the routing.
enum class NormKind { kTwo, kInf };

// The entry points of one device's kernels. The same signatures on every device;
// unchecked on purpose: kernel_routing.cpp owns the preconditions of kernel_routing.h
// and hands a table only what that table takes (below).
struct AmpBackend {
  const char* name;

  // Multiplies every gradient by 1/scale in place; raises `found_inf` to 1 when any
  // unscaled value is non-finite.
  // Args:
  //   grads:     non-empty; dense tensors of this table's device type (one device), each
  //              non-overlapping and dense for a device table (any layout for generic);
  //              float32, float64 or bfloat16, mixed allowed.
  //   scale:     float32, 0-dim, any device.
  //   found_inf: float32, 0-dim, any device; only ever raised.
  //   site:      where the non-finite gradients are recorded (OverflowSite).
  void (*unscale_and_check_)(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                             at::Tensor& found_inf, const OverflowSite& site);

  // The read-only twin: raises `found_inf` when any gradient times 1/scale is
  // non-finite. `scale` may be undefined (multiply by 1). Args as above.
  void (*check_finite_)(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf, const OverflowSite& site);

  // The read-only check with the gradients' norm accumulated in the same pass: raises
  // `found_inf` as check_finite_ does, and returns the norm's partial over these
  // gradients times 1/scale: the sum of squares (NormKind::kTwo) or the largest absolute
  // value (NormKind::kInf), float32, 0-dim, on the gradients' device. Accumulated in
  // float32 per chunk of work and reduced in a fixed order, so the same gradients give
  // the same bits run to run. NaN reaches the result. Args as check_finite_.
  at::Tensor (*check_and_norm_)(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                                at::Tensor& found_inf, const OverflowSite& site, NormKind kind);

  // One step of the scale rule, detail::next_scale_state, by the iteration's overflow
  // flags taken and set back to 0 (detail::take_found_inf, NOTE: [Overflow flags] in
  // scale_rule.h): with the guards of `rule` off PyTorch's sawtooth, else with hysteresis
  // (and its refill mode) and max_scale.
  // Args: scale (float32) and growth_tracker (int32), 0-dim, on one device of this table's
  // device type; flags: float32, contiguous, at least one entry, beside them;
  // overflow_tracker: int32, 0-dim, beside `scale`; undefined only where `rule` holds
  // hysteresis at 1 (it would stay 0). record: what the update also writes (UpdateRecord).
  void (*update_scale_)(at::Tensor& scale, at::Tensor& growth_tracker, at::Tensor& overflow_tracker,
                        const at::Tensor& flags, const detail::ScaleRule& rule,
                        const UpdateRecord& record);

  // The clip's arithmetic after check_and_norm_, as one launch: norm = sqrt(partial) for
  // NormKind::kTwo, the partial itself for kInf; found_inf raised when the norm is not
  // finite; coefficient = min(max_norm / (norm + 1e-6), 1); divisor = scale /
  // coefficient; each in the float32 operation the ATen path uses (kernel_routing.cpp),
  // so the bits are the same. Null where that path serves (a host's few scalar ops cost
  // nothing beside its norm pass; on a GPU their dozen launches outlast it).
  // Args: partial, scale, found_inf: float32, 0-dim, on one device of this table's type;
  // norm, divisor: written, the same.
  void (*clip_factors_)(const at::Tensor& partial, NormKind kind, double max_norm,
                        const at::Tensor& scale, at::Tensor& found_inf, at::Tensor& norm,
                        at::Tensor& divisor);

  // Copies `found_inf` to host memory behind the work queued on its device so far,
  // without waiting, and returns that copy with the wait for it. Null where reading the
  // flag waits for nothing (a host flag is read where it lies).
  // Args: found_inf: a flag (float32, 0-dim) or the step log (float64, contiguous), on a
  // device of this table's type.
  PendingFlagRead (*start_flag_read_)(const at::Tensor& found_inf);
};

// Each device folder's table. cuda::amp_backend() exists in CUDA builds only; the generic
// one (ATen operations) takes any device and any layout.
namespace cpu {
const AmpBackend& amp_backend();
}  // namespace cpu
namespace cuda {
const AmpBackend& amp_backend();
}  // namespace cuda
namespace generic {
// detail::count_steps as tensor ops, one launch or so per stepped ordinal: `flags` and
// record.counts and record.step_outcomes as update_scale_ takes them.
void count_steps_(const at::Tensor& flags, const UpdateRecord& record);
const AmpBackend& amp_backend();
}  // namespace generic

}  // namespace amp
}  // namespace lucid
