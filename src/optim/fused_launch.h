// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: what every fused optimizer's step() shares: the closure, gathering each
// parameter group into per-device, per-dtype buckets, fetching or making per-parameter
// state, and routing one launch to its device's table (fused_backend.h).

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <lucid/optim/fused_optimizer.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <vector>

#include "optim/fused_kernel_params.h"

namespace lucid {
namespace optim {
namespace detail {

// NOTE: [Launch layout] A fused kernel walks every tensor of a parameter (the parameter,
// its gradient, its state) from its data pointer over the parameter's element count, and
// takes element i of each at the same offset. So the tensors of a launch are
// non-overlapping and dense, and each gradient and state tensor has its parameter's
// sizes, strides, dtype and device: it is `launchable` with it. A parameter that is not
// dense goes through a contiguous copy, and a gradient or state of another layout through
// a copy in its parameter's; parameters and states are copied back after the launch.
// Sizes, dtypes or devices that differ from the parameter's are refused before anything
// changes, naming the parameter, where torch.optim's update raises too. Each step checks
// this on the tensors it is handed, so a tensor resized or replaced in place since the
// last step (set_, resize_, .data =) is seen.
inline bool launchable(const at::Tensor& param, const at::Tensor& t) {
  return t.sizes() == param.sizes() && t.strides() == param.strides() &&
         t.scalar_type() == param.scalar_type() && t.device() == param.device();
}

// Throws unless `t` (`what` of parameter `index` of param group `group`) is a plain
// tensor with the sizes, dtype and device of `param`.
void check_like_param(const at::Tensor& param, const at::Tensor& t, const char* optimizer,
                      const char* what, size_t group, size_t index);

// Throws unless the step counter `t` of parameter `index` of param group `group` is one
// float32 element on `param`'s device.
void check_step_counter(const at::Tensor& param, const at::Tensor& t, const char* optimizer,
                        size_t group, size_t index);

// The parameters of one group that have a gradient, on one device with one dtype, laid
// out for a launch (NOTE: [Launch layout]).
struct Bucket {
  at::Device device;
  at::ScalarType dtype;
  size_t group;                  // the param group's index, for messages
  std::vector<size_t> index;     // each parameter's index in its param group
  std::vector<size_t> position;  // and in the list bucket_params was given
  std::vector<at::Tensor> originals;
  std::vector<at::Tensor> params;                         // the parameter or its contiguous copy
  std::vector<at::Tensor> grads;                          // launchable with params
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (tensor, launch copy) to write back

  // The launch tensor of state `t` (`what`) of the bucket's k-th parameter: `t`, or a copy
  // laid out as the parameter's launch tensor. Throws as check_like_param.
  at::Tensor state(size_t k, const at::Tensor& t, const char* optimizer, const char* what);
  // Copies every launch copy back into its tensor.
  void write_back() const;
};

// Checks every parameter in `params` and its gradient (plain, dense; float32 or float64;
// the gradient with the parameter's sizes, dtype and device; on the CPU or CUDA) before
// anything changes, then buckets them by device and dtype, in first-seen order. Every
// parameter must have a gradient; `index[i]` is params[i]'s index in param group `group`.
std::vector<Bucket> bucket_params(const std::vector<at::Tensor>& params,
                                  const std::vector<size_t>& index, size_t group,
                                  const char* optimizer_name);

// bucket_params over the parameters of `group` (param group `group_index`) that have a
// gradient.
std::vector<Bucket> bucket_group(const torch::optim::OptimizerParamGroup& group, size_t group_index,
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

// One step over every parameter group: check(options) and the buckets of each group,
// then prepare(options, bucket) for every bucket, which checks the state and returns its
// launch; the launches run only once everything is checked, so an error leaves every
// parameter and state as it was.
template <typename Options, typename Check, typename Prepare>
void step_buckets(std::vector<torch::optim::OptimizerParamGroup>& groups, const char* name,
                  Check check, Prepare prepare) {
  std::vector<std::pair<const Options*, Bucket>> buckets;
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& options = static_cast<const Options&>(groups[g].options());
    check(options);
    for (Bucket& bucket : bucket_group(groups[g], g, name)) {
      buckets.emplace_back(&options, std::move(bucket));
    }
  }
  std::vector<std::function<void()>> launches;
  launches.reserve(buckets.size());
  for (auto& [options, bucket] : buckets) {
    launches.push_back(prepare(*options, bucket));
  }
  for (const auto& launch : launches) {
    launch();
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
