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
#include "optim/kept_lists.h"

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
// device]) for a launch on a CUDA device, brought up to these values; null for the CPU,
// whose kernels read the host values of their launch.
inline const double* live_values(LiveHyperParameters& live, const at::Device& device, double lr,
                                 double weight_decay, double momentum) {
  if (!device.is_cuda()) {
    return nullptr;
  }
  return live.on(device, lr, weight_decay, momentum).data_ptr<double>();
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

// A C++ fused optimizer's launch lists, kept between steps, one KeptLists per param group
// (NOTE: [Kept launch lists] in kept_lists.h). A group's parameters are held, so that the
// TensorImpl addresses that key the optimizer's state are not reused while kept; so are
// its state tensors, and a state entry replaced since (load(), state() written) is told
// by its tensors' identity.
class KeptGroups {
  struct Group {
    std::vector<at::Tensor> params;  // held
    std::vector<int> bucket_of;      // each parameter's bucket; -1: it had no gradient
    KeptLists lists;
  };

 public:
  // The state lists of one param group's options: their count, and the tensor of list `s`
  // (step counter last) of a parameter's state.
  using StateCount = size_t (*)(const torch::optim::OptimizerOptions& options);
  using StateTensor = const at::Tensor& (*)(const torch::optim::OptimizerParamState& state,
                                            size_t s, size_t count);

  // Takes every group's parameters and gradients into the kept lists when nothing changed
  // since they were kept: the same groups and parameters, gradients where they were, the
  // same state tensors, each passing KeptLists::take. Otherwise gives back what it took
  // and returns false.
  template <typename StateMap>
  bool take(const std::vector<torch::optim::OptimizerParamGroup>& groups, const StateMap& state,
            StateCount state_count, StateTensor state_tensor) {
    if (groups.size() != groups_.size() || groups_.empty()) {
      return false;
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!take_group(groups_[g], groups[g], state, state_count, state_tensor)) {
        release();
        return false;
      }
    }
    return true;
  }

  KeptLists& lists(size_t g) { return groups_[g].lists; }
  void release() {
    for (Group& g : groups_) {
      g.lists.release();
    }
  }

  // What a step through the checked way records, kept (adopt()) once its launches ran:
  // each bucket's device, dtype, indices and state lists. A bucket that needed a copy (a
  // parameter, gradient or state tensor not launchable as it is) makes the whole record
  // unkeepable: such a step takes the checked way every time.
  class Record {
   public:
    explicit Record(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
      for (const auto& group : groups) {
        groups_.push_back(Group{group.params(), std::vector<int>(group.params().size(), -1), {}});
      }
    }
    // `states`: the bucket's state lists (the optimizer's own tensors, not launch copies),
    // step counters last.
    void add(const Bucket& bucket, std::vector<std::vector<at::Tensor>> states) {
      for (size_t k = 0; k < bucket.originals.size(); ++k) {
        keepable_ = keepable_ && bucket.params[k].is_same(bucket.originals[k]) &&
                    bucket.grads[k].is_same(bucket.originals[k].grad());
      }
      keepable_ = keepable_ && bucket.copies.empty();
      Group& g = groups_[bucket.group];
      for (size_t i : bucket.index) {
        g.bucket_of[i] = static_cast<int>(g.lists.buckets().size());
      }
      g.lists.keep(bucket.device, bucket.dtype, bucket.index, std::move(states));
    }

   private:
    friend class KeptGroups;
    std::vector<Group> groups_;
    bool keepable_ = true;
  };
  // Keeps what `record` recorded, if it is keepable; else keeps nothing.
  void adopt(Record&& record) {
    groups_.clear();
    if (record.keepable_) {
      groups_ = std::move(record.groups_);
    }
  }

 private:
  template <typename StateMap>
  static bool take_group(Group& kept, const torch::optim::OptimizerParamGroup& group,
                         const StateMap& state, StateCount state_count, StateTensor state_tensor) {
    const std::vector<at::Tensor>& params = group.params();
    if (params.size() != kept.params.size()) {
      return false;
    }
    const size_t count = state_count(group.options());
    for (const KeptBucket& b : kept.lists.buckets()) {
      if (b.lists.size() != count + 2) {
        return false;  // an option that adds or removes a state list changed
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      if (!p.is_same(kept.params[i])) {
        return false;
      }
      const int b = kept.bucket_of[i];
      if (b < 0) {
        if (p.grad().defined()) {
          return false;
        }
        continue;
      }
      const int64_t at = kept.lists.take(static_cast<size_t>(b), p);
      if (at < 0) {
        return false;
      }
      const auto it = state.find(p.unsafeGetTensorImpl());
      if (it == state.end() || !it->second) {
        return false;
      }
      for (size_t s = 0; s < count; ++s) {
        if (!state_tensor(*it->second, s, count)
                 .is_same(kept.lists.state(static_cast<size_t>(b), s, static_cast<size_t>(at)))) {
          return false;
        }
      }
    }
    return true;
  }

  std::vector<Group> groups_;
};

// One step through the kept lists: check(options) for every group, then, when every
// group's parameters can be taken (KeptGroups::take), launch(options, device, lists) for
// each of their buckets. False, with nothing launched, when they cannot: the step then
// takes the checked way (step_buckets), which keeps the lists anew.
template <typename Options, typename StateMap, typename Check, typename Launch>
bool step_kept(KeptGroups& kept, const std::vector<torch::optim::OptimizerParamGroup>& groups,
               const StateMap& state, KeptGroups::StateCount state_count,
               KeptGroups::StateTensor state_tensor, Check check, Launch launch) {
  for (const auto& group : groups) {
    check(static_cast<const Options&>(group.options()));
  }
  if (!kept.take(groups, state, state_count, state_tensor)) {
    return false;
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& options = static_cast<const Options&>(groups[g].options());
    kept.lists(g).launch(
        [&](const at::Device& device, const auto& lists) { launch(options, device, lists); });
  }
  return true;
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
