// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: what every fused optimizer's step() shares: the closure, gathering each
// parameter group into per-device, per-dtype buckets, fetching or making per-parameter
// state, and routing one launch to its device's table (fused_backend.h).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <lucid/optim/fused_optimizer.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "optim/fused_kernel_params.h"

namespace lucid {
namespace optim {
namespace detail {

// The parameters of one group that have a gradient, on one device with one dtype.
// `params` and `grads` are contiguous: a non-contiguous parameter is worked on through a
// contiguous copy that write_back() copies into it afterwards.
struct Bucket {
  at::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> originals;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;

  void write_back() const;
};

// Checks every gradient of the group (dense; float32 or float64; same dtype and device as
// its parameter; on the CPU or CUDA) before anything changes, then buckets them.
std::vector<Bucket> bucket_group(const torch::optim::OptimizerParamGroup& group,
                                 const char* optimizer_name);

// One launch over a bucket's lists (AdamList / SgdList order, step counters last) on the
// bucket's device's table; `scale` and `found_inf` as in ScalerAware::set_grad_scaling.
void launch_adam(const Bucket& bucket, const std::vector<std::vector<at::Tensor>>& lists,
                 const AdamHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf);
void launch_sgd(const Bucket& bucket, const std::vector<std::vector<at::Tensor>>& lists,
                const SgdHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf);

// The same launches over lists that are all contiguous already, on `device`: nothing to
// copy back afterwards.
void launch_adam(const at::Device& device, const std::vector<std::vector<at::Tensor>>& lists,
                 const AdamHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf);
void launch_sgd(const at::Device& device, const std::vector<std::vector<at::Tensor>>& lists,
                const SgdHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf);

// The device copies of the schedulable hyper-parameters (NOTE: [Hyper-parameters on the
// device]) for a bucket on a CUDA device, brought up to these values; null for the CPU,
// whose kernels read the host values of their launch.
inline const double* live_values(LiveHyperParameters& live, const Bucket& bucket, double lr,
                                 double weight_decay, double momentum) {
  if (!bucket.device.is_cuda()) {
    return nullptr;
  }
  return live.on(bucket.device, lr, weight_decay, momentum).data_ptr<double>();
}

// A float32 0-dim step counter on `device`.
at::Tensor new_step_counter(const at::Device& device);

// `t` on `device` (state loaded from an archive arrives on the CPU).
at::Tensor on_device(const at::Tensor& t, const at::Device& device);

// What a fused step() does before its kernels: runs the closure (with grad mode on) if
// there is one, and returns its loss.
inline torch::Tensor run_closure(const torch::optim::Optimizer::LossClosure& closure) {
  if (!closure) {
    return {};
  }
  at::AutoGradMode enable_grad(true);
  return closure();
}

// Calls fn(options, bucket) for every bucket of every parameter group, after
// check(options) for the group.
template <typename Options, typename Check, typename Fn>
void for_each_bucket(std::vector<torch::optim::OptimizerParamGroup>& groups, const char* name,
                     Check check, Fn fn) {
  for (auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    check(options);
    for (const Bucket& bucket : bucket_group(group, name)) {
      fn(options, bucket);
    }
  }
}

// `p`'s state in `state`, keyed by the address of p's TensorImpl as
// torch::optim::Optimizer::state() is (so torch::optim's serialize helpers save and load
// it), made on first use with a step counter on p's device and then
// init(state) for the optimizer's own buffers; the counter is kept a float32 on p's
// device (state loaded from an archive arrives on the CPU).
template <typename State, typename StateMap, typename Init>
State& param_state(StateMap& state, const at::Tensor& p, Init init) {
  auto& slot = state[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto fresh = std::make_unique<State>();
    fresh->step(new_step_counter(p.device()));
    init(*fresh);
    slot = std::move(fresh);
  }
  auto& s = static_cast<State&>(*slot);
  s.step(on_device(s.step(), p.device()).to(at::kFloat));
  return s;
}

}  // namespace detail
}  // namespace optim
}  // namespace lucid
