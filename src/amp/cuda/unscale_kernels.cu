// SPDX-License-Identifier: BSD-3-Clause
// The scaler's multi-tensor CUDA kernels: unscale-and-check and the read-only check.
// NOTE: [Multi-tensor ranges] in cuda_common/tensor_table.h says how work is split.

#include "amp/cuda/unscale_kernel.cuh"

namespace lucid {
namespace amp {
namespace cuda {
namespace {

// NOTE: [Chunk size] in cuda_common/multi_tensor_apply.cuh. The unscale pass reads and
// writes 8 bytes per float32 element and stages its offsets, so a block's start-up is
// cheap and small chunks balance best; the read-only check moves 4 bytes per element
// and writes nothing, so it needs larger chunks to amortise the same start-up.
constexpr int64_t kUnscaleChunkElements = 8192;
constexpr int64_t kCheckChunkElements = 32768;

// The launch's table: chunks of `chunk` elements, capped at the list's mean tensor size
// for lists of small tensors (NOTE: [Chunks for lists of small tensors]), where one block
// walking many tensors in turn would take far longer than the pass's bytes.
Table launch_table(const TensorTable& t, int64_t chunk) {
  return cuda_common::device_table(t, cuda_common::chunk_for_list(t, chunk));
}

// Unchecked on purpose: launch_unscale below has checked the table. A block stages the
// offsets (NOTE: [Offsets in shared memory]) where the list's tensors fill its chunks: with
// chunks capped for small tensors there are about as many blocks as tensors, and each
// copying every offset would cost more than the few tensors it reads.
template <typename S, bool kWrite>
cudaError_t launch_unscale_typed(const Table& table, int64_t full_chunk, const float* scale,
                                 float* found_inf, int64_t* site, cudaStream_t stream) {
  if (table.n <= cuda_common::kSharedOffsets && table.chunk == full_chunk) {
    return cuda_common::launch_on_table(unscale_kernel<S, kWrite, true>, table, kUnscaleThreads,
                                        cuda_common::offsets_bytes(table), stream, scale, found_inf,
                                        site);
  }
  return cuda_common::launch_on_table(unscale_kernel<S, kWrite, false>, table, kUnscaleThreads, 0,
                                      stream, scale, found_inf, site);
}

template <bool kWrite>
cudaError_t launch_unscale(const TensorTable& t, ElementType type, const float* scale,
                           float* found_inf, int64_t* site, cudaStream_t stream) {
  if (t.total_elements == 0) return cudaSuccess;
  const int64_t chunk = kWrite ? kUnscaleChunkElements : kCheckChunkElements;
  const Table table = launch_table(t, chunk);
  switch (type) {
    case ElementType::kFloat32:
      return launch_unscale_typed<float, kWrite>(table, chunk, scale, found_inf, site, stream);
    case ElementType::kFloat64:
      return launch_unscale_typed<double, kWrite>(table, chunk, scale, found_inf, site, stream);
    case ElementType::kBFloat16:
      return launch_unscale_typed<uint16_t, kWrite>(table, chunk, scale, found_inf, site, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename S>
cudaError_t launch_norm_typed(const Table& table, const float* scale, float* found_inf,
                              int64_t* site, float* partials, bool inf_norm, cudaStream_t stream) {
  return inf_norm
             ? cuda_common::launch_on_table(norm_check_kernel<S, true>, table, kUnscaleThreads, 0,
                                            stream, scale, found_inf, site, partials)
             : cuda_common::launch_on_table(norm_check_kernel<S, false>, table, kUnscaleThreads, 0,
                                            stream, scale, found_inf, site, partials);
}

}  // namespace

int norm_partials(const TensorTable& table) {
  return cuda_common::grid_for(launch_table(table, kCheckChunkElements));
}

cudaError_t launch_check_and_norm(const TensorTable& t, ElementType type, const float* scale,
                                  float* found_inf, int64_t* site, float* partials, bool inf_norm,
                                  cudaStream_t stream) {
  const Table table = launch_table(t, kCheckChunkElements);
  switch (type) {
    case ElementType::kFloat32:
      return launch_norm_typed<float>(table, scale, found_inf, site, partials, inf_norm, stream);
    case ElementType::kFloat64:
      return launch_norm_typed<double>(table, scale, found_inf, site, partials, inf_norm, stream);
    case ElementType::kBFloat16:
      return launch_norm_typed<uint16_t>(table, scale, found_inf, site, partials, inf_norm, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t launch_unscale_and_check(const TensorTable& table, ElementType type, const float* scale,
                                     float* found_inf, int64_t* site, cudaStream_t stream) {
  return launch_unscale<true>(table, type, scale, found_inf, site, stream);
}

cudaError_t launch_check_finite(const TensorTable& table, ElementType type, const float* scale,
                                float* found_inf, int64_t* site, cudaStream_t stream) {
  return launch_unscale<false>(table, type, scale, found_inf, site, stream);
}

}  // namespace cuda
}  // namespace amp
}  // namespace lucid
