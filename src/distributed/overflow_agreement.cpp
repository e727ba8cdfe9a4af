// SPDX-License-Identifier: BSD-3-Clause
// OverflowAgreement front code: checks, the one all-reduce, its bounded wait, and the
// error a rank reports when its peers do not answer. No transport of its own: c10d's.
//
// NOTE: [Overflow agreement]
// What is agreed: GradScaler calls its found-inf hook with each optimizer's overflow flag
// (float32, 1 element, on the scale's device) right after unscaling that optimizer's
// gradients and before anything reads the flag. The hook all-reduces the flag with MAX
// over the group, in place, so every rank sees "some rank overflowed". From there the
// scaler's own rules do the rest, identically on every rank: step() skips that
// optimizer, update() backs the scale off (or counts a clean update and grows). Scales
// therefore stay bit-identical across ranks, and so do replicated parameters.
//
// Why it matters most when gradients are sharded (ZeRO/FSDP): a rank unscales and checks
// only the shard it owns, so an inf in rank 1's shard is invisible to rank 0. Without the
// agreement rank 0 would step and keep its scale while rank 1 skips and halves its own;
// the shards then belong to different iterations. With replicated gradients (data
// parallel after a gradient all-reduce) an inf/NaN reaches every rank through the sum, so
// the flags normally agree already; the agreement turns "normally" into a guarantee (a
// rank that unscales before reducing, or changes its gradients locally, e.g. by local
// accumulation) for one 4-byte all-reduce.
//
// Cost and placement: one all-reduce per optimizer per iteration (one per step with a
// single optimizer), on the flag's device: Gloo on the CPU, NCCL on CUDA. The flag is not
// read back here; GradScaler::step reads it once, as it always does. In sharded mode
// clip_grad_norm_'s all-reduce carries the norm's partial beside the flag (NOTE: [Sharded
// norm agreement] in src/amp/norm_agreement.h): still one per optimizer per iteration.
//
// What every rank must do alike: call scale() every iteration before unscale_/step (the
// flag exists once the scale does; a rank that owns no gradients of an optimizer still
// takes part, with a clean flag), and unscale_/step the same optimizers in the same
// order. A rank that skips a call leaves its peers waiting: they give up after `timeout`
// with a c10::Error naming their rank, never hang. After such an error the group is
// unusable (the collective sequence is broken); end the run.
//
// Waiting: by default the host waits, bounded by `timeout`; on CUDA this is one host
// wait, which GradScaler::step's read of the flag would need anyway. A CPU flag waits in
// Work::wait(timeout). A device flag is polled (wait_until_completed below), because
// ProcessGroupNCCL's Work::wait(timeout) checks for completion only every millisecond,
// which would add up to a millisecond to every step (docs/PERFORMANCE.md, Distributed).
// In graph-safe mode a non-CPU flag is only stream-ordered after the collective
// (Work::wait() without a timeout: ProcessGroupNCCL makes the current stream wait on its
// own, without blocking the host; with a timeout it would busy-wait on the host), so the
// agreement adds no host synchronisation and can be captured in a CUDA graph once the
// communicator exists (run one step before capturing).

#include <lucid/distributed/overflow_agreement.h>

#include "amp/norm_agreement.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <exception>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lucid {
namespace distributed {
namespace {

c10d::AllreduceOptions allreduce_options(c10d::ReduceOp::RedOpType op) {
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp(op);
  return opts;
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// Polls `work` until it completes (spinning first: an agreement takes tens of
// microseconds once the step's kernels are done, then sleeping briefly) and fails once
// `deadline` has passed. Completion includes failure: Work::wait then rethrows it, and
// orders the current stream after the collective.
void wait_until_completed(c10d::Work& work, std::chrono::steady_clock::time_point deadline,
                          std::chrono::milliseconds timeout) {
  for (int polls = 0; !work.isCompleted(); ++polls) {
    TORCH_CHECK(std::chrono::steady_clock::now() < deadline, "the all-reduce did not complete");
    if (polls < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  work.wait(timeout);
}

// All-reduce number `number` of `agreement`, in place, waited for as its options say; a
// failure or a timeout throws the c10::Error that names this rank.
void all_reduce(const OverflowAgreement& agreement, int64_t number,
                std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& reduce,
                bool on_cpu) {
  const OverflowAgreementOptions& options = agreement.options();
  const bool host_wait = !options.graph_safe() || on_cpu;
  const auto start = std::chrono::steady_clock::now();
  std::string cause;
  try {
    c10::intrusive_ptr<c10d::Work> work = agreement.group()->allreduce(tensors, reduce);
    if (host_wait && on_cpu) {
      work->wait(options.timeout());
    } else if (host_wait) {
      wait_until_completed(*work, start + options.timeout(), options.timeout());
    } else {
      work->wait();  // stream-ordered only; the backend's own timeout bounds it
    }
    return;
  } catch (const c10::Error& e) {
    cause = e.what_without_backtrace();
  } catch (const std::exception& e) {
    cause = e.what();
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  const bool timed_out = host_wait && waited >= options.timeout();
  TORCH_CHECK(false, "lucid::distributed: rank ", agreement.rank(), " of ", agreement.world_size(),
              ": overflow agreement all-reduce #", number,
              timed_out ? " timed out after " : " failed after ", seconds(waited), " s (timeout ",
              seconds(options.timeout()),
              " s); a peer rank may have died or stopped calling step(). Every rank must "
              "call scale(), unscale_() and step() for the same optimizers in the same order; "
              "the group cannot be used further, end the run. Cause: ",
              cause);
}

}  // namespace

OverflowAgreement::OverflowAgreement(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                     OverflowAgreementOptions options)
    : group_(std::move(group)), options_(options) {
  TORCH_CHECK_VALUE(group_, "OverflowAgreement needs a c10d process group, got a null one.");
  TORCH_CHECK_VALUE(options_.timeout().count() > 0,
                    "OverflowAgreementOptions: timeout must be > 0 ms, got ",
                    options_.timeout().count(), " ms.");
}

int OverflowAgreement::rank() const { return group_->getRank(); }

int OverflowAgreement::world_size() const { return group_->getSize(); }

void OverflowAgreement::agree_(torch::Tensor& found_inf) {
  amp::detail::check_agreement_operand(found_inf, "overflow flag", "OverflowAgreement::agree_");
  // A 1-element view shares the flag's storage, so the in-place all-reduce lands in it.
  std::vector<at::Tensor> tensors{found_inf.view({1})};
  all_reduce(*this, ++all_reduces_, tensors, allreduce_options(c10d::ReduceOp::MAX),
             found_inf.is_cpu());
}

// The payload and its reading are the core's (NOTE: [Sharded norm agreement] in
// src/amp/norm_agreement.h), shared with the Python binding; the all-reduce is c10d's.
void OverflowAgreement::agree_with_norm_(torch::Tensor& found_inf, torch::Tensor& norm_partial,
                                         double norm_type) {
  amp::detail::NormAgreementPayload payload = amp::detail::norm_agreement_payload(
      found_inf, norm_partial, norm_type, "OverflowAgreement::agree_with_norm_");
  std::vector<at::Tensor> tensors{payload.values};
  all_reduce(*this, ++all_reduces_, tensors,
             allreduce_options(payload.reduce_max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM),
             found_inf.is_cpu());
  amp::detail::apply_norm_agreement(tensors[0], found_inf, norm_partial, norm_type);
}

std::shared_ptr<OverflowAgreement> bind_to_group(amp::GradScaler& scaler,
                                                 c10::intrusive_ptr<c10d::ProcessGroup> group,
                                                 OverflowAgreementOptions options) {
  auto agreement = std::make_shared<OverflowAgreement>(std::move(group), options);
  scaler.set_found_inf_hook(agreement);
  return agreement;
}

}  // namespace distributed
}  // namespace lucid
