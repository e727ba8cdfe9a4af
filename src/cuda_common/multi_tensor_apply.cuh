// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The multi-tensor walker shared by lucid-amp's CUDA kernels (src/amp/cuda,
// src/optim/cuda) and the kernel lab (benchmarks/cuda/unscale_lab.cu): element types,
// the device view of a TensorTable, the chunked range walk with offsets staged in shared
// memory, and the launch helpers. NOTE: [Multi-tensor ranges] in tensor_table.h says how
// work is split. Unchecked on purpose: the host launchers own every precondition (a
// table built by cuda_common::make_table, element types matching the table's lists).
//
// A kernel is an Op walked over this block's chunk:
//   struct Op {
//     static constexpr bool writes(int list);            // lists stored back
//     void begin_tensor(const Table&, int tensor);       // per-tensor set-up
//     void element(S (&e)[D]);                           // one element of each list
//   };

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda_common/tensor_table.h"

namespace lucid {
namespace cuda_common {

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

// A fused step is skipped on the device when the overflow flag is raised.
__device__ __forceinline__ bool skipped(const float* found_inf) {
  return found_inf != nullptr && *found_inf != 0.0f;
}

// ---- the range walk -------------------------------------------------------------------

// The device view of a TensorTable with the chunk size of one launch.
struct Table {
  const int64_t* offsets;   // n + 1 entries
  const int64_t* pointers;  // depth lists of n
  int n;
  int64_t total;
  int64_t chunk;  // elements per block, a multiple of 8 (NOTE: [Multi-tensor ranges])

  __device__ void* pointer(int list, int tensor) const {
    return reinterpret_cast<void*>(pointers[static_cast<int64_t>(list) * n + tensor]);
  }
  // An entry of a list of values rather than pointers (make_table's `values`).
  __device__ int64_t value(int list, int tensor) const {
    return pointers[static_cast<int64_t>(list) * n + tensor];
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

// 16 bytes seen as raw bits or as elements of S.
template <typename S>
union Pack {
  uint4 raw;
  S e[16 / sizeof(S)];
};

// The list whose 16-byte boundaries the vector loop follows; the other lists must meet a
// boundary at the same element, or the segment is walked element by element.
constexpr int kAlignmentList = 0;  // the first list of the table

// Applies `op` to the elements [lo, hi) of one tensor's `D` lists; op.element(S (&)[D])
// transforms one element of each list in registers; lists with Op::writes(d) are stored.
template <typename S, int D, typename Op>
__device__ void walk_segment(S* const (&ptrs)[D], int64_t lo, int64_t hi, Op& op) {
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
  // Head: up to the first 16-byte boundary of the alignment list.
  const int64_t misalign = (reinterpret_cast<uintptr_t>(ptrs[kAlignmentList] + lo) % 16) / sizeof(S);
  int64_t head_end = misalign == 0 ? lo : lo + (kPer - misalign);
  if (head_end > hi) head_end = hi;
  bool aligned = true;
#pragma unroll
  for (int d = kAlignmentList + 1; d < D; ++d)
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
          pack[u][d].raw = reinterpret_cast<const uint4*>(ptrs[d] + head_end)[idx];
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
            reinterpret_cast<uint4*>(ptrs[d] + head_end)[idx] = pack[u][d].raw;
          }
        }
      }
    }
  }
  for (int64_t i = head_end + nvec * kPer + threadIdx.x; i < hi; i += blockDim.x) scalar(i);
}

// Calls visit(tensor, lo, hi) for each tensor segment of this block's chunk of the
// concatenated elements, [lo, hi) in the tensor's own element indices. `offsets` is
// table.offsets or a block's copy of it (stage_offsets).
template <typename Visit>
__device__ void for_each_block_segment(const Table& table, const int64_t* offsets, Visit&& visit) {
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * table.chunk;
  const int64_t end = begin + table.chunk < table.total ? begin + table.chunk : table.total;
  if (begin >= end) return;
  int t = find_tensor(offsets, table.n, begin);
  for (int64_t pos = begin; pos < end && t < table.n; ++t) {
    const int64_t t_begin = offsets[t], t_end = offsets[t + 1];
    const int64_t seg_end = t_end < end ? t_end : end;
    if (seg_end > pos) {
      visit(t, pos - t_begin, seg_end - t_begin);
    }
    pos = seg_end;
  }
}

// This block's chunk walked tensor by tensor with `op` over the table's first D lists.
template <typename S, int D, typename Op>
__device__ void walk_block_range(const Table& table, const int64_t* offsets, Op& op) {
  for_each_block_segment(table, offsets, [&](int t, int64_t lo, int64_t hi) {
    S* ptrs[D];
#pragma unroll
    for (int d = 0; d < D; ++d) ptrs[d] = static_cast<S*>(table.pointer(d, t));
    op.begin_tensor(table, t);
    walk_segment<S, D>(ptrs, lo, hi, op);
  });
}

template <typename S, int D, typename Op>
__device__ void walk_block_range(const Table& table, Op& op) {
  walk_block_range<S, D>(table, table.offsets, op);
}

// NOTE: [Offsets in shared memory]
// A block starts with a binary search over the offsets for the first tensor of its chunk,
// then reads the offsets of every tensor the chunk touches. In global memory that search
// is a chain of dependent loads before the block's first data load; a kernel that moves
// few bytes per chunk (the unscale pass and the read-only check) feels that latency, most
// for lists of many small tensors. Such kernels first copy the n + 1 offsets into dynamic
// shared memory with one coalesced load (stage_offsets) and search there. The copy costs
// 8 bytes of L2 traffic per tensor per block, so lists of more than kSharedOffsets
// tensors (32 KB of dynamic shared memory, within the 48 KB a launch gets without opting
// in) search in global memory; the host picks the kernel and sizes the dynamic shared
// memory to the list (offsets_bytes). The optimizers move 20-28 bytes per element, so
// the search is a small share of a block's time; they search in global memory.
// docs/PERFORMANCE.md has the timings.
constexpr int kSharedOffsets = 4096;

// The block's shared copy of the n + 1 offsets (dynamic shared memory of that size).
__device__ __forceinline__ const int64_t* stage_offsets(const Table& table, int64_t* shared) {
  for (int i = threadIdx.x; i <= table.n; i += blockDim.x) shared[i] = table.offsets[i];
  __syncthreads();
  return shared;
}

// ---- launch helpers -------------------------------------------------------------------

// NOTE: [Chunk size]
// Blocks take fixed chunks of the concatenated elements, handed out in block order,
// rather than one contiguous share per resident block: neighbouring blocks then work on
// neighbouring memory, and a block that finishes early takes the next chunk instead of
// leaving its SM idle at the tail. The size trades each block's start-up (finding its
// first tensor) against that balance, so it follows the bytes a kernel moves per
// element: the optimizers (20-28 bytes) use kChunkElements, 16K; the unscale pass
// (8 bytes) and the read-only check (4 bytes, nothing written) choose their own in
// src/amp/cuda/unscale_kernels.cu. docs/PERFORMANCE.md has the timings that chose them.
constexpr int64_t kChunkElements = 16384;

// The device view of `t`, cut into chunks of `chunk` elements.
inline Table device_table(const TensorTable& t, int64_t chunk = kChunkElements) {
  return Table{t.data, t.data + t.num_tensors + 1, t.num_tensors, t.total_elements, chunk};
}

// One block per chunk (at least one block, so an empty table still launches validly).
inline int grid_for(const Table& table) {
  const int64_t blocks = (table.total + table.chunk - 1) / table.chunk;
  return static_cast<int>(blocks > 0 ? blocks : 1);
}

// NOTE: [Chunks for lists of small tensors]
// A block walks the tensors of its chunk one after another, and each costs dependent
// loads before its first element (its pointers; for the optimizers, its step counter),
// about a microsecond of memory latency. In fixed chunks, a list of many small tensors
// leaves that walk to a few blocks: 144 one-element tensors are one block of the
// optimizers' 16K chunk, and 288 are one block of the scaler's 32K check. chunk_for_list
// caps a launch's chunk at the list's mean tensor size (rounded up to a multiple of 8),
// so that a block meets only a few tensors and the walk is shared by as many blocks as
// there are tensors; a list whose mean tensor fills a chunk keeps the chunk it asked for.
// The optimizers' and the scaler's launches all take it. docs/PERFORMANCE.md has the
// timings.
inline int64_t chunk_for_list(const TensorTable& t, int64_t chunk) {
  if (t.num_tensors == 0) return chunk;
  const int64_t mean = (t.total_elements + t.num_tensors - 1) / t.num_tensors;
  const int64_t rounded = (mean + 7) / 8 * 8;
  return rounded < 8 ? 8 : (rounded < chunk ? rounded : chunk);
}

// Bytes of dynamic shared memory for a kernel that stages the offsets of `table`.
inline size_t offsets_bytes(const Table& table) { return (table.n + 1) * sizeof(int64_t); }

// Launches kernel(table, args...) with one block per chunk of `table` on `stream` and
// returns cudaGetLastError(); the LibTorch caller wraps it in C10_CUDA_CHECK.
template <typename... Params, typename... Args>
cudaError_t launch_on_table(void (*kernel)(Table, Params...), const Table& table, int threads,
                            size_t shared_bytes, cudaStream_t stream, Args... args) {
  kernel<<<grid_for(table), threads, shared_bytes, stream>>>(table, args...);
  return cudaGetLastError();
}

}  // namespace cuda_common
}  // namespace lucid
