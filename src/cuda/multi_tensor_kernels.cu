// Multi-tensor CUDA kernels: unscale-and-check, read-only check, fused Adam/AdamW and
// SGD. NOTE: [Multi-tensor ranges] in kernels.h says how work is split.

#include "cuda/kernels.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace lucid {
namespace amp {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Independent 16-byte loads each thread keeps in flight: enough bytes in flight per SM
// to cover HBM latency at full bandwidth.
constexpr int kUnroll = 4;

// ---- element types --------------------------------------------------------------------

__device__ __forceinline__ uint16_t float_to_bf16_rne(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return 0x7fc0;  // quiet NaN, as c10::BFloat16
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Storage type S, the type math runs in (opmath), and conversions between them.
template <typename S>
struct Element;

template <>
struct Element<float> {
  using opmath = float;
  __device__ static float load(float x) { return x; }
  __device__ static float store(float x) { return x; }
};

template <>
struct Element<double> {
  using opmath = double;
  __device__ static double load(double x) { return x; }
  __device__ static double store(double x) { return x; }
};

// bfloat16, held as its 16 bits.
template <>
struct Element<uint16_t> {
  using opmath = float;
  __device__ static float load(uint16_t x) { return __uint_as_float(static_cast<uint32_t>(x) << 16); }
  __device__ static uint16_t store(float x) { return float_to_bf16_rne(x); }
};

// 1/scale: computed in float64 and rounded to the opmath type (PyTorch's rule).
template <typename O>
__device__ __forceinline__ O inverse_scale(const float* scale) {
  return scale == nullptr ? O(1) : static_cast<O>(1.0 / static_cast<double>(*scale));
}

// ---- the range walk -----------------------------------------------------------------

struct Table {
  const int64_t* offsets;  // n + 1 entries
  const int64_t* pointers;  // depth lists of n
  int n;
  int64_t total;
  int64_t chunk;  // elements per block, a multiple of 8 (NOTE: [Multi-tensor ranges])

  __device__ void* pointer(int list, int tensor) const {
    return reinterpret_cast<void*>(pointers[static_cast<int64_t>(list) * n + tensor]);
  }
};

__device__ __forceinline__ int find_tensor(const int64_t* offsets, int n, int64_t global) {
  // The largest t with offsets[t] <= global: skips empty tensors, since for that t
  // offsets[t + 1] > global.
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= global) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// How the vector loop loads and stores its 16-byte vectors: plain accesses in
// production. The kernel lab times cache-hinted policies with this parameter; on the
// H200 none moved the unscale pass by more than 0.5% either way (ld.cs/st.cs, st.cs,
// ld.lu/st.cs, ld.cg/st.cg; docs/PERFORMANCE.md).
struct PlainAccess {
  __device__ static uint4 load(const uint4* p) { return *p; }
  __device__ static void store(uint4* p, uint4 v) { *p = v; }
};

template <typename S>
union Pack {
  uint4 raw;
  S e[16 / sizeof(S)];
};

// Applies `op` to the elements [lo, hi) of one tensor's `D` lists; op.element(S (&)[D])
// transforms one element of each list in registers; lists with Op::writes(d) are stored.
template <typename S, int D, int kUnrollT = kUnroll, typename Access = PlainAccess, typename Op>
__device__ void walk_segment(S* const (&ptrs)[D], int64_t lo, int64_t hi, Op& op) {
  constexpr int kUnroll = kUnrollT;
  constexpr int kPer = 16 / sizeof(S);
  auto scalar = [&](int64_t i) {
    S e[D];
#pragma unroll
    for (int d = 0; d < D; ++d) e[d] = ptrs[d][i];
    op.element(e);
#pragma unroll
    for (int d = 0; d < D; ++d)
      if (Op::writes(d)) ptrs[d][i] = e[d];
  };
  // Head: up to the first 16-byte boundary of list 0.
  const int64_t misalign = (reinterpret_cast<uintptr_t>(ptrs[0] + lo) % 16) / sizeof(S);
  int64_t head_end = misalign == 0 ? lo : lo + (kPer - misalign);
  if (head_end > hi) head_end = hi;
  // The other lists must meet a 16-byte boundary at the same element.
  bool aligned = true;
#pragma unroll
  for (int d = 1; d < D; ++d)
    aligned = aligned && (reinterpret_cast<uintptr_t>(ptrs[d] + head_end) % 16 == 0);
  if (!aligned) {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) scalar(i);
    return;
  }
  for (int64_t i = lo + threadIdx.x; i < head_end; i += blockDim.x) scalar(i);
  const int64_t nvec = (hi - head_end) / kPer;
  for (int64_t v = threadIdx.x; v < nvec; v += static_cast<int64_t>(blockDim.x) * kUnroll) {
    Pack<S> pack[kUnroll][D];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = v + static_cast<int64_t>(u) * blockDim.x;
      if (idx < nvec) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
          pack[u][d].raw = Access::load(reinterpret_cast<const uint4*>(ptrs[d] + head_end) + idx);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t idx = v + static_cast<int64_t>(u) * blockDim.x;
      if (idx < nvec) {
#pragma unroll
        for (int m = 0; m < kPer; ++m) {
          S e[D];
#pragma unroll
          for (int d = 0; d < D; ++d) e[d] = pack[u][d].e[m];
          op.element(e);
#pragma unroll
          for (int d = 0; d < D; ++d) pack[u][d].e[m] = e[d];
        }
#pragma unroll
        for (int d = 0; d < D; ++d) {
          if (Op::writes(d)) {
            Access::store(reinterpret_cast<uint4*>(ptrs[d] + head_end) + idx, pack[u][d].raw);
          }
        }
      }
    }
  }
  for (int64_t i = head_end + nvec * kPer + threadIdx.x; i < hi; i += blockDim.x) scalar(i);
}

// This block's chunk of the concatenated elements, walked tensor by tensor. `offsets` is
// table.offsets or a block's copy of it (stage_offsets).
template <typename S, int D, int kUnrollT = kUnroll, typename Access = PlainAccess, typename Op>
__device__ void walk_block_range(const Table& table, const int64_t* offsets, Op& op) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * table.chunk;
  const int64_t end = begin + table.chunk < table.total ? begin + table.chunk : table.total;
  if (begin >= end) return;
  int t = find_tensor(offsets, table.n, begin);
  for (int64_t pos = begin; pos < end && t < table.n; ++t) {
    const int64_t t_begin = offsets[t], t_end = offsets[t + 1];
    const int64_t seg_end = t_end < end ? t_end : end;
    if (seg_end > pos) {
      S* ptrs[D];
#pragma unroll
      for (int d = 0; d < D; ++d) ptrs[d] = static_cast<S*>(table.pointer(d, t));
      op.begin_tensor(table, t);
      walk_segment<S, D, kUnrollT, Access>(ptrs, pos - t_begin, seg_end - t_begin, op);
    }
    pos = seg_end;
  }
}

template <typename S, int D, int kUnrollT = kUnroll, typename Op>
__device__ void walk_block_range(const Table& table, Op& op) {
  walk_block_range<S, D, kUnrollT>(table, table.offsets, op);
}

// NOTE: [Offsets in shared memory]
// A block starts with a binary search over the offsets: a chain of dependent global loads
// (8 for 144 tensors) before its first gradient load is issued, and then reads the
// offsets of every tensor its chunk touches. The unscale pass moves only 64 KB per
// 8K-element chunk, so that latency shows. Timed on the H200 in one call
// (docs/PERFORMANCE.md, benchmarks/cuda/unscale_lab.cu), a block copy of the offsets in
// shared memory, one coalesced load, took the pass at 8K chunks from 0.948 to 0.963 of a
// same-size copy (116M parameters in 144 tensors) and from 0.862 to 0.938 (118M in 1152
// mostly small tensors), and the read-only check at 32K chunks from 0.965 to 1.009 and
// from 0.905 to 0.975.
// The copy costs 8 bytes of L2 traffic per tensor per block; lists of more than
// kSharedOffsets tensors (32 KB of dynamic shared memory, within the 48 KB a launch gets
// without opting in; not timed beyond 1152 tensors) search in global memory. The host
// picks the kernel and sizes the dynamic shared memory to the list. The optimizers move
// 20-28 bytes per element and were not changed.
constexpr int kSharedOffsets = 4096;

// The block's shared copy of the n + 1 offsets (dynamic shared memory of that size).
__device__ const int64_t* stage_offsets(const Table& table, int64_t* shared) {
  for (int i = threadIdx.x; i <= table.n; i += blockDim.x) shared[i] = table.offsets[i];
  __syncthreads();
  return shared;
}

// ---- operations -----------------------------------------------------------------------

template <typename S>
struct UnscaleOp {
  using E = Element<S>;
  typename E::opmath inv;
  bool bad = false;
  __device__ static constexpr bool writes(int d) { return d == 0; }
  __device__ void begin_tensor(const Table&, int) {}
  __device__ void element(S (&e)[1]) {
    const auto x = E::load(e[0]) * inv;
    bad |= !isfinite(x);
    e[0] = E::store(x);
  }
};

template <typename S>
struct CheckOp {
  using E = Element<S>;
  typename E::opmath inv;
  bool bad = false;
  __device__ static constexpr bool writes(int) { return false; }
  __device__ void begin_tensor(const Table&, int) {}
  __device__ void element(S (&e)[1]) { bad |= !isfinite(E::load(e[0]) * inv); }
};

template <typename S, bool kAmsgrad>
struct AdamOp {
  static constexpr int D = kAmsgrad ? 5 : 4;
  using O = typename Element<S>::opmath;
  AdamHyper h;
  O inv;
  int steps_list;
  O step_size, sqrt_bc2, decay;
  __device__ static constexpr bool writes(int d) { return d != 1; }
  __device__ void begin_tensor(const Table& table, int t) {
    // The step being taken: the counter is incremented by a later launch.
    const double step = static_cast<double>(*static_cast<const float*>(table.pointer(steps_list, t))) + 1.0;
    const double bc1 = 1.0 - pow(h.beta1, step);
    const double bc2 = 1.0 - pow(h.beta2, step);
    step_size = static_cast<O>(h.lr / bc1);
    sqrt_bc2 = static_cast<O>(sqrt(bc2));
    decay = static_cast<O>(1.0 - h.lr * h.weight_decay);
  }
  __device__ void element(S (&e)[D]) {
    O p = e[0], g = e[1] * inv, m = e[2], v = e[3];
    if (h.weight_decay != 0) {
      if (h.decoupled_weight_decay) {
        p = p * decay;
      } else {
        g = g + static_cast<O>(h.weight_decay) * p;
      }
    }
    m = m * static_cast<O>(h.beta1) + static_cast<O>(1 - h.beta1) * g;
    v = v * static_cast<O>(h.beta2) + static_cast<O>(1 - h.beta2) * g * g;
    O v_used = v;
    if (kAmsgrad) {
      const O vmax = e[D - 1] > v ? e[D - 1] : v;
      e[D - 1] = vmax;
      v_used = vmax;
    }
    const O denom = sqrt(v_used) / sqrt_bc2 + static_cast<O>(h.eps);
    p = p - step_size * (m / denom);
    e[0] = p;
    e[2] = m;
    e[3] = v;
  }
};

template <typename S, bool kMomentum>
struct SgdOp {
  static constexpr int D = kMomentum ? 3 : 2;
  using O = typename Element<S>::opmath;
  SgdHyper h;
  O inv;
  int steps_list;
  bool first = false;
  __device__ static constexpr bool writes(int d) { return d != 1; }
  __device__ void begin_tensor(const Table& table, int t) {
    first = *static_cast<const float*>(table.pointer(steps_list, t)) == 0.0f;
  }
  __device__ void element(S (&e)[D]) {
    O p = e[0], d = e[1] * inv;
    if (h.weight_decay != 0) d = d + static_cast<O>(h.weight_decay) * p;
    if (kMomentum) {
      O buf = first ? d : e[2] * static_cast<O>(h.momentum) + static_cast<O>(1 - h.dampening) * d;
      e[D - 1] = buf;
      d = h.nesterov ? d + static_cast<O>(h.momentum) * buf : buf;
    }
    e[0] = p - static_cast<O>(h.lr) * d;
  }
};

// ---- kernels --------------------------------------------------------------------------

__device__ __forceinline__ bool skipped(const float* found_inf) {
  return found_inf != nullptr && *found_inf != 0.0f;
}

// kStageOffsets: NOTE: [Offsets in shared memory]; launched with (n + 1) * 8 bytes of
// dynamic shared memory when true.
template <typename S, bool kWrite, bool kStageOffsets, int kThreadsT = kThreads, int kUnrollT = kUnroll,
          typename Access = PlainAccess>
__global__ void __launch_bounds__(kThreadsT) unscale_kernel(Table table, const float* scale, float* found_inf) {
  using Op = typename std::conditional<kWrite, UnscaleOp<S>, CheckOp<S>>::type;
  extern __shared__ int64_t shared_offsets[];
  const int64_t* offsets = kStageOffsets ? stage_offsets(table, shared_offsets) : table.offsets;
  Op op;
  op.inv = inverse_scale<typename Element<S>::opmath>(scale);
  walk_block_range<S, 1, kUnrollT, Access>(table, offsets, op);
  if (op.bad) {
    *found_inf = 1.0f;  // racy on purpose: every writer writes the same value
  }
}

template <typename S, bool kAmsgrad>
__global__ void __launch_bounds__(kThreads) adam_kernel(Table table, AdamHyper h, const float* scale, const float* found_inf) {
  if (skipped(found_inf)) return;
  AdamOp<S, kAmsgrad> op;
  op.h = h;
  op.inv = inverse_scale<typename Element<S>::opmath>(scale);
  op.steps_list = AdamOp<S, kAmsgrad>::D;
  walk_block_range<S, AdamOp<S, kAmsgrad>::D>(table, op);
}

template <typename S, bool kMomentum>
__global__ void __launch_bounds__(kThreads) sgd_kernel(Table table, SgdHyper h, const float* scale, const float* found_inf) {
  if (skipped(found_inf)) return;
  SgdOp<S, kMomentum> op;
  op.h = h;
  op.inv = inverse_scale<typename Element<S>::opmath>(scale);
  op.steps_list = SgdOp<S, kMomentum>::D;
  walk_block_range<S, SgdOp<S, kMomentum>::D>(table, op);
}

__global__ void increment_steps_kernel(Table table, int list, const float* found_inf) {
  if (skipped(found_inf)) return;
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < table.n; t += gridDim.x * blockDim.x) {
    *static_cast<float*>(table.pointer(list, t)) += 1.0f;
  }
}

// ---- launch helpers -------------------------------------------------------------------

// NOTE: [Chunk size]
// Timed on the H200 (benchmarks/cuda/unscale_lab.cu; docs/PERFORMANCE.md has the
// table): giving each block one contiguous share of the whole range, as many blocks as fit
// at once, left the unscale pass at 0.71 of copy bandwidth at 116M parameters and the
// fused AdamW step at 0.79; fixed chunks handed out in order reach 0.95 and 0.96. Blocks
// then work on neighbouring memory, and a block that finishes early takes the next
// chunk. 16K elements was the best of 8K-64K for the optimizers, and for the unscale pass
// while its offsets were searched in global memory;
// the read-only check (4 bytes per element, nothing written) was best at 32K-64K and
// lost 6% at 16K.
// With the offsets in shared memory (NOTE: [Offsets in shared memory]) 8K and 16K are
// within 1% of each other for the unscale pass. At 116M each was ahead in some calls; at
// 1.29B and for 1152 small tensors 8K was ahead in all three calls with the final kernel
// (one of them: 0.963 / 0.956 / 0.938 of a same-size copy at 116M, 1.29B and 1152
// tensors, against 0.956 / 0.952 / 0.933 at 16K), so the unscale pass uses 8K.
constexpr int64_t kChunkElements = 16384;
constexpr int64_t kUnscaleChunkElements = 8192;
constexpr int64_t kCheckChunkElements = 32768;

Table device_table(const TensorTable& t, int64_t chunk = kChunkElements) {
  return Table{t.data, t.data + t.num_tensors + 1, t.num_tensors, t.total_elements, chunk};
}

int grid_for(const Table& table) {
  const int64_t blocks = (table.total + table.chunk - 1) / table.chunk;
  return static_cast<int>(blocks > 0 ? blocks : 1);
}

// 512 threads a block, 4 vectors in flight per thread: the fastest shape of those timed
// on the H200 for the unscale pass (docs/PERFORMANCE.md).
constexpr int kUnscaleThreads = 512;

// Bytes of dynamic shared memory for a kernel that stages the offsets of `table`.
size_t offsets_bytes(const Table& table) { return (table.n + 1) * sizeof(int64_t); }

template <typename S, bool kWrite>
void launch_unscale_typed(const Table& table, const float* scale, float* found_inf,
                          cudaStream_t stream) {
  if (table.n <= kSharedOffsets) {
    unscale_kernel<S, kWrite, true, kUnscaleThreads, kUnroll>
        <<<grid_for(table), kUnscaleThreads, offsets_bytes(table), stream>>>(table, scale, found_inf);
  } else {
    unscale_kernel<S, kWrite, false, kUnscaleThreads, kUnroll>
        <<<grid_for(table), kUnscaleThreads, 0, stream>>>(table, scale, found_inf);
  }
}

template <bool kWrite>
cudaError_t launch_unscale(const TensorTable& t, ElementType type, const float* scale,
                           float* found_inf, cudaStream_t stream) {
  if (t.total_elements == 0) return cudaSuccess;
  const Table table = device_table(t, kWrite ? kUnscaleChunkElements : kCheckChunkElements);
  switch (type) {
    case ElementType::kFloat32:
      launch_unscale_typed<float, kWrite>(table, scale, found_inf, stream);
      break;
    case ElementType::kFloat64:
      launch_unscale_typed<double, kWrite>(table, scale, found_inf, stream);
      break;
    case ElementType::kBFloat16:
      launch_unscale_typed<uint16_t, kWrite>(table, scale, found_inf, stream);
      break;
  }
  return cudaGetLastError();
}

template <typename S>
cudaError_t launch_adam_typed(const TensorTable& t, const AdamHyper& h, const float* scale,
                              const float* found_inf, cudaStream_t stream) {
  const Table table = device_table(t);
  if (h.amsgrad) {
    auto k = adam_kernel<S, true>;
    k<<<grid_for(table), kThreads, 0, stream>>>(table, h, scale, found_inf);
  } else {
    auto k = adam_kernel<S, false>;
    k<<<grid_for(table), kThreads, 0, stream>>>(table, h, scale, found_inf);
  }
  return cudaGetLastError();
}

template <typename S>
cudaError_t launch_sgd_typed(const TensorTable& t, const SgdHyper& h, const float* scale,
                             const float* found_inf, cudaStream_t stream) {
  const Table table = device_table(t);
  if (h.momentum != 0) {
    auto k = sgd_kernel<S, true>;
    k<<<grid_for(table), kThreads, 0, stream>>>(table, h, scale, found_inf);
  } else {
    auto k = sgd_kernel<S, false>;
    k<<<grid_for(table), kThreads, 0, stream>>>(table, h, scale, found_inf);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_unscale_and_check(const TensorTable& table, ElementType type, const float* scale,
                                     float* found_inf, cudaStream_t stream) {
  return launch_unscale<true>(table, type, scale, found_inf, stream);
}

cudaError_t launch_check_finite(const TensorTable& table, ElementType type, const float* scale,
                                float* found_inf, cudaStream_t stream) {
  return launch_unscale<false>(table, type, scale, found_inf, stream);
}

cudaError_t launch_fused_adam(const TensorTable& table, ElementType type, const AdamHyper& hyper,
                              const float* scale, const float* found_inf, cudaStream_t stream) {
  if (table.total_elements == 0) return cudaSuccess;
  return type == ElementType::kFloat64
             ? launch_adam_typed<double>(table, hyper, scale, found_inf, stream)
             : launch_adam_typed<float>(table, hyper, scale, found_inf, stream);
}

cudaError_t launch_fused_sgd(const TensorTable& table, ElementType type, const SgdHyper& hyper,
                             const float* scale, const float* found_inf, cudaStream_t stream) {
  if (table.total_elements == 0) return cudaSuccess;
  return type == ElementType::kFloat64
             ? launch_sgd_typed<double>(table, hyper, scale, found_inf, stream)
             : launch_sgd_typed<float>(table, hyper, scale, found_inf, stream);
}

cudaError_t launch_increment_steps(const TensorTable& table, int list, const float* found_inf,
                                   cudaStream_t stream) {
  if (table.num_tensors == 0) return cudaSuccess;
  const int blocks = (table.num_tensors + kThreads - 1) / kThreads;
  increment_steps_kernel<<<blocks, kThreads, 0, stream>>>(device_table(table), list, found_inf);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
