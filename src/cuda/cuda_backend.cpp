#include "cuda/cuda_backend.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <deque>
#include <mutex>

namespace lucid {
namespace amp {
namespace cuda {
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

// The table of `lists` (all of one length; list 0 gives the sizes), taken by pointer so
// that no list of tensors is copied on the way.
TensorTable make_table(const std::vector<const std::vector<at::Tensor>*>& lists) {
  const auto& first = *lists.front();
  const int64_t n = static_cast<int64_t>(first.size());
  std::vector<int64_t> host;
  host.reserve((n + 1) + lists.size() * n);
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

// Pointer to `t` (float32 0-dim) on `device`, copying it there if needed; `keep` holds
// the copy alive until the launch is queued.
const float* float_on(const at::Tensor& t, const at::Device& device, at::Tensor& keep) {
  if (!t.defined()) {
    return nullptr;
  }
  keep = t.device() == device ? t : t.to(device, /*non_blocking=*/true);
  return keep.data_ptr<float>();
}

// Calls launch(table, type) once per element type present: one table of all of `grads`
// when they share one (the common case, built without copying the list), else one per
// type.
template <typename Launch>
void for_each_dtype(const std::vector<at::Tensor>& grads, Launch launch) {
  const at::ScalarType first = grads.front().scalar_type();
  const bool one_type = std::all_of(grads.begin(), grads.end(),
                                    [&](const at::Tensor& g) { return g.scalar_type() == first; });
  if (one_type) {
    launch(make_table({&grads}), element_type(first));
    return;
  }
  for (const at::ScalarType dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
    std::vector<at::Tensor> same;
    for (const auto& g : grads) {
      if (g.scalar_type() == dtype) {
        same.push_back(g);
      }
    }
    if (!same.empty()) {
      launch(make_table({&same}), element_type(dtype));
    }
  }
}

// The unscale pass (kWrite) or the read-only check, over one device's gradients.
template <bool kWrite>
void unscale_or_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                       at::Tensor& found_inf) {
  if (grads.empty()) {
    return;
  }
  const at::Device device = grads.front().device();
  c10::cuda::CUDAGuard guard(device);
  at::Tensor scale_here;
  const float* scale_ptr = float_on(scale, device, scale_here);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  float* flag = found_inf.data_ptr<float>();
  for_each_dtype(grads, [&](const TensorTable& table, ElementType type) {
    C10_CUDA_CHECK(kWrite ? launch_unscale_and_check(table, type, scale_ptr, flag, stream)
                          : launch_check_finite(table, type, scale_ptr, flag, stream));
  });
}

// One fused optimizer step over `lists` (step counters last): launch(table, type, scale,
// found_inf, stream) runs the optimizer's kernel, then the counters are incremented; both
// skip on the device when *found_inf != 0.
template <typename Launch>
void fused_step_(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& scale,
                 const at::Tensor& found_inf, Launch launch) {
  const at::Device device = lists.front().front().device();
  c10::cuda::CUDAGuard guard(device);
  at::Tensor scale_here, found_here;
  const float* scale_ptr = float_on(scale, device, scale_here);
  const float* found_ptr = float_on(found_inf, device, found_here);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const TensorTable table = make_table(lists);
  C10_CUDA_CHECK(launch(table, element_type(lists.front().front().scalar_type()), scale_ptr,
                        found_ptr, stream));
  C10_CUDA_CHECK(launch_increment_steps(table, table.depth - 1, found_ptr, stream));
}

}  // namespace

void unscale_and_check_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                        at::Tensor& found_inf) {
  unscale_or_check_<true>(grads, scale, found_inf);
}

void check_finite_(const std::vector<at::Tensor>& grads, const at::Tensor& scale,
                   at::Tensor& found_inf) {
  unscale_or_check_<false>(grads, scale, found_inf);
}

void update_scale_(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf,
                   double growth_factor, double backoff_factor, int64_t growth_interval) {
  at::_amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                         growth_interval);
}

void fused_adam_(const std::vector<std::vector<at::Tensor>>& lists, const AdamHyper& hyper,
                 const at::Tensor& scale, const at::Tensor& found_inf) {
  fused_step_(lists, scale, found_inf, [&](const TensorTable& table, ElementType type,
                                           const float* scale_ptr, const float* found_ptr,
                                           cudaStream_t stream) {
    return launch_fused_adam(table, type, hyper, scale_ptr, found_ptr, stream);
  });
}

void fused_sgd_(const std::vector<std::vector<at::Tensor>>& lists, const SgdHyper& hyper,
                const at::Tensor& scale, const at::Tensor& found_inf) {
  fused_step_(lists, scale, found_inf, [&](const TensorTable& table, ElementType type,
                                           const float* scale_ptr, const float* found_ptr,
                                           cudaStream_t stream) {
    return launch_fused_sgd(table, type, hyper, scale_ptr, found_ptr, stream);
  });
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
