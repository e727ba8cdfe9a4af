// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: a fused optimizer's launch lists, kept between steps (NOTE: [Kept launch
// lists]). The C++ optimizers (fused_launch.h, KeptGroups) and lucid_amp.optim's
// _FusedGroup (python/csrc/optim.cpp) step through the same lists and the same checks.
//
// NOTE: [Kept launch lists]
// A steady training loop hands a fused optimizer the same parameters, with gradients and
// state of the same layout, at every step. So the lists a launch takes are kept between
// steps, per device and dtype of a param group: the state lists (the optimizer's own
// tensors, step counters last) are kept as they are; the parameters and gradients are
// borrowed for one launch and given back after it, so that no parameter tensor is held
// between steps and one step costs no reference counting per tensor. A step whose every
// parameter passes take() launches from the kept lists: no bucketing, no state look-up
// through the checked way, no copy. Anything else (another parameter, a gradient that
// appeared or went away, a tensor resized or of another layout, a state tensor replaced)
// sends the step through the checked way, which tells what changed or raises before
// anything is written, and keeps the lists anew.

#include <ATen/ATen.h>
#include <c10/util/MaybeOwned.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lucid {
namespace optim {
namespace detail {

// One device and dtype of a param group: [params, grads, states..., step counters].
struct KeptBucket {
  at::Device device;
  at::ScalarType dtype;
  caffe2::TypeMeta type_meta;                  // of dtype
  std::vector<size_t> index;                   // each parameter's index in its param group
  std::vector<std::vector<at::Tensor>> lists;  // params and grads only while taken
};

class KeptLists {
 public:
  KeptLists() = default;
  ~KeptLists() { release(); }
  KeptLists(const KeptLists&) = delete;
  KeptLists& operator=(const KeptLists&) = delete;
  // Moved only while nothing is taken (a borrowed tensor must be given back by its owner).
  KeptLists(KeptLists&& other) noexcept;

  // Keeps one bucket: its device, dtype, its parameters' indices in the param group, and
  // its state lists aligned with them (step counters last), every tensor checked and
  // launchable with its parameter (NOTE: [Launch layout] in fused_launch.h).
  void keep(const at::Device& device, at::ScalarType dtype, std::vector<size_t> index,
            std::vector<std::vector<at::Tensor>> states);
  const std::vector<KeptBucket>& buckets() const { return buckets_; }

  // Borrows `p` and its gradient into bucket `b`'s lists when they and the bucket's state
  // tensors at their position are as a launch from the kept lists needs: `p` dense on the
  // bucket's device with its dtype; its gradient a plain strided tensor of p's dtype,
  // device, sizes and strides; each state tensor of p's dtype, sizes and strides (a kept
  // tensor changed in place keeps its device); each step counter one float32 element.
  // Returns the position `p` took in the bucket, or -1 (nothing taken for `p`; what was
  // taken before stays until release()). Parameters are taken in their bucket's order.
  int64_t take(size_t b, const at::Tensor& p);
  // The kept tensor of state list `s` (0: the first after the gradients) at position `at`
  // of bucket `b`.
  const at::Tensor& state(size_t b, size_t s, size_t at) const {
    return buckets_[b].lists[2 + s][at];
  }

  // launch_bucket(device, lists) for each bucket, then release(), also on an error.
  template <typename Launch>
  void launch(Launch launch_bucket) {
    struct Release {
      KeptLists& lists;
      ~Release() { lists.release(); }
    } release{*this};
    for (const KeptBucket& k : buckets_) {
      launch_bucket(k.device, k.lists);
    }
  }
  // Gives back every borrowed parameter and gradient.
  void release();

 private:
  // Borrowed tensors, as c10::MaybeOwned makes them: the lists share the parameters' and
  // gradients' TensorImpls without taking references. The caller keeps the parameters
  // (and so their gradients) alive from take() to release().
  using Borrow = c10::MaybeOwnedTraits<at::Tensor>;
  bool taken() const;
  std::vector<KeptBucket> buckets_;
};

}  // namespace detail
}  // namespace optim
}  // namespace lucid
