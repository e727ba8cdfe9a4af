// SPDX-License-Identifier: BSD-3-Clause
// CPU multi-tensor unscale-and-check.
//
// NOTE: [CPU unscale kernel]
// The pass is memory-bound: each gradient element is read once and written once, so the
// goal is the bandwidth of a plain copy_ of the same bytes. Four choices get there:
//  * Work is cut into fixed chunks across all tensors, so one huge tensor and many
//    small ones both spread evenly over ATen's thread pool (at::parallel_for).
//  * The finiteness test is integer arithmetic on the bits (exponent all ones) ORed
//    into a flag with no branch, so the compiler vectorises the loop; a branch on
//    std::isfinite would stop that.
//  * The loops are built twice (target_clones): AVX2 where the processor has it, the
//    x86-64 baseline otherwise; the choice is made once, when the library loads.
//  * bfloat16 is widened by a shift, multiplied in float32 and rounded back to nearest
//    even with integer ops, once, as c10::BFloat16 rounds.
// Each thread keeps its own flag and publishes it once, so threads never share a line.

#include "amp/cpu/amp_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

namespace lucid {
namespace amp {
namespace cpu {
namespace {

// 64 Ki elements (256 KiB of float32): large enough to amortise task dispatch, small
// enough that a few hundred MiB of gradients make many more chunks than threads.
constexpr int64_t kChunkElements = int64_t{1} << 16;

constexpr uint32_t kF32ExponentMask = 0x7f800000u;
constexpr uint64_t kF64ExponentMask = 0x7ff0000000000000ull;
constexpr uint16_t kBF16QuietNaN = 0x7fc0;

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define LUCID_CPU_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define LUCID_CPU_CLONES
#endif

struct Span {
  void* data;
  int64_t numel;
  at::ScalarType dtype;
  int64_t key;  // its gradient's key (NOTE: [Overflow site] in amp/scale_rule.h)
};

// The exponent field of an IEEE type: all ones means inf or NaN.
template <typename T>
struct Ieee;
template <>
struct Ieee<float> {
  using Bits = uint32_t;
  static constexpr Bits kExponent = kF32ExponentMask;
};
template <>
struct Ieee<double> {
  using Bits = uint64_t;
  static constexpr Bits kExponent = kF64ExponentMask;
};

// Multiplies a float32 or float64 span by `inv` in its own dtype; kWrite false is the
// read-only check (nothing stored). The test on the bits, not std::isfinite, keeps the
// loop branch-free so that it vectorises.
template <bool kWrite, typename T>
LUCID_CPU_CLONES bool unscale_span_ieee(T* p, int64_t n, T inv) {
  using Bits = typename Ieee<T>::Bits;
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T y = p[i] * inv;
    if (kWrite) p[i] = y;
    Bits bits;
    std::memcpy(&bits, &y, sizeof bits);
    bad |= static_cast<Bits>((bits & Ieee<T>::kExponent) == Ieee<T>::kExponent);
  }
  return bad != 0;
}

template <bool kWrite>
LUCID_CPU_CLONES bool unscale_span_bf16(uint16_t* p, int64_t n, float inv) {
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t widened = static_cast<uint32_t>(p[i]) << 16;
    float x;
    std::memcpy(&x, &widened, sizeof x);
    const float y = x * inv;
    uint32_t bits;
    std::memcpy(&bits, &y, sizeof bits);
    bad |= static_cast<uint32_t>((bits & kF32ExponentMask) == kF32ExponentMask);
    if (kWrite) {
      const bool is_nan = (bits & 0x7fffffffu) > kF32ExponentMask;
      const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
      p[i] = is_nan ? kBF16QuietNaN : static_cast<uint16_t>(rounded);
    }
  }
  return bad != 0;
}

template <bool kWrite>
bool unscale_span(const Span& span, float inv_f32, double inv_f64) {
  switch (span.dtype) {
    case at::kFloat:
      return unscale_span_ieee<kWrite>(static_cast<float*>(span.data), span.numel, inv_f32);
    case at::kDouble:
      return unscale_span_ieee<kWrite>(static_cast<double*>(span.data), span.numel, inv_f64);
    case at::kBFloat16:
      return unscale_span_bf16<kWrite>(static_cast<uint16_t*>(span.data), span.numel, inv_f32);
    default:
      TORCH_INTERNAL_ASSERT(false, "lucid-amp CPU unscale got dtype ", span.dtype);
  }
}

// The NaN and inf entries among a span's values times `inv` (1 for a span unscaled in
// place), added to `met`: counted exactly, one by one, on the rare path of a span that
// holds a non-finite value, so that the vectorised loops above stay as they are.
template <typename Load>
void count_non_finite(int64_t n, Load load, NonFinite& met) {
  for (int64_t i = 0; i < n; ++i) {
    const auto y = load(i);
    met.nan += std::isnan(y) ? 1 : 0;
    met.inf += std::isinf(y) ? 1 : 0;
  }
}

void count_non_finite(const Span& span, float inv_f32, double inv_f64, NonFinite& met) {
  switch (span.dtype) {
    case at::kFloat: {
      const float* p = static_cast<const float*>(span.data);
      return count_non_finite(
          span.numel, [&](int64_t i) { return p[i] * inv_f32; }, met);
    }
    case at::kDouble: {
      const double* p = static_cast<const double*>(span.data);
      return count_non_finite(
          span.numel, [&](int64_t i) { return p[i] * inv_f64; }, met);
    }
    case at::kBFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(span.data);
      return count_non_finite(
          span.numel,
          [&](int64_t i) {
            const uint32_t widened = static_cast<uint32_t>(p[i]) << 16;
            float x;
            std::memcpy(&x, &widened, sizeof x);
            return x * inv_f32;
          },
          met);
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "lucid-amp CPU count got dtype ", span.dtype);
  }
}

// The chunks in list order; a gradient's key is keys[i], or its index i without keys.
std::vector<Span> split_into_chunks(const std::vector<at::Tensor>& grads,
                                    const std::vector<int64_t>& keys) {
  std::vector<Span> spans;
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor& g = grads[i];
    auto* base = static_cast<char*>(g.data_ptr());
    const int64_t item = static_cast<int64_t>(g.element_size());
    const int64_t key = keys.empty() ? static_cast<int64_t>(i) : keys[i];
    for (int64_t off = 0; off < g.numel(); off += kChunkElements) {
      spans.push_back(
          {base + off * item, std::min(kChunkElements, g.numel() - off), g.scalar_type(), key});
    }
  }
  return spans;
}

}  // namespace

namespace {

// What the spans that hold a non-finite value (`bad(i)`) hold, in span order. Values
// unscaled in place (kWrite) are counted as they now are.
template <bool kWrite, typename Bad>
NonFinite non_finite_of(const std::vector<Span>& spans, Bad bad, float inv_f32, double inv_f64) {
  NonFinite met;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (bad(i)) {
      met.first = std::min(met.first, spans[i].key);
      count_non_finite(spans[i], kWrite ? 1.0f : inv_f32, kWrite ? 1.0 : inv_f64, met);
    }
  }
  return met;
}

template <bool kWrite>
NonFinite run_spans(const std::vector<at::Tensor>& grads, double inv_scale,
                    const std::vector<int64_t>& keys) {
  const std::vector<Span> spans = split_into_chunks(grads, keys);
  const float inv_f32 = static_cast<float>(inv_scale);
  std::vector<char> bad(spans.size(), 0);  // written only where a span holds one
  std::atomic<bool> found{false};
  at::parallel_for(0, static_cast<int64_t>(spans.size()), 1, [&](int64_t begin, int64_t end) {
    bool local = false;
    for (int64_t i = begin; i < end; ++i) {
      if (unscale_span<kWrite>(spans[i], inv_f32, inv_scale)) {
        bad[i] = 1;
        local = true;
      }
    }
    if (local) {
      found.store(true, std::memory_order_relaxed);
    }
  });
  return found.load() ? non_finite_of<kWrite>(
                            spans, [&](size_t i) { return bad[i] != 0; }, inv_f32, inv_scale)
                      : NonFinite();
}

}  // namespace

namespace {

// One span's finiteness and norm partial: sum of squares, or largest absolute value with
// NaN kept (a NaN anywhere makes the norm NaN, as PyTorch's).
struct NormPartial {
  bool bad = false;
  float value = 0.0f;
};

// Independent accumulators per span, in vector registers (GCC/Clang vector extensions, so
// that the loop is vectorised whatever the compiler's heuristics; AVX2 where present, as
// the unscale loops): element i goes to lane i % 16, so the loop carries no dependency
// from one element to the next and nothing is reassociated; the lanes are then combined
// in lane order, so the result is the same bits on any thread count.
typedef float Floats8 __attribute__((vector_size(32)));
typedef int32_t Ints8 __attribute__((vector_size(32)));
constexpr int64_t kNormLanes = 8;

// The exact norm partial of a span that holds a non-finite value (a NaN wins).
template <typename Load>
float norm_with_non_finite(int64_t n, bool inf_norm, Load load) {
  float value = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float x = load(i);
    if (inf_norm) {
      const float a = std::fabs(x);
      value = (std::isnan(a) || a > value) && !std::isnan(value) ? a : value;
    } else {
      value += x * x;
    }
  }
  return value;
}

template <typename Load>
LUCID_CPU_CLONES NormPartial norm_span(int64_t n, bool inf_norm, Load load) {
  Floats8 low{}, high{};
  // x - x is 0 for a finite x and NaN otherwise: the sum of them is NaN exactly when the
  // span holds a non-finite value.
  Floats8 poison{};
  const int64_t whole = n - n % (2 * kNormLanes);
  for (int64_t i = 0; i < whole; i += 2 * kNormLanes) {
    Floats8 x, y;
    for (int64_t j = 0; j < kNormLanes; ++j) {
      x[j] = load(i + j);
      y[j] = load(i + kNormLanes + j);
    }
    poison += (x - x) + (y - y);  // NOLINT(misc-redundant-expression): NaN unless finite
    if (inf_norm) {
      // |x| and the larger of two non-negative finite values, on the bits: for them the
      // integer order is the float order (spans with a non-finite value are redone below).
      // A cast between vector types of one size reinterprets the bits; it has no named
      // form that both GCC and Clang accept for vector-extension types.
      // NOLINTBEGIN(google-readability-casting)
      const Ints8 ax = (Ints8)x & 0x7fffffff, ay = (Ints8)y & 0x7fffffff;
      const Ints8 lo = (Ints8)low, hi = (Ints8)high;
      const Ints8 x_larger = ax > lo, y_larger = ay > hi;
      low = (Floats8)((ax & x_larger) | (lo & ~x_larger));
      high = (Floats8)((ay & y_larger) | (hi & ~y_larger));
      // NOLINTEND(google-readability-casting)
    } else {
      low += x * x;
      high += y * y;
    }
  }
  float tail = 0.0f;
  float tail_poison = 0.0f;
  for (int64_t i = whole; i < n; ++i) {
    const float x = load(i);
    tail_poison += x - x;  // NOLINT(misc-redundant-expression): NaN unless finite
    tail = inf_norm ? std::max(tail, std::fabs(x)) : tail + x * x;
  }
  NormPartial out;
  float poisoned = tail_poison;
  for (int64_t j = 0; j < kNormLanes; ++j) {
    poisoned += poison[j];
    out.value = inf_norm ? std::max({out.value, low[j], high[j]}) : out.value + (low[j] + high[j]);
  }
  out.value = inf_norm ? std::max(out.value, tail) : out.value + tail;
  out.bad = std::isnan(poisoned);
  if (out.bad) {
    out.value = norm_with_non_finite(n, inf_norm, load);  // the rare path, exactly
  }
  return out;
}

NormPartial norm_span(const Span& span, float inv_f32, double inv_f64, bool inf_norm) {
  switch (span.dtype) {
    case at::kFloat: {
      const float* p = static_cast<const float*>(span.data);
      return norm_span(span.numel, inf_norm, [&](int64_t i) { return p[i] * inv_f32; });
    }
    case at::kDouble: {
      const double* p = static_cast<const double*>(span.data);
      return norm_span(span.numel, inf_norm,
                       [&](int64_t i) { return static_cast<float>(p[i] * inv_f64); });
    }
    case at::kBFloat16: {
      const uint16_t* p = static_cast<const uint16_t*>(span.data);
      return norm_span(span.numel, inf_norm, [&](int64_t i) {
        const uint32_t widened = static_cast<uint32_t>(p[i]) << 16;
        float x;
        std::memcpy(&x, &widened, sizeof x);
        return x * inv_f32;
      });
    }
    default:
      TORCH_INTERNAL_ASSERT(false, "lucid-amp CPU norm got dtype ", span.dtype);
  }
}

}  // namespace

float check_and_norm(const std::vector<at::Tensor>& grads, double inv_scale, bool inf_norm,
                     const std::vector<int64_t>& keys, NonFinite* met) {
  const std::vector<Span> spans = split_into_chunks(grads, keys);
  const float inv_f32 = static_cast<float>(inv_scale);
  std::vector<NormPartial> partials(spans.size());
  at::parallel_for(0, static_cast<int64_t>(spans.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      partials[i] = norm_span(spans[i], inv_f32, inv_scale, inf_norm);
    }
  });
  NormPartial total;
  bool found = false;
  for (const NormPartial& p : partials) {  // chunk order: the same bits on any thread count
    found = found || p.bad;
    if (inf_norm) {
      total.value = (std::isnan(p.value) || p.value > total.value) && !std::isnan(total.value)
                        ? p.value
                        : total.value;
    } else {
      total.value += p.value;
    }
  }
  *met = found ? non_finite_of<false>(
                     spans, [&](size_t i) { return partials[i].bad; }, inv_f32, inv_scale)
               : NonFinite();
  return total.value;
}

NonFinite unscale_and_check_(const std::vector<at::Tensor>& grads, double inv_scale,
                             const std::vector<int64_t>& keys) {
  return run_spans<true>(grads, inv_scale, keys);
}

NonFinite check_finite(const std::vector<at::Tensor>& grads, double inv_scale,
                       const std::vector<int64_t>& keys) {
  return run_spans<false>(grads, inv_scale, keys);
}

}  // namespace cpu
}  // namespace amp
}  // namespace lucid
