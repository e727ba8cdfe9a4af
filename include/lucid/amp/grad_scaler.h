#pragma once

// lucid::amp::GradScaler: dynamic loss scaling for mixed-precision training.
// The contract is ../shared/spec (seed page + cpp-api.md); NOTE: [Scaler state on the
// device] in src/amp/grad_scaler.cpp says where the scale lives and why.

#include <lucid/amp/diagnostics.h>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
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
struct ScalerSnapshot;
}  // namespace detail

/// Options of a GradScaler; validated once, by the GradScaler constructor.
struct GradScalerOptions {
  /// Initial loss scale: finite and > 0.
  TORCH_ARG(double, init_scale) = 65536.0;
  /// Multiplier after `growth_interval` overflow-free updates: finite and > 1.
  TORCH_ARG(double, growth_factor) = 2.0;
  /// Multiplier after an overflow: in (0, 1).
  TORCH_ARG(double, backoff_factor) = 0.5;
  /// Overflow-free updates needed before the scale grows: >= 1.
  TORCH_ARG(int64_t, growth_interval) = 2000;
  /// When false the scaler is a transparent pass-through.
  TORCH_ARG(bool, enabled) = true;
  /// Opt-in: step() never reads the overflow flag back; skipping happens on the device
  /// inside a lucid::optim fused optimizer (any other optimizer is refused), and step()
  /// returns the optimizer's value even when the update was skipped. Lets a whole
  /// training step be captured in a CUDA graph. Off: the seed's behaviour.
  TORCH_ARG(bool, graph_safe) = false;
  /// Guard (0 = off): the smallest scale allowed. A backoff that would take the scale
  /// below it throws c10::Error ("the loss is diverging") and changes nothing, instead of
  /// skipping every step while the scale collapses. Finite, >= 0, <= init_scale.
  TORCH_ARG(double, min_scale) = 0.0;
  /// Guard (+inf = off): growth stops at this scale (clamped on the device). > 0, at most
  /// float32's largest value (or +inf), >= init_scale and >= min_scale.
  TORCH_ARG(double, max_scale) = std::numeric_limits<double>::infinity();
  /// Guard (1 = off): back off only after this many consecutive overflowing updates
  /// (Megatron-LM's and DeepSpeed's hysteresis); the overflowing steps are still skipped.
  /// In [1, 2147483647].
  TORCH_ARG(int64_t, hysteresis) = 1;
};

/// Where one optimizer is in the current iteration (seed: ready -> unscaled -> stepped).
enum class OptimizerStage { kReady, kUnscaled, kStepped };

/// Dynamic loss scaler: scale the loss, unscale and check the gradients, skip the step
/// on overflow, and adapt the scale in a sawtooth.
class GradScaler {
 public:
  /// Builds a scaler; throws c10::ValueError for an invalid option.
  explicit GradScaler(GradScalerOptions options = {});

  GradScaler(const GradScaler&) = delete;
  GradScaler& operator=(const GradScaler&) = delete;
  GradScaler(GradScaler&&) = default;
  GradScaler& operator=(GradScaler&&) = default;

  /// Returns `outputs * scale`, at least float32, keeping the autograd graph.
  torch::Tensor scale(const torch::Tensor& outputs);
  /// Scales each tensor on its own device; same structure as the input.
  std::vector<torch::Tensor> scale(const std::vector<torch::Tensor>& outputs);

  /// Divides the optimizer's gradients by the scale in place and records overflow.
  void unscale_(torch::optim::Optimizer& optimizer);

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
  const torch::Tensor& scale_tensor() const { return scale_; }
  /// Whether the scaler scales at all.
  bool is_enabled() const;
  /// The options the scaler was built with (growth and backoff follow load_state_dict).
  const GradScalerOptions& options() const;
  /// The stage of `optimizer` in the current iteration (kReady if never seen).
  OptimizerStage stage(const torch::optim::Optimizer& optimizer) const;

  /// Called with an optimizer's overflow flag (float32, 0-dim, on the scale's device; 0
  /// means clean) each time unscale_ or step computes it, before anything reads it. The
  /// hook may change the flag in place: a distributed binding all-reduces it (MAX) so
  /// that every rank skips and backs off together. Pass nullptr to remove it.
  using FoundInfHook = std::function<void(torch::Tensor& found_inf)>;
  void set_found_inf_hook(FoundInfHook hook);

  /// Keys: scale, growth_factor, backoff_factor, growth_interval, growth_tracker; and,
  /// only where a guard is on, min_scale, max_scale, hysteresis and overflow_tracker.
  std::map<std::string, double> state_dict() const;
  /// Loads a state_dict; a missing key or invalid value throws c10::ValueError and
  /// leaves the scaler unchanged. Accepts PyTorch's `_growth_tracker` for `growth_tracker`;
  /// guard keys are optional (absent: the scaler keeps its own guards).
  void load_state_dict(const std::map<std::string, double>& state);

  // ---- Checkpoints (src/amp/serialize.cpp) -------------------------------------------
  /// Writes the whole scaler (state, options but `enabled`, counters) under the key
  /// "lucid_amp_grad_scaler" of `archive`, with a format version and a checksum.
  void save(torch::serialize::OutputArchive& archive) const;
  /// Reads what save() wrote. A missing, corrupt or mismatched entry throws c10::Error
  /// (c10::ValueError for an invalid value) and leaves the scaler unchanged.
  void load(torch::serialize::InputArchive& archive);

  // ---- Diagnostics (include/lucid/amp/diagnostics.h, src/amp/diagnostics.cpp) ----------
  /// Counters of steps and scale changes. May read overflow flags the host has not seen
  /// yet (only those of optimizers that were unscale_'d but not stepped).
  ScalerCounters counters() const;
  /// Whether the last step() of `optimizer` skipped optimizer.step() (false if it never
  /// stepped). Survives update(): an LR scheduler asks after the iteration.
  bool step_skipped(const torch::optim::Optimizer& optimizer) const;
  /// Whether `optimizer`'s gradients held inf/NaN in this iteration (false before
  /// unscale_/step). Reads its flag once (4 bytes) if step() has not.
  bool overflowed(const torch::optim::Optimizer& optimizer);
  /// The report of the last iteration that overflowed (nullopt if none has).
  const std::optional<OverflowReport>& last_overflow() const;
  /// Called on every backoff, after update() applied it; nullptr removes it. While set,
  /// update() reads the flags the host has not seen and, on a backoff, the scale.
  void set_backoff_callback(BackoffCallback callback);
  /// Names parameters for the overflow report, e.g. `set_parameter_names(
  /// model->named_parameters())`; `prefix` is prepended. Held weakly.
  void set_parameter_names(const torch::OrderedDict<std::string, torch::Tensor>& named_parameters,
                           const std::string& prefix = "");
  /// Names one parameter for the overflow report.
  void set_parameter_name(const torch::Tensor& parameter, const std::string& name);

 private:
  struct PerOptimizer {
    OptimizerStage stage = OptimizerStage::kReady;
    torch::Tensor found_inf;  // float32, 1 element, on the scale's device
    bool found_inf_read = false;   // the host has read found_inf (step, overflowed, update)
    bool found_inf_value = false;  // what it read
  };

  // NOTE: [Diagnostics without host synchronisation] (src/amp/diagnostics.cpp).
  struct Diagnostics {
    ScalerCounters counters;  // as of the last resolved schedule update
    // The trackers as of the last resolved update, advanced on the host by the same rule
    // as the device (detail::next_scale_state); they say whether an update backed off or grew.
    int32_t growth_tracker = 0;
    int32_t overflow_tracker = 0;
    // Schedule updates whose outcome is not counted yet, in order: the flag is undefined
    // when the host knew `found`, else the combined device flag to read later.
    struct Pending {
      bool found = false;
      torch::Tensor flag;
    };
    std::vector<Pending> pending;
    std::unordered_map<const torch::optim::Optimizer*, bool> last_step_skipped;
    std::optional<OverflowReport> last_overflow;
    BackoffCallback on_backoff;
    struct Name {
      c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> param;
      std::string name;
    };
    std::unordered_map<const c10::TensorImpl*, Name> names;
  };

  void lazy_init_(const at::Device& device);
  // Checks the gradients' dtypes, places the scale and records the optimizer's overflow
  // flag, unscaling the gradients in place or (for a scaler-aware optimizer, which
  // unscales inside its own step) only reading them.
  enum class GradientPass { kUnscale, kCheckOnly };
  void record_overflow_(torch::optim::Optimizer& optimizer, PerOptimizer& record,
                        GradientPass pass);
  std::optional<torch::Tensor> step_scaler_aware_(torch::optim::Optimizer& optimizer,
                                                  PerOptimizer& record);
  PerOptimizer& record_for_(const torch::optim::Optimizer& optimizer);
  int64_t growth_tracker_value_() const;
  int64_t overflow_tracker_value_() const;

  // Guards (src/amp/guards.cpp).
  bool guarded_update_() const;
  void ensure_overflow_tracker_();
  void run_update_kernel_(at::Tensor& scale, at::Tensor& growth_tracker,
                          at::Tensor& overflow_tracker, const at::Tensor& found_inf) const;
  std::optional<BackoffEvent> update_on_device_();
  void update_on_host_();

  // State I/O (src/amp/serialize.cpp).
  detail::ScalerSnapshot snapshot_() const;
  void apply_(const detail::ScalerSnapshot& snapshot, const ScalerCounters* counters);

  // Diagnostics (src/amp/diagnostics.cpp).
  // `optimizer` is null where it may be gone (update() reading an unscale_-only flag).
  bool read_found_inf_(const torch::optim::Optimizer* optimizer, PerOptimizer& record);
  void note_step_(const torch::optim::Optimizer& optimizer, bool skipped);
  void note_overflow_(const torch::optim::Optimizer* optimizer);
  void note_schedule_update_(bool known, bool found, const at::Tensor& flag);
  bool predicts_backoff_(bool found) const;
  void resolve_pending_() const;
  void finish_iteration_();

  GradScalerOptions options_;
  // Host copies used until the device tensors exist (NOTE: [Scaler state on the device]).
  float pending_scale_;
  int64_t pending_growth_tracker_ = 0;
  int64_t pending_overflow_tracker_ = 0;
  torch::Tensor scale_;           // float32, 0-dim, on the device of the first output
  torch::Tensor growth_tracker_;  // int32, 0-dim, beside scale_
  // int32, 0-dim, beside scale_: consecutive overflows absorbed by hysteresis. Made only
  // when a guard needs it (guarded_update_()).
  torch::Tensor overflow_tracker_;
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
  FoundInfHook found_inf_hook_;
  mutable Diagnostics diag_;
};

}  // namespace amp
}  // namespace lucid
