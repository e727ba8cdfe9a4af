// SPDX-License-Identifier: BSD-3-Clause
// A kernel lab for the unscale-and-check pass and the fused optimizers: plain CUDA, no
// LibTorch, so it builds with nvcc alone in seconds on the GPU machine:
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -I src -o unscale_lab
//        benchmarks/cuda/unscale_lab.cu src/amp/cuda/unscale_kernels.cu   (one line)
//   ./unscale_lab            # prints one row per variant and size
//
// It instantiates the production kernel templates (amp/cuda/unscale_kernel.cuh,
// optim/cuda/fused_kernels.cuh) over the shared walker (cuda_common/multi_tensor_apply.cuh)
// and launches them with other chunk sizes than production's (NOTE: [Chunk size]), with
// the offsets searched in a shared copy or in global memory (NOTE: [Offsets in shared
// memory]), and with one contiguous share of the range per resident block
// ("contiguous"). Variants that production does not have, cache-hinted loads and stores
// on the unscale pass's vector loop, are defined here on top of the shared walker. The
// last check calls the production launcher (linked from unscale_kernels.cu). Each variant
// is timed two ways with CUDA events: one launch between two events (median of 30), and
// 20 launches back to back between two events (host launch gaps hidden). The copy
// reference is cudaMemcpyAsync of the same bytes (8 per float32 gradient: 4 read, 4
// written).

#include "amp/cuda/unscale_kernel.cuh"
#include "cuda_common/multi_tensor_apply.cuh"
#include "optim/cuda/fused_kernels.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

using namespace lucid::cuda_common;
using lucid::amp::cuda::CheckOp;
using lucid::amp::cuda::kGradList;
using lucid::amp::cuda::kUnscaleThreads;
using lucid::amp::cuda::launch_unscale_and_check;
using lucid::amp::cuda::unscale_kernel;
using lucid::amp::cuda::UnscaleOp;
using lucid::optim::cuda::adam_kernel;
using lucid::optim::cuda::sgd_kernel;
using lucid::optim::detail::AdamHyper;
using lucid::optim::detail::AdamList;
using lucid::optim::detail::SgdHyper;
using lucid::optim::detail::SgdList;

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace lab {

// One flat buffer, in place, vector loop over a grid-stride: the layout-free bound.
template <int kThreadsT, int kUnrollT>
__global__ void __launch_bounds__(kThreadsT) flat_unscale(float* x, int64_t n, const float* scale, float* found_inf) {
  const float inv = inverse_scale<float>(scale);
  const int64_t nvec = n / 4;
  bool bad = false;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreadsT * kUnrollT;
  for (int64_t v0 = static_cast<int64_t>(blockIdx.x) * kThreadsT * kUnrollT + threadIdx.x; v0 < nvec; v0 += stride) {
    float4 r[kUnrollT];
#pragma unroll
    for (int u = 0; u < kUnrollT; ++u) {
      const int64_t i = v0 + u * kThreadsT;
      if (i < nvec) r[u] = reinterpret_cast<const float4*>(x)[i];
    }
#pragma unroll
    for (int u = 0; u < kUnrollT; ++u) {
      const int64_t i = v0 + u * kThreadsT;
      if (i < nvec) {
        r[u].x *= inv; r[u].y *= inv; r[u].z *= inv; r[u].w *= inv;
        bad |= !isfinite(r[u].x) | !isfinite(r[u].y) | !isfinite(r[u].z) | !isfinite(r[u].w);
        reinterpret_cast<float4*>(x)[i] = r[u];
      }
    }
  }
  if (bad) *found_inf = 1.0f;
}

// ---- cache-hinted variants of the unscale pass ---------------------------------------
// How the vector loop loads and stores its 16-byte vectors. Production uses plain
// accesses; these policies are the lab's own.
struct PlainAccess {
  __device__ static uint4 load(const uint4* p) { return *p; }
  __device__ static void store(uint4* p, uint4 v) { *p = v; }
};
struct StreamingAccess {  // ld.global.cs / st.global.cs: evict first
  __device__ static uint4 load(const uint4* p) { return __ldcs(p); }
  __device__ static void store(uint4* p, uint4 v) { __stcs(p, v); }
};
struct StreamingStoreAccess {  // plain loads, st.global.cs
  __device__ static uint4 load(const uint4* p) { return *p; }
  __device__ static void store(uint4* p, uint4 v) { __stcs(p, v); }
};
struct LastUseAccess {  // ld.global.lu (last use), st.global.cs
  __device__ static uint4 load(const uint4* p) { return __ldlu(p); }
  __device__ static void store(uint4* p, uint4 v) { __stcs(p, v); }
};
struct GlobalCachedAccess {  // ld.global.cg / st.global.cg: L2 only
  __device__ static uint4 load(const uint4* p) { return __ldcg(p); }
  __device__ static void store(uint4* p, uint4 v) { __stcg(p, v); }
};

// The shared walker's walk_segment for one list, with its vector loads and stores
// through `Access`; head and tail element by element, as production.
template <typename S, typename Access, typename Op>
__device__ void hinted_walk_segment(S* ptr, int64_t lo, int64_t hi, Op& op) {
  constexpr int kPer = 16 / sizeof(S);
  auto scalar = [&](int64_t i) {
    S e[1] = {ptr[i]};
    op.element(e);
    if (Op::writes(kGradList)) ptr[i] = e[0];
  };
  const int64_t misalign = (reinterpret_cast<uintptr_t>(ptr + lo) % 16) / sizeof(S);
  int64_t head_end = misalign == 0 ? lo : lo + (kPer - misalign);
  if (head_end > hi) head_end = hi;
  for (int64_t i = lo + threadIdx.x; i < head_end; i += blockDim.x) scalar(i);
  const int64_t nvec = (hi - head_end) / kPer;
  for (int64_t v = threadIdx.x; v < nvec; v += static_cast<int64_t>(blockDim.x) * kUnroll) {
    Pack<S> pack[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = v + static_cast<int64_t>(u) * blockDim.x;
      if (idx < nvec) pack[u].raw = Access::load(reinterpret_cast<const uint4*>(ptr + head_end) + idx);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = v + static_cast<int64_t>(u) * blockDim.x;
      if (idx < nvec) {
#pragma unroll
        for (int m = 0; m < kPer; ++m) {
          S e[1] = {pack[u].e[m]};
          op.element(e);
          pack[u].e[m] = e[0];
        }
        if (Op::writes(kGradList)) Access::store(reinterpret_cast<uint4*>(ptr + head_end) + idx, pack[u].raw);
      }
    }
  }
  for (int64_t i = head_end + nvec * kPer + threadIdx.x; i < hi; i += blockDim.x) scalar(i);
}

// Production's unscale kernel (staged offsets, UnscaleOp) with hinted vector accesses.
template <typename S, typename Access>
__global__ void __launch_bounds__(kUnscaleThreads)
    hinted_unscale_kernel(Table table, const float* scale, float* found_inf) {
  extern __shared__ int64_t shared_offsets[];
  const int64_t* offsets = stage_offsets(table, shared_offsets);
  UnscaleOp<S> op;
  op.inv = inverse_scale<typename Element<S>::opmath>(scale);
  for_each_block_segment(table, offsets, [&](int t, int64_t lo, int64_t hi) {
    hinted_walk_segment<S, Access>(static_cast<S*>(table.pointer(kGradList, t)), lo, hi, op);
  });
  if (op.met.bad()) *found_inf = 1.0f;
}

__global__ void fill(float* x, int64_t n, uint32_t salt) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ salt;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    x[i] = (static_cast<float>(h & 0xffffff) / 16777216.0f - 0.5f) * 2000.0f;
  }
}

struct Layout {
  std::string name;
  std::vector<int64_t> sizes;
  int64_t total = 0;
};

// A transformer-like layout, as PyTorch's reference benchmark (the anchor script) builds it: per layer 4 d*d + 2 d*4d + small vectors.
Layout anchor_layout(int64_t wanted, int layers) {
  int64_t d = static_cast<int64_t>(std::sqrt(static_cast<double>(wanted) / (12.0 * layers))) / 64 * 64;
  Layout l;
  for (int i = 0; i < layers; ++i) {
    for (int64_t s : {3 * d * d, 3 * d, d * d, d, 4 * d * d, 4 * d, 4 * d * d, d, d, d, d, d}) l.sizes.push_back(s);
  }
  for (int64_t s : l.sizes) l.total += s;
  l.name = std::to_string(l.total / 1000000) + "M/" + std::to_string(l.sizes.size());
  return l;
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// (single-launch median ms, back-to-back per-launch ms)
std::pair<float, float> time_it(const std::function<void()>& launch) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) launch();
  CHECK(cudaDeviceSynchronize());
  std::vector<float> single;
  for (int i = 0; i < 30; ++i) {
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    single.push_back(ms);
  }
  std::vector<float> batch;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    batch.push_back(ms / 20);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return {median(single), median(batch)};
}

}  // namespace lab

int main() {
  using namespace lab;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  // The reference benchmark's two sizes, and a list of 1152 mostly small tensors.
  const std::vector<Layout> layouts = {anchor_layout(125000000, 12), anchor_layout(1300000000, 24),
                                       anchor_layout(125000000, 96)};
  std::printf("%-10s %-36s %9s %9s %7s %9s %7s\n", "layout", "variant", "1x ms", "GB/s", "x copy",
              "20x ms", "x copy");
  for (const Layout& l : layouts) {
    const int64_t n = l.total;
    const int nt = static_cast<int>(l.sizes.size());
    // The four data lists of an AdamW step, in AdamList order; SGD's momentum buffers are
    // the exp_avg list. Separate allocations per tensor, as the caching allocator gives
    // large tensors.
    static_assert(static_cast<int>(SgdList::kMomentumBuffer) == static_cast<int>(AdamList::kExpAvg),
                  "SGD reuses the first three lists");
    constexpr int kDataLists = AdamList::kSteps;
    std::vector<std::vector<float*>> lists(kDataLists);
    for (int d = 0; d < kDataLists; ++d) {
      for (int t = 0; t < nt; ++t) {
        float* p = nullptr;
        CHECK(cudaMalloc(&p, l.sizes[t] * sizeof(float)));
        fill<<<1024, 256>>>(p, l.sizes[t], static_cast<uint32_t>(d * 1000 + t));
        lists[d].push_back(p);
      }
    }
    for (int t = 0; t < nt; ++t)
      CHECK(cudaMemset(lists[AdamList::kExpAvgSq][t], 0, l.sizes[t] * sizeof(float)));  // >= 0
    float *steps = nullptr, *src = nullptr, *dst = nullptr, *flag = nullptr, *scales = nullptr;
    CHECK(cudaMalloc(&steps, nt * sizeof(float)));
    CHECK(cudaMemset(steps, 0, nt * sizeof(float)));
    CHECK(cudaMalloc(&src, n * sizeof(float)));
    CHECK(cudaMalloc(&dst, n * sizeof(float)));
    fill<<<1024, 256>>>(src, n, 7);
    CHECK(cudaMalloc(&flag, sizeof(float)));
    CHECK(cudaMemset(flag, 0, sizeof(float)));
    CHECK(cudaMalloc(&scales, 2 * sizeof(float)));
    const float two_half[2] = {2.0f, 0.5f};
    CHECK(cudaMemcpy(scales, two_half, sizeof(two_half), cudaMemcpyHostToDevice));
    // AdamW's table: the four data lists and the step counters.
    std::vector<int64_t> host;
    int64_t off = 0;
    for (int64_t sz : l.sizes) { host.push_back(off); off += sz; }
    host.push_back(off);
    for (int d = 0; d < kDataLists; ++d)
      for (float* p : lists[d]) host.push_back(reinterpret_cast<int64_t>(p));
    for (int t = 0; t < nt; ++t) host.push_back(reinterpret_cast<int64_t>(steps + t));
    int64_t* dtable = nullptr;
    CHECK(cudaMalloc(&dtable, host.size() * sizeof(int64_t)));
    CHECK(cudaMemcpy(dtable, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    // The gradients alone (depth 1) behind the same offsets.
    std::vector<int64_t> grads_host(host.begin(), host.begin() + nt + 1);
    for (float* p : lists[AdamList::kGrad]) grads_host.push_back(reinterpret_cast<int64_t>(p));
    int64_t* gtable = nullptr;
    CHECK(cudaMalloc(&gtable, grads_host.size() * sizeof(int64_t)));
    CHECK(cudaMemcpy(gtable, grads_host.data(), grads_host.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    TensorTable grads_tt{gtable, nt, 1, n};
    TensorTable adam_tt{dtable, nt, AdamList::kSteps + 1, n};
    // SGD with momentum: its three data lists, then the step counters.
    std::vector<int64_t> sgd_host(host.begin(), host.begin() + nt + 1 + SgdList::kStepsMomentum * nt);
    for (int t = 0; t < nt; ++t) sgd_host.push_back(reinterpret_cast<int64_t>(steps + t));
    int64_t* stable = nullptr;
    CHECK(cudaMalloc(&stable, sgd_host.size() * sizeof(int64_t)));
    CHECK(cudaMemcpy(stable, sgd_host.data(), sgd_host.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    TensorTable sgd_tt{stable, nt, SgdList::kStepsMomentum + 1, n};

    int flip = 0;
    auto sc = [&] { return scales + (flip ^= 1); };
    float copy_one = 1, copy_many = 1;
    // bytes_per_element: what the variant must move; "x copy" compares bandwidths.
    auto row = [&](const std::string& name, double bytes_per_element, const std::function<void()>& fn) {
      const auto [one, many] = time_it(fn);
      const double gbs = bytes_per_element * n / one / 1e6;
      const double copy_gbs = 8.0 * n / copy_one / 1e6, copy_gbs_many = 8.0 * n / copy_many / 1e6;
      std::printf("%-10s %-36s %9.4f %9.1f %7.3f %9.4f %7.3f\n", l.name.c_str(), name.c_str(), one, gbs,
                  gbs / copy_gbs, many, bytes_per_element * n / many / 1e6 / copy_gbs_many);
    };
    {
      const auto [one, many] = time_it([&] { CHECK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice)); });
      copy_one = one;
      copy_many = many;
    }
    row("cudaMemcpyAsync D2D", 8, [&] { CHECK(cudaMemcpyAsync(dst, src, n * 4, cudaMemcpyDeviceToDevice)); });
    row("flat persistent 512x4 (1 buffer)", 8, [&] { flat_unscale<512, 4><<<sms * 4, 512>>>(src, n, sc(), flag); });
    // One contiguous share of the range per resident block, instead of fixed chunks.
    auto contiguous = [&](int per_sm) { return ((n + sms * per_sm - 1) / (sms * per_sm) + 7) & ~int64_t{7}; };
    const std::vector<std::pair<std::string, int64_t>> unscale_chunks = {
        {"contiguous", contiguous(4)}, {"8K", 8192}, {"16K", 16384}, {"32K", 32768}};
    // One launch of the production unscale kernel: unscale (write) or read-only check;
    // offsets staged in shared memory (NOTE: [Offsets in shared memory]; production up to
    // kSharedOffsets tensors, timed here for every list) or searched in global memory.
    auto launch = [&](auto write, auto staged, const Table& t) {
      constexpr bool kWriteV = decltype(write)::value, kStagedV = decltype(staged)::value;
      unscale_kernel<float, kWriteV, kStagedV>
          <<<grid_for(t), kUnscaleThreads, kStagedV ? offsets_bytes(t) : 0>>>(t, sc(), flag,
                                                                              nullptr);
    };
    auto staged_and_global = [&](auto write, const std::string& what, double bytes_per_element) {
      for (const auto& [label, chunk] : unscale_chunks) {
        const Table t = device_table(grads_tt, chunk);
        row(what + " " + label + ", staged", bytes_per_element,
            [&] { launch(write, std::true_type{}, t); });
        row(what + " " + label + ", global", bytes_per_element,
            [&] { launch(write, std::false_type{}, t); });
      }
    };
    staged_and_global(std::true_type{}, "unscale", 8);
    {
      const Table t8 = device_table(grads_tt, 8192);
      // The lab's own walk with cache-hinted vector accesses; "plain" is its control
      // against the production row "unscale 8K, staged".
      auto hinted = [&](const std::string& name, auto access) {
        row("unscale 8K, staged, " + name, 8, [&] {
          hinted_unscale_kernel<float, decltype(access)>
              <<<grid_for(t8), kUnscaleThreads, offsets_bytes(t8)>>>(t8, sc(), flag);
        });
      };
      hinted("plain (lab walk)", PlainAccess{});
      hinted("ld.cs/st.cs", StreamingAccess{});
      hinted("st.cs", StreamingStoreAccess{});
      hinted("ld.lu/st.cs", LastUseAccess{});
      hinted("ld.cg/st.cg", GlobalCachedAccess{});
    }
    staged_and_global(std::false_type{}, "check", 4);
    AdamHyper adam{};
    adam.lr = 1e-3; adam.beta1 = 0.9; adam.beta2 = 0.999; adam.eps = 1e-8; adam.weight_decay = 1e-2;
    adam.decoupled_weight_decay = true;
    SgdHyper sgd{};
    sgd.lr = 1e-3; sgd.momentum = 0.9;
    const std::vector<std::pair<std::string, int64_t>> optim_chunks = {
        {"contiguous", contiguous(8)}, {"16K", 16384}, {"32K", 32768}, {"64K", 65536}};
    for (const auto& [label, chunk] : optim_chunks) {
      const Table t = device_table(adam_tt, chunk);
      row("adamw " + label + " (28 B/elt)", 28, [&] {
        adam_kernel<float, false><<<grid_for(t), kThreads>>>(t, adam, scales + 1, nullptr);
      });
    }
    for (const auto& [label, chunk] : optim_chunks) {
      const Table t = device_table(sgd_tt, chunk);
      row("sgd momentum " + label + " (20 B/elt)", 20, [&] {
        sgd_kernel<float, true><<<grid_for(t), kThreads>>>(t, sgd, scales + 1, nullptr);
      });
    }
    CHECK(cudaDeviceSynchronize());
    float f = -1;
    CHECK(cudaMemcpy(&f, flag, sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("%-10s flag after all runs (must be 0): %g\n", l.name.c_str(), f);
    // The production launch finds an inf at the last element of a middle tensor.
    const float inf = INFINITY;
    const int mid = nt / 2;
    CHECK(cudaMemcpy(lists[AdamList::kGrad][mid] + l.sizes[mid] - 1, &inf, sizeof(float), cudaMemcpyHostToDevice));
    CHECK(launch_unscale_and_check(grads_tt, ElementType::kFloat32, scales, flag, nullptr, 0));
    CHECK(cudaMemcpy(&f, flag, sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("%-10s flag after an injected inf (must be 1): %g\n", l.name.c_str(), f);
    for (auto& list : lists)
      for (float* p : list) CHECK(cudaFree(p));
    for (void* p : {static_cast<void*>(steps), static_cast<void*>(src), static_cast<void*>(dst),
                    static_cast<void*>(flag), static_cast<void*>(scales), static_cast<void*>(dtable),
                    static_cast<void*>(gtable), static_cast<void*>(stable)})
      CHECK(cudaFree(p));
  }
  return 0;
}
