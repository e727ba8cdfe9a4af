// SPDX-License-Identifier: BSD-3-Clause
// A fused optimizer's launch lists, kept between steps (NOTE: [Kept launch lists] in
// kept_lists.h).

#include "optim/kept_lists.h"

#include "common/plain_tensor.h"

#include <c10/util/Exception.h>

#include <utility>

namespace lucid {
namespace optim {
namespace detail {

KeptLists::KeptLists(KeptLists&& other) noexcept : buckets_(std::move(other.buckets_)) {
  TORCH_INTERNAL_ASSERT(!taken(), "kept lists moved while taken");
}

bool KeptLists::taken() const {
  for (const KeptBucket& k : buckets_) {
    if (!k.lists[0].empty() || !k.lists[1].empty()) {
      return true;
    }
  }
  return false;
}

void KeptLists::keep(const at::Device& device, at::ScalarType dtype, std::vector<size_t> index,
                     std::vector<std::vector<at::Tensor>> states) {
  KeptBucket bucket{device, dtype, c10::scalarTypeToTypeMeta(dtype), std::move(index), {}};
  bucket.lists.reserve(2 + states.size());
  bucket.lists.emplace_back();
  bucket.lists.emplace_back();
  for (std::vector<at::Tensor>& s : states) {
    TORCH_INTERNAL_ASSERT(s.size() == bucket.index.size());
    bucket.lists.push_back(std::move(s));
  }
  buckets_.push_back(std::move(bucket));
}

int64_t KeptLists::take(size_t b, const at::Tensor& p) {
  KeptBucket& k = buckets_[b];
  const size_t at = k.lists[0].size();
  if (at >= k.index.size()) {
    return -1;
  }
  const at::Tensor& g = p.grad();
  if (!g.defined()) {
    return -1;
  }
  // Read through the TensorImpls, once per parameter: this loop is the steady step's host
  // time.
  const c10::TensorImpl& pi = *p.unsafeGetTensorImpl();
  const c10::TensorImpl& gi = *g.unsafeGetTensorImpl();
  const c10::IntArrayRef sizes = pi.sizes();
  const c10::IntArrayRef strides = pi.strides();
  const caffe2::TypeMeta dtype = pi.dtype();
  if (pi.device() != k.device || dtype != k.type_meta || !pi.is_non_overlapping_and_dense() ||
      gi.layout() != c10::kStrided || !common::is_plain_tensor(g) || gi.dtype() != dtype ||
      gi.device() != k.device || gi.sizes() != sizes || gi.strides() != strides) {
    return -1;
  }
  const size_t steps = k.lists.size() - 1;
  for (size_t s = 2; s < steps; ++s) {
    const c10::TensorImpl& si = *k.lists[s][at].unsafeGetTensorImpl();
    if (si.dtype() != dtype || si.sizes() != sizes || si.strides() != strides) {
      return -1;
    }
  }
  const c10::TensorImpl& step = *k.lists[steps][at].unsafeGetTensorImpl();
  if (step.numel() != 1 || step.dtype() != caffe2::TypeMeta::Make<float>()) {
    return -1;
  }
  k.lists[0].push_back(Borrow::createBorrow(p));
  k.lists[1].push_back(Borrow::createBorrow(g));
  return static_cast<int64_t>(at);
}

void KeptLists::release() {
  for (KeptBucket& k : buckets_) {
    for (int list : {0, 1}) {
      for (at::Tensor& t : k.lists[list]) {
        Borrow::destroyBorrow(t);
      }
      k.lists[list].clear();
    }
  }
}

}  // namespace detail
}  // namespace optim
}  // namespace lucid
