// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: what the scaler remembers of each optimizer between two update() calls: its
// stage (ready -> unscaled -> stepped) and its overflow flag, an entry of the iteration's
// flags (NOTE: [Overflow flags] in scale_rule.h). Keyed by OptimizerView::key.

#include <lucid/amp/grad_scaler_options.h>
#include <lucid/amp/optimizer_view.h>

#include "amp/flag_read.h"
#include "amp/scale_rule.h"

#include <ATen/ATen.h>

#include <unordered_map>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct OptimizerRecord {
  OptimizerStage stage = OptimizerStage::kReady;
  // Its place in the iteration, from 0: the order of each optimizer's first unscale_,
  // clip_grad_norm_ or step() since the last update(). The step log names overflowing
  // optimizers by it.
  int ordinal = 0;
  // float32, 0-dim, on the scale's device: entry `ordinal` of the iteration's flags, set by
  // this iteration's check (undefined: none was recorded).
  at::Tensor found_inf;
  bool found_inf_read = false;   // the host has read found_inf
  bool found_inf_value = false;  // what it read
  // The flag's host copy, started where it became final (not in graph_safe mode), so
  // that its read need not wait for the kernels queued after that point.
  PendingFlagRead found_inf_on_host;
  bool had_gradients = false;    // unscale_/step found at least one defined gradient
  // The flag is evidence about this iteration: gradients were checked, or a found_inf
  // hook (another rank's check) ran on it. An update() with no evidence grows nothing.
  bool checked = false;
  // What a scaler-aware optimizer divides its gradients by when they were clipped but
  // left scaled in memory (clip_grad_norm_): the scale over the clip coefficient, on the
  // scale's device. Undefined when the gradients hold their true values.
  at::Tensor grad_scale;
  // A scaler-aware step that the update counts on the device (NOTE: [Steps counted by the
  // update] in scale_rule.h).
  bool counted_by_update = false;
  // A scaler-aware step whose outcome the host has not read yet, and its parameters, for
  // the overflow report. They are held weakly: a strong copy of each, at every step, would
  // cost what the step's check does (for a tensor Python owns, its Python object's count
  // too), while the report, which inspects them only when the flag is set, can do without
  // a parameter that is gone by then.
  bool outcome_deferred = false;
  std::vector<std::vector<WeakTensor>> deferred_params;
};

// The stage machine. The check_* functions throw c10::Error for a call out of order and
// change nothing.
class OptimizerRecords {
 public:
  // The record of `key`, created ready on first use; c10::ValueError for the null key.
  OptimizerRecord& at(OptimizerKey key) {
    TORCH_CHECK_VALUE(key, "GradScaler: an OptimizerView's key must not be null: use the "
                           "optimizer's address (&optimizer). Nothing was changed.");
    const auto inserted = records_.try_emplace(key);
    if (inserted.second) {
      inserted.first->second.ordinal = static_cast<int>(records_.size()) - 1;
    }
    return inserted.first->second;
  }
  // The record of `key`, or null if the optimizer was not seen in this iteration.
  const OptimizerRecord* find(OptimizerKey key) const;
  OptimizerRecord* find(OptimizerKey key);

  static void check_can_unscale(const OptimizerRecord& record);
  static void check_can_step(const OptimizerRecord& record);

  // Makes the iteration's flags on `device` (the scale's), eagerly, before any capture
  // (no-op once made).
  void place(const at::Device& device);
  // The iteration's flags, which the update takes and sets back to 0: float32, one entry
  // per ordinal; undefined until placed.
  const at::Tensor& flags() const { return flags_; }
  // The flag a check of `record` raises: its entry of flags(). An iteration with more
  // optimizers than flags() holds grows them, the flags of this iteration kept, and every
  // record's found_inf is then the new entry; c10::Error while the flags' device is being
  // captured into a CUDA graph, where they cannot grow.
  const at::Tensor& flag_of(const OptimizerRecord& record);
  // Sets every flag back to 0, where an iteration ends without the update kernel.
  void clear_flags() { flags_.zero_(); }
  // The last outcome of each ordinal's step counted by the update (1: skipped; NOTE:
  // [Steps counted by the update] in scale_rule.h): float32, as many entries as flags(),
  // beside them.
  const at::Tensor& step_outcomes() const { return outcomes_; }
  // The ordinals of this iteration whose steps the update counts.
  SteppedOrdinals counted_by_update() const;

  // Whether any optimizer's overflow was checked in this iteration.
  bool any_checked() const;

  // Whether a flag of this iteration that the host has read was set.
  bool any_read_found() const;

  // Every record with its key, for reading the flags nobody has read yet.
  template <typename F>
  void for_each(F&& f) {
    for (auto& entry : records_) {
      f(entry.first, entry.second);
    }
  }

  // update(): every optimizer returns to ready.
  void clear() { records_.clear(); }

 private:
  // `store`: float32, 2 rows, the flags then the step outcomes.
  void make_flags(at::Tensor store);

  std::unordered_map<OptimizerKey, OptimizerRecord> records_;
  at::Tensor store_;     // flags_ and outcomes_ in one allocation, grown together
  at::Tensor flags_;     // store_'s row 0
  at::Tensor outcomes_;  // store_'s row 1
  // flags_'s entries, made once with it rather than by a select() per check.
  std::vector<at::Tensor> flag_entries_;
};

}  // namespace detail
}  // namespace amp
}  // namespace lucid
