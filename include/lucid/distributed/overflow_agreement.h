// SPDX-License-Identifier: BSD-3-Clause
#pragma once

/// @file
/// lucid::distributed::OverflowAgreement: every rank of a c10d process group takes the same
/// step decision. NOTE: [Overflow agreement] in src/distributed/overflow_agreement.cpp says
/// what is agreed, when, and what the ranks must do alike.

#include <lucid/amp/grad_scaler.h>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/arg.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <chrono>
#include <cstdint>
#include <memory>

namespace lucid {
namespace distributed {

/// Options of an OverflowAgreement; validated once, by its constructor.
struct OverflowAgreementOptions {
  /// How long a rank waits for the all-reduce before it gives up with a c10::Error that
  /// names the rank (a peer died, or stopped calling step()): > 0. The agreement comes
  /// right after the gradient collective, so healthy peers are at most one unscale apart.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(60);
  /// Graph-safe mode: a flag on an accelerator is only ordered on the current stream
  /// after the all-reduce (no host wait, nothing read back), so the agreement can be
  /// captured in a CUDA graph; a hang is then ended by the backend's own timeout (the
  /// group's, e.g. ProcessGroupNCCL's watchdog), not by `timeout`. CPU flags are always
  /// waited for on the host, with `timeout`.
  TORCH_ARG(bool, graph_safe) = false;
  /// Sharded mode, for runs in which each rank holds a disjoint shard of the parameters
  /// and their gradients (ZeRO/FSDP-like): GradScaler::clip_grad_norm_ then clips every
  /// rank's shard by the total norm over all ranks' gradients and returns that norm. The
  /// norm's partial travels in the flag's all-reduce (still one per call), and a
  /// non-finite norm anywhere skips the step on every rank. unscale_ and step agree the
  /// flag as in the default mode. Off (data parallel: every rank holds all the
  /// parameters, so its own norm is the total one already), clip_grad_norm_ returns this
  /// rank's own norm.
  TORCH_ARG(bool, sharded) = false;
};

/// Combines overflow flags across a c10d process group with one all-reduce (MAX) each,
/// on the flag's own device, and in sharded mode a gradient norm's partial with the flag
/// in the same all-reduce. It is a GradScaler's found-inf hook: bind it with
/// bind_to_group().
class OverflowAgreement final : public amp::FoundInfHook {
 public:
  /// Agrees over `group` (any c10d backend serving the flags' device: Gloo for CPU,
  /// NCCL for CUDA). Throws c10::ValueError for a null group or a timeout <= 0.
  explicit OverflowAgreement(c10::intrusive_ptr<c10d::ProcessGroup> group,
                             OverflowAgreementOptions options = {});

  /// Replaces `found_inf` (0-dim or 1-element float32, 0 = clean) in place by its maximum
  /// over the group. Every rank must call it the same number of times, in the same order.
  /// Throws c10::Error naming this rank when the all-reduce fails or times out.
  void agree_(torch::Tensor& found_inf) override;

  /// options().sharded(): a sharded run's clip_grad_norm_ agrees the norm's partial too.
  bool combines_norm() const override { return options_.sharded(); }

  /// Replaces `found_inf` by 1 where any rank's flag is non-zero (else 0) and
  /// `norm_partial` (a 1-element float32 tensor beside the flag; see
  /// amp::FoundInfHook::agree_with_norm_) by its sum over the group for a finite `norm_type`, or
  /// its maximum for inf, a NaN partial on any rank making it NaN on every rank; both in place,
  /// with one all-reduce. Same calling rules and errors as agree_(found_inf), the partial checked
  /// as the flag is (and on the flag's device); c10::ValueError for `norm_type` not > 0.
  void agree_with_norm_(torch::Tensor& found_inf, torch::Tensor& norm_partial,
                        double norm_type) override;

  /// This process's rank in the group.
  int rank() const;
  /// The number of ranks in the group.
  int world_size() const;
  /// All-reduces issued so far (one per agree_ or agree_with_norm_ call).
  int64_t all_reduces() const { return all_reduces_; }
  /// The group the flags are combined over.
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return group_; }
  /// The options the agreement was built with.
  const OverflowAgreementOptions& options() const { return options_; }

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  OverflowAgreementOptions options_;
  int64_t all_reduces_ = 0;
};

/// Binds `scaler` to `group`: each optimizer's overflow flag is all-reduced (MAX) across
/// the group right after unscaling, before the scaler reads it, so that a step skipped on
/// one rank is skipped on all and every rank's scale backs off and grows alike. With
/// `options.sharded()`, clip_grad_norm_ also clips by the norm over every rank's
/// gradients, agreed in the same all-reduce. Replaces any found-inf hook the scaler had;
/// scaler.set_found_inf_hook(nullptr) unbinds. The returned agreement is the scaler's
/// hook, shared (for its counters and options).
std::shared_ptr<OverflowAgreement> bind_to_group(amp::GradScaler& scaler,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 OverflowAgreementOptions options = {});

}  // namespace distributed
}  // namespace lucid
