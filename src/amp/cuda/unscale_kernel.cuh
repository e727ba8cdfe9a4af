// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The unscale-and-check and read-only check kernels, as templates over the shared
// multi-tensor walker: unscale_kernels.cu instantiates and launches them, the kernel lab
// (benchmarks/cuda/unscale_lab.cu) times them with other chunk sizes. Unchecked on
// purpose: the launchers own the preconditions (unscale_kernels.h).

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "amp/cuda/unscale_kernels.h"
#include "amp/scale_rule.h"
#include "cuda_common/multi_tensor_apply.cuh"

namespace lucid {
namespace amp {
namespace cuda {

using cuda_common::Element;
using cuda_common::Table;

// 512 threads a block, kUnroll vectors in flight per thread: the unscale pass moves few
// bytes per element, so a block needs more threads to keep enough loads in flight
// (docs/PERFORMANCE.md has the shapes timed).
constexpr int kUnscaleThreads = 512;

// What one thread met (NOTE: [Overflow site] in amp/scale_rule.h): its NaN and inf
// entries, and the first tensor, in table order, that held one, noted at each change of
// tensor rather than per element (a thread walks its tensors in ascending order, and its
// counts only ever rise).
struct Met {
  uint32_t nan = 0;
  uint32_t inf = 0;
  int tensor = -1;
  int first = -1;
  template <typename O>
  __device__ void value(O x) {
    nan += isnan(x) ? 1u : 0u;
    inf += isinf(x) ? 1u : 0u;
  }
  __device__ bool bad() const { return (nan | inf) != 0; }
  __device__ void begin_tensor(int t) {
    if (bad() && first < 0) first = tensor;
    tensor = t;
  }
  __device__ int first_tensor() const { return first < 0 ? tensor : first; }
};

// A thread that met a non-finite value raises the flag and, where the site is given,
// lowers its first key to that of its first such tensor (the table's list kKeyList: keys
// are non-negative, so their order is that of the unsigned 64-bit values atomicMin
// compares) and adds its counts.
__device__ __forceinline__ void record_bad(const Table& table, const Met& met, float* found_inf,
                                           int64_t* site) {
  *found_inf = 1.0f;  // racy on purpose: every writer writes the same value
  if (site != nullptr) {
    auto* fields = reinterpret_cast<unsigned long long*>(site);
    atomicMin(fields + detail::kSiteFirstKey,
              static_cast<unsigned long long>(table.value(kKeyList, met.first_tensor())));
    atomicAdd(fields + detail::kSiteNanCount, static_cast<unsigned long long>(met.nan));
    atomicAdd(fields + detail::kSiteInfCount, static_cast<unsigned long long>(met.inf));
  }
}

template <typename S>
struct UnscaleOp {
  using E = Element<S>;
  typename E::opmath inv;
  Met met;
  __device__ static constexpr bool writes(int d) { return d == kGradList; }
  __device__ void begin_tensor(const Table&, int t) { met.begin_tensor(t); }
  __device__ void element(S (&e)[1]) {
    const auto x = E::load(e[kGradList]) * inv;
    met.value(x);
    e[kGradList] = E::store(x);
  }
};

template <typename S>
struct CheckOp {
  using E = Element<S>;
  typename E::opmath inv;
  Met met;
  __device__ static constexpr bool writes(int) { return false; }
  __device__ void begin_tensor(const Table&, int t) { met.begin_tensor(t); }
  __device__ void element(S (&e)[1]) { met.value(E::load(e[kGradList]) * inv); }
};

// The read-only check with the norm's partial of one thread: the sum of squares, or the
// largest absolute value (kInf) with NaN kept, in float32.
template <typename S, bool kInf>
struct NormCheckOp {
  using E = Element<S>;
  typename E::opmath inv;
  Met met;
  float partial = 0.0f;
  __device__ static constexpr bool writes(int) { return false; }
  __device__ void begin_tensor(const Table&, int t) { met.begin_tensor(t); }
  __device__ void element(S (&e)[1]) {
    const auto x = E::load(e[kGradList]) * inv;
    met.value(x);
    const float f = static_cast<float>(x);
    partial = combine(partial, kInf ? fabsf(f) : f * f);
  }
  __device__ static float combine(float a, float b) {
    if (!kInf) return a + b;
    return (isnan(b) || b > a) && !isnan(a) ? b : a;
  }
};

// One partial per block: the block's threads combined in a fixed tree, so the same
// gradients give the same bits run to run. `partials` has grid_for(table) entries.
template <typename S, bool kInf>
__global__ void __launch_bounds__(kUnscaleThreads)
    norm_check_kernel(Table table, const float* scale, float* found_inf, int64_t* site,
                      float* partials) {
  using Op = NormCheckOp<S, kInf>;
  __shared__ float tree[kUnscaleThreads];
  Op op;
  op.inv = cuda_common::inverse_scale<typename Element<S>::opmath>(scale);
  cuda_common::walk_block_range<S, 1>(table, table.offsets, op);
  if (op.met.bad()) {
    record_bad(table, op.met, found_inf, site);
  }
  tree[threadIdx.x] = op.partial;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      tree[threadIdx.x] = Op::combine(tree[threadIdx.x], tree[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = tree[0];
  }
}

// kWrite false: the read-only check. kStageOffsets: NOTE: [Offsets in shared memory];
// launched with offsets_bytes(table) of dynamic shared memory when true.
template <typename S, bool kWrite, bool kStageOffsets>
__global__ void __launch_bounds__(kUnscaleThreads)
    unscale_kernel(Table table, const float* scale, float* found_inf, int64_t* site) {
  using Op = typename std::conditional<kWrite, UnscaleOp<S>, CheckOp<S>>::type;
  extern __shared__ int64_t shared_offsets[];
  const int64_t* offsets =
      kStageOffsets ? cuda_common::stage_offsets(table, shared_offsets) : table.offsets;
  Op op;
  op.inv = cuda_common::inverse_scale<typename Element<S>::opmath>(scale);
  cuda_common::walk_block_range<S, 1>(table, offsets, op);
  if (op.met.bad()) {
    record_bad(table, op.met, found_inf, site);
  }
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
