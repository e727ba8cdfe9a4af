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

// Unchecked on purpose: launch_unscale below has checked the table.
template <typename S, bool kWrite>
cudaError_t launch_unscale_typed(const Table& table, const float* scale, float* found_inf,
                                 int64_t* site, cudaStream_t stream) {
  if (table.n <= cuda_common::kSharedOffsets) {
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
  const Table table =
      cuda_common::device_table(t, kWrite ? kUnscaleChunkElements : kCheckChunkElements);
  switch (type) {
    case ElementType::kFloat32:
      return launch_unscale_typed<float, kWrite>(table, scale, found_inf, site, stream);
    case ElementType::kFloat64:
      return launch_unscale_typed<double, kWrite>(table, scale, found_inf, site, stream);
    case ElementType::kBFloat16:
      return launch_unscale_typed<uint16_t, kWrite>(table, scale, found_inf, site, stream);
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
  return cuda_common::grid_for(cuda_common::device_table(table, kCheckChunkElements));
}

cudaError_t launch_check_and_norm(const TensorTable& t, ElementType type, const float* scale,
                                  float* found_inf, int64_t* site, float* partials, bool inf_norm,
                                  cudaStream_t stream) {
  const Table table = cuda_common::device_table(t, kCheckChunkElements);
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
