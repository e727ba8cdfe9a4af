// SPDX-License-Identifier: BSD-3-Clause
#include "cuda_common/table_cache.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <deque>
#include <mutex>

namespace lucid {
namespace cuda_common {
namespace {

// NOTE: [Tensor table cache]
// A table is a few KiB copied host-to-device before a launch. Training loops pass the
// same tensors every step, so tables are kept, keyed by their contents and device, and
// reused: a steady loop copies nothing, and a CUDA graph captured after one warm-up step
// contains no copy from host memory. The pinned host buffer stays with the entry, so a
// copy still in flight never reads freed memory.
struct CachedTable {
  int device;
  std::vector<int64_t> host;
  at::Tensor pinned;
  at::Tensor on_device;
};

constexpr size_t kCachedTables = 64;

const int64_t* device_table_for(std::vector<int64_t>&& host, const at::Device& device) {
  static std::mutex mutex;
  // Never destroyed on purpose: at exit, CUDA and LibTorch's allocators may be torn down
  // before static destructors would free these tensors.
  static auto& cache = *new std::deque<CachedTable>();
  std::lock_guard<std::mutex> lock(mutex);
  for (const auto& entry : cache) {
    if (entry.device == device.index() && entry.host == host) {
      return entry.on_device.data_ptr<int64_t>();
    }
  }
  at::Tensor pinned = at::empty({static_cast<int64_t>(host.size())},
                                at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(host.begin(), host.end(), pinned.data_ptr<int64_t>());
  at::Tensor on_device = pinned.to(device, /*non_blocking=*/true);
  if (cache.size() == kCachedTables) {
    cache.pop_front();
  }
  cache.push_back({device.index(), std::move(host), pinned, on_device});
  return cache.back().on_device.data_ptr<int64_t>();
}

}  // namespace

TensorTable make_table(const std::vector<const std::vector<at::Tensor>*>& lists,
                       const std::vector<int64_t>& values) {
  const auto& first = *lists.front();
  const int64_t n = static_cast<int64_t>(first.size());
  TORCH_INTERNAL_ASSERT(values.empty() || static_cast<int64_t>(values.size()) == n);
  std::vector<int64_t> host;
  host.reserve((n + 1) + lists.size() * n + values.size());
  int64_t total = 0;
  for (const auto& t : first) {
    host.push_back(total);
    total += t.numel();
  }
  host.push_back(total);
  for (const auto* list : lists) {
    for (const auto& t : *list) {
      host.push_back(reinterpret_cast<int64_t>(t.data_ptr()));
    }
  }
  host.insert(host.end(), values.begin(), values.end());
  TensorTable table;
  table.num_tensors = static_cast<int>(n);
  table.depth = static_cast<int>(lists.size());
  table.total_elements = total;
  table.data = device_table_for(std::move(host), first.front().device());
  return table;
}

TensorTable make_table(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<const std::vector<at::Tensor>*> pointers;
  for (const auto& list : lists) {
    pointers.push_back(&list);
  }
  return make_table(pointers);
}

ElementType element_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kDouble:
      return ElementType::kFloat64;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    default:
      TORCH_INTERNAL_ASSERT(false, "lucid-amp CUDA kernels got dtype ", dtype);
  }
}

const float* float_on(const at::Tensor& t, const at::Device& device, at::Tensor& keep) {
  if (!t.defined()) {
    return nullptr;
  }
  keep = t.device() == device ? t : t.to(device, /*non_blocking=*/true);
  return keep.data_ptr<float>();
}

}  // namespace cuda_common
}  // namespace lucid
