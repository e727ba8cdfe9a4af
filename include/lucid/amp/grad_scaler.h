// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// lucid::amp::GradScaler: dynamic loss scaling for mixed-precision training, the C++
/// form of PyTorch's torch.amp.GradScaler (docs/behaviour.md). NOTE: [Scaler state
/// on the device] in src/amp/scale_schedule.h says where the scale lives and why.
///
/// This header is the front for torch::optim::Optimizer; the scaler's state lives in an
/// opaque core (src/amp/scaler_core.h) that works on OptimizerViews, so that its layout can
/// change without changing this class's size or users' binaries.

#include <lucid/amp/diagnostics.h>
#include <lucid/amp/grad_scaler_options.h>
#include <lucid/amp/optimizer_view.h>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch {
namespace serialize {
class OutputArchive;
class InputArchive;
}  // namespace serialize
}  // namespace torch

namespace lucid {
namespace amp {
namespace detail {
class ScalerCore;
}  // namespace detail

/// Dynamic loss scaler: scale the loss, unscale and check the gradients, skip the step
/// on overflow, and adapt the scale in a sawtooth.
class GradScaler {
 public:
  /// Builds a scaler; throws c10::ValueError for an invalid option.
  explicit GradScaler(GradScalerOptions options = {});

  /// Not copyable: a scaler holds the stage and flag of every optimizer it has seen.
  GradScaler(const GradScaler&) = delete;
  /// Not copyable.
  GradScaler& operator=(const GradScaler&) = delete;
  /// Takes over another scaler's state; the moved-from scaler may only be destroyed or
  /// assigned to.
  GradScaler(GradScaler&&) noexcept;
  /// Takes over another scaler's state; the moved-from scaler may only be destroyed or
  /// assigned to.
  GradScaler& operator=(GradScaler&&) noexcept;
  /// Frees the scaler's state.
  ~GradScaler();

  /// Returns `outputs * scale`, at least float32, keeping the autograd graph.
  torch::Tensor scale(const torch::Tensor& outputs);
  /// Scales each tensor on its own device; same structure as the input.
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  /// Divides the optimizer's gradients by the scale in place and records overflow.
  void unscale_(torch::optim::Optimizer& optimizer);

  /// unscale_ and torch::nn::utils::clip_grad_norm_ over the optimizer's parameters in one
  /// read pass: the stage moves to unscaled and step() then uses the unscaled, clipped
  /// gradients. Returns the total norm of the unscaled gradients as a float32 0-dim tensor
  /// on the scale's device, without a host synchronisation. A lucid::optim fused optimizer
  /// gets the clip folded into its own step and its `.grad` stays scaled in memory; any
  /// other optimizer's gradients are written once, as grad * (coefficient / scale). A
  /// non-finite norm is an overflow: the step is skipped and the norm returned as it is.
  /// Errors: those of unscale_, and c10::ValueError for `max_norm` not finite and > 0 or
  /// `norm_type` not > 0 (nothing changed). Norms 2 and inf are fused; others take ATen
  /// operations. Disabled: lucid::amp::clip_grad_norm_ over the parameters.
  torch::Tensor clip_grad_norm_(torch::optim::Optimizer& optimizer, double max_norm,
                                double norm_type = 2.0);

  /// Unscales if needed, then steps unless the gradients overflowed (then nullopt).
  std::optional<torch::Tensor> step(torch::optim::Optimizer& optimizer);
  /// As above; a closure is refused while the scaler is enabled.
  std::optional<torch::Tensor> step(torch::optim::Optimizer& optimizer,
                                    torch::optim::Optimizer::LossClosure closure);

  /// Backs off or grows the scale (or sets `new_scale`) and returns every optimizer
  /// to the ready stage.
  void update(std::optional<double> new_scale = std::nullopt);

  /// The current scale (reads it back from its device); 1.0 when disabled.
  double get_scale() const;
  /// The scale as the 0-dim float32 device tensor it lives in (undefined until the first
  /// scale(), unscale_() or step()); for kernels that read it without a host sync.
  const torch::Tensor& scale_tensor() const;
  /// Whether the scaler scales at all.
  bool is_enabled() const;
  /// The options the scaler was built with (growth and backoff follow load_state_dict).
  const GradScalerOptions& options() const;
  /// The stage of `optimizer` in the current iteration (kReady if never seen).
  OptimizerStage stage(const torch::optim::Optimizer& optimizer) const;

  /// Installs `hook` (amp::FoundInfHook), called with each optimizer's overflow flag
  /// before anything reads it and, where it combines norms, with clip_grad_norm_'s norm
  /// partial; it replaces any hook installed before, and nullptr removes it. The scaler
  /// shares the hook's ownership.
  void set_found_inf_hook(std::shared_ptr<FoundInfHook> hook);

  // ---- Any optimizer, through a view (include/lucid/amp/optimizer_view.h) -------------
  /// unscale_ for the optimizer `view` describes (same rules as for a C++ optimizer).
  void unscale_(const OptimizerView& view);
  /// clip_grad_norm_ for the optimizer `view` describes.
  torch::Tensor clip_grad_norm_(const OptimizerView& view, double max_norm, double norm_type = 2.0);
  /// step for the optimizer `view` describes: runs `view.step` unless its gradients
  /// overflowed. Returns whether it ran (always true in graph_safe mode, where skipping
  /// happens on the device).
  bool step(const OptimizerView& view);
  /// The stage of the optimizer with view key `key` (kReady if never seen).
  OptimizerStage stage(OptimizerKey key) const;
  /// step_skipped for the optimizer with view key `key`.
  bool step_skipped(OptimizerKey key) const;
  /// found_inf for the optimizer with view key `key`.
  torch::Tensor found_inf(OptimizerKey key) const;
  /// overflowed for the optimizer `view` describes.
  bool overflowed(const OptimizerView& view);

  /// Keys: scale, growth_factor, backoff_factor, growth_interval, growth_tracker; and,
  /// only where a guard is on, min_scale, max_scale, hysteresis and overflow_tracker.
  std::map<std::string, double> state_dict() const;
  /// Loads a state_dict; a missing key or invalid value throws c10::ValueError and
  /// leaves the scaler unchanged. Accepts PyTorch's `_growth_tracker` for `growth_tracker`;
  /// guard keys are optional (absent: the scaler keeps its own guards).
  void load_state_dict(const std::map<std::string, double>& state);

  // ---- Checkpoints (src/amp/serialize.cpp) ----------------------------------------------
  /// Writes the whole scaler (state, options but `enabled`, counters) under the key
  /// "lucid_amp_grad_scaler" of `archive`, with a format version and a checksum.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote. A missing, corrupt or mismatched entry throws c10::Error
  /// (c10::ValueError for an invalid value) and leaves the scaler unchanged.
  void load(torch::serialize::InputArchive& archive);

  // ---- Diagnostics (include/lucid/amp/diagnostics.h, src/amp/scaler_diagnostics.cpp) ----
  /// Counters of steps and scale changes; logically const. Reads the overflow flags the
  /// host has not seen yet, and the counts every update made on the device (one read):
  /// the schedule's counters and the streak, and in graph_safe mode or under a CUDA
  /// graph the steps too, replays included.
  ScalerCounters counters() const;
  /// Whether the last step() of `optimizer` skipped optimizer.step() (false if it never
  /// stepped). Survives update(): an LR scheduler asks after the iteration. In graph_safe
  /// mode it reads the flag of the last step (or replay) from the device.
  bool step_skipped(const torch::optim::Optimizer& optimizer) const;
  /// The overflow flag of `optimizer` in this iteration (float32, 0-dim, on the scale's
  /// device; non-zero: its step is or was skipped), not read back: for device-side logic
  /// that must follow skipped steps, such as a schedule inside a captured CUDA graph.
  /// Valid after unscale_, clip_grad_norm_ or step of `optimizer` and until update(),
  /// which sets it back to 0 for the next iteration (read it before update(); PyTorch's
  /// scaler leaves an old iteration's flag as it was); throws c10::Error otherwise.
  torch::Tensor found_inf(const torch::optim::Optimizer& optimizer) const;
  /// Whether `optimizer`'s gradients held inf/NaN in this iteration (false before
  /// unscale_/step). Reads its flag once (4 bytes) if step() has not.
  bool overflowed(const torch::optim::Optimizer& optimizer);
  /// The report of the last iteration that overflowed (nullopt if none has).
  const std::optional<OverflowReport>& last_overflow() const;
  /// The step log: what each of the last kStepLogCapacity updates that ran the schedule
  /// did (the scale used and after, overflow, the change, the clip norm), oldest first,
  /// recorded on the device by the update itself, captured and replayed updates included.
  /// Never waits for the device unless `wait`: it returns what its last copy of the log
  /// held once that copy has landed, and starts the next copy (so on a GPU a call sees
  /// the updates queued before the previous call); `wait` copies now and waits, so every
  /// update queued so far is in. Empty before the first scale(); load() clears it (the
  /// checkpoint's run goes on from its counters), load_state_dict() keeps it. Logically
  /// const.
  std::vector<StepRecord> history(bool wait = false) const;
  /// Called on every backoff, after update() applied it; nullptr removes it. While set,
  /// update() reads the flags the host has not seen and, when one is set, what the update
  /// did (the scale before and after, its counts).
  void set_backoff_callback(BackoffCallback callback);
  /// Names parameters for the overflow report, e.g. `set_parameter_names(
  /// model->named_parameters())`; `prefix` is prepended. Held weakly.
  void set_parameter_names(const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                           const std::string& prefix = "");
  /// Names one parameter for the overflow report.
  void set_parameter_name(const torch::Tensor& parameter, const std::string& name);

 private:
  detail::ScalerCore& core();
  const detail::ScalerCore& core() const;

  std::unique_ptr<detail::ScalerCore> core_ptr_;  // the whole state (pimpl)
};

}  // namespace amp
}  // namespace lucid
