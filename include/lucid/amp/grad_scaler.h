#pragma once

// lucid::amp::GradScaler: dynamic loss scaling for mixed-precision training.
// The contract is ../shared/spec (seed page + cpp-api.md); NOTE: [Scaler state on the
// device] in src/amp/grad_scaler.cpp says where the scale lives and why.

#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace lucid {
namespace amp {

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

  /// Keys: scale, growth_factor, backoff_factor, growth_interval, growth_tracker.
  std::map<std::string, double> state_dict() const;
  /// Loads a state_dict; a missing key or invalid value throws c10::ValueError and
  /// leaves the scaler unchanged.
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  struct PerOptimizer {
    OptimizerStage stage = OptimizerStage::kReady;
    torch::Tensor found_inf;  // float32, 1 element, on the scale's device
  };

  void lazy_init_(const at::Device& device);
  void unscale_checked_(torch::optim::Optimizer& optimizer, PerOptimizer& record);
  void check_checked_(torch::optim::Optimizer& optimizer, PerOptimizer& record);
  std::optional<torch::Tensor> step_scaler_aware_(torch::optim::Optimizer& optimizer,
                                                  PerOptimizer& record);
  PerOptimizer& record_for_(const torch::optim::Optimizer& optimizer);
  int64_t growth_tracker_value_() const;

  GradScalerOptions options_;
  // Host copies used until the device tensors exist (NOTE: [Scaler state on the device]).
  float pending_scale_;
  int64_t pending_growth_tracker_ = 0;
  torch::Tensor scale_;           // float32, 0-dim, on the device of the first output
  torch::Tensor growth_tracker_;  // int32, 0-dim, beside scale_
  std::unordered_map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
  FoundInfHook found_inf_hook_;
};

}  // namespace amp
}  // namespace lucid
