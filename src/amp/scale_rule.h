// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The loss-scale schedule as a pure function: one update of the scale and its trackers.
// Every backend follows it: the CPU kernel and the CUDA kernel both run this very code
// (it compiles for host and device), and the generic path computes the same decisions as
// tensor ops. Each of them also counts what the update did (count_update) where it runs.

#include <cfloat>
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LUCID_HOST_DEVICE __host__ __device__
#else
#define LUCID_HOST_DEVICE
#endif

namespace lucid {
namespace amp {
namespace detail {

// The scale and trackers after one update.
struct ScaleState {
  float scale;
  int32_t growth_tracker;
  // Overflowing updates absorbed by hysteresis since the count was last refilled, in
  // [0, hysteresis).
  int32_t overflow_tracker = 0;
};

// Everything one update depends on but the state: PyTorch's three parameters and the
// guards that change the update itself (min_scale is a check, NOTE: [Guards] in
// src/amp/scale_schedule.h). Built from a scaler's options in one place (rule_of in
// scale_schedule.h) and handed to every backend whole. With the guards at their defaults
// (off) next_scale_state is PyTorch's GradScaler rule exactly, but for the floor
// (kScaleFloor).
struct ScaleRule {
  // The scale is multiplied by growth_factor after growth_interval clean updates in a row,
  // and by backoff_factor after an overflow.
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  // Overflowing updates absorbed (step skipped, scale kept) before one backs off; once
  // used up, every overflow backs off until the count is refilled. 1 backs off on every
  // overflow.
  int64_t hysteresis = 1;
  // Refill the count on every clean update (DeepSpeed's consecutive_hysteresis=True)
  // instead of only when the scale grows (Megatron-LM, DeepSpeed's default).
  bool refill_on_clean = false;
  // Growth is capped here (float32; +inf is no cap).
  float max_scale = INFINITY;
};

// A backoff never takes the scale below float32's smallest normal value: a scale that
// collapses to subnormals and then 0 makes every later step 0 * loss and 1/0 in the
// unscale, so nothing would ever be learnt again. A scale already below it stays.
constexpr float kScaleFloor = FLT_MIN;

// What one update did.
enum class ScaleEvent {
  kNone,      // clean update, growth interval not reached
  kGrowth,    // growth interval reached: grown by growth_factor (capped), tracker reset
  kAbsorbed,  // overflow absorbed by hysteresis: scale kept
  kBackoff,   // overflow: multiplied by backoff_factor (not below kScaleFloor)
};

namespace rule {
LUCID_HOST_DEVICE inline bool is_finite(float x) {
#if defined(__CUDA_ARCH__)
  return ::isfinite(x);
#else
  return std::isfinite(x);
#endif
}
LUCID_HOST_DEVICE inline float larger(float a, float b) { return a < b ? b : a; }
LUCID_HOST_DEVICE inline float smaller(float a, float b) { return b < a ? b : a; }
}  // namespace rule

// One update, mirroring ATen's _amp_update_scale_ line by line (in float32, with the
// products formed in float64 and rounded once) so that a schedule is identical on every
// device; the floor and the guards are the only additions. Writes what happened to
// *event when given.
LUCID_HOST_DEVICE inline ScaleState next_scale_state(ScaleState state, bool found_inf,
                                                     const ScaleRule& rule,
                                                     ScaleEvent* event = nullptr) {
  ScaleEvent what = ScaleEvent::kNone;
  ScaleState next = state;
  if (found_inf) {
    next.growth_tracker = 0;
    if (state.overflow_tracker + 1 < rule.hysteresis) {
      // Hysteresis absorbs this overflow: the step was skipped, the scale stays.
      next.overflow_tracker = state.overflow_tracker + 1;
      what = ScaleEvent::kAbsorbed;
    } else {
      // The tracker stays at hysteresis - 1: each further overflow backs off until the
      // count is refilled.
      const float backed_off = static_cast<float>(state.scale * rule.backoff_factor);
      next.scale = rule::larger(backed_off, rule::smaller(state.scale, kScaleFloor));
      what = ScaleEvent::kBackoff;
    }
  } else {
    if (rule.refill_on_clean) {
      next.overflow_tracker = 0;
    }
    const int32_t successful = state.growth_tracker + 1;
    if (successful == rule.growth_interval) {
      const float grown = static_cast<float>(state.scale * rule.growth_factor);
      // Never grow past float32's largest finite value: keep the old scale instead.
      next.scale = rule::is_finite(grown) ? grown : state.scale;
      // max_scale caps growth (never lowers a scale that is below it).
      if (next.scale > rule.max_scale) {
        next.scale = rule::larger(rule.max_scale, state.scale);
      }
      next.growth_tracker = 0;
      next.overflow_tracker = 0;  // growth refills the hysteresis count in both modes
      what = ScaleEvent::kGrowth;
    } else {
      next.growth_tracker = successful;
    }
  }
  if (event != nullptr) {
    *event = what;
  }
  return next;
}

// What updates did, counted by the update itself where it runs (NOTE: [Counting on the
// device] in device_tally.h): int64 entries in this order, advanced by count_update.
enum UpdateCount : int {
  kCountUpdates,
  kCountOverflowUpdates,
  kCountBackoffs,
  kCountGrowths,
  kCountOverflowStreak,  // overflowing updates in a row
  kCountStepsTaken,      // steps counted by count_steps
  kCountStepsSkipped,
  kUpdateCountFields,
};

// Adds one update, which saw `found_inf` and did `event`, to `counts`.
LUCID_HOST_DEVICE inline void count_update(int64_t* counts, bool found_inf, ScaleEvent event) {
  counts[kCountUpdates] += 1;
  counts[kCountOverflowUpdates] += found_inf ? 1 : 0;
  counts[kCountBackoffs] += event == ScaleEvent::kBackoff ? 1 : 0;
  counts[kCountGrowths] += event == ScaleEvent::kGrowth ? 1 : 0;
  counts[kCountOverflowStreak] = found_inf ? counts[kCountOverflowStreak] + 1 : 0;
}

// NOTE: [Steps counted by the update]
// A scaler-aware step that leaves its outcome on the device (graph_safe mode, a captured
// step) skips on its optimizer's flag, which the host never reads. The update that ends
// its iteration counts it from that flag before take_found_inf sets the flag back: taken
// or skipped (kCountStepsTaken, kCountStepsSkipped), and its outcome kept per ordinal (1:
// skipped) until that ordinal steps again, where step_skipped() reads it. The ordinals
// that stepped so go to the update by value (SteppedOrdinals), so a captured update counts
// exactly the steps captured with it, on every replay, with no launch in step().
constexpr int kSteppedWords = 4;
constexpr int kMaxSteppedOrdinals = 64 * kSteppedWords;

struct SteppedOrdinals {
  uint64_t words[kSteppedWords] = {};

  LUCID_HOST_DEVICE bool has(int64_t ordinal) const {
    return ordinal < kMaxSteppedOrdinals && ((words[ordinal / 64] >> (ordinal % 64)) & 1) != 0;
  }
  // `ordinal` below kMaxSteppedOrdinals.
  void add(int ordinal) { words[ordinal / 64] |= uint64_t{1} << (ordinal % 64); }
  bool any() const {
    for (const uint64_t w : words) {
      if (w != 0) {
        return true;
      }
    }
    return false;
  }
};

// Counts the steps of `stepped` into `counts` by their flags `flags[0..n)`, and keeps each
// one's outcome in `outcomes` (n entries); call it before take_found_inf.
LUCID_HOST_DEVICE inline void count_steps(int64_t* counts, float* outcomes, const float* flags,
                                          int64_t n, const SteppedOrdinals& stepped) {
  for (int64_t j = 0; j < n; ++j) {
    if (stepped.has(j)) {
      const bool skipped = flags[j] != 0.0f;
      counts[skipped ? kCountStepsSkipped : kCountStepsTaken] += 1;
      outcomes[j] = skipped ? 1.0f : 0.0f;
    }
  }
}

// The step log (NOTE: [Step log] in step_log.h): a float64 tensor of 1 + kStepLogRows
// rows of kStepLogFields entries on the scale's device. Row 0 holds, in its first entry,
// how many updates were logged; update n writes row 1 + n % kStepLogRows, in this order.
enum StepLogField : int {
  kLogUpdate,         // n: the update's number since the log was made or last cleared
  kLogScale,          // the scale this iteration's gradients were divided by
  kLogNewScale,       // the scale after the update
  kLogFoundInf,       // the update's flag: bit j set when the iteration's optimizer j overflowed
                      // (take_found_inf); 0: none
  kLogEvent,          // ScaleEvent, as a number
  kLogGradNorm,       // the norm the iteration's last clip_grad_norm_ returned; -1: none
  kLogFirstOverflow,  // the iteration's first non-finite gradient (overflow_key); -1: none
  kLogNanCount,       // NaN entries the iteration's checks met, once unscaled
  kLogInfCount,       // inf entries the iteration's checks met, once unscaled
  kStepLogFields,
};
constexpr int64_t kStepLogRows = 1024;
// The optimizers a float32 flag tells apart, one bit each (take_found_inf): a float32
// holds every integer below 2^24 exactly.
constexpr int kOverflowOptimizerBits = 24;

// NOTE: [Overflow flags]
// Each optimizer's overflow flag is entry j of one float32 vector beside the scale, j its
// place in the iteration (OptimizerRecord::ordinal): the checks only ever raise it, the
// optimizers skip on it, and the update takes them all in its own kernel (take_found_inf)
// and sets them back to 0 for the next iteration. The vector is made with the scale (and
// grown for an iteration with more optimizers than it holds), so no check fills a flag of
// its own, and a captured iteration, replayed, leaves them as it found them.
//
// The update's one flag from the iteration's flags `flags[0..n)`: bit j set when flag j is
// non-zero, the flags from kOverflowOptimizerBits - 1 on sharing the last bit; 0 when none
// is. Sets every flag back to 0.
LUCID_HOST_DEVICE inline float take_found_inf(float* flags, int64_t n) {
  constexpr int kLastBit = kOverflowOptimizerBits - 1;
  int32_t bits = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (flags[j] != 0.0f) {
      bits |= int32_t{1} << (j < kLastBit ? j : kLastBit);
    }
    flags[j] = 0.0f;
  }
  return static_cast<float>(bits);
}

// NOTE: [Overflow site]
// The checks record where the iteration's gradients held inf/NaN once unscaled, in an
// int64 site of kOverflowSiteFields entries beside the step log. A gradient is named by a
// key, the optimizer's place in the iteration (OptimizerRecord::ordinal) in the high 32
// bits and the gradient's position among that optimizer's parameters (param groups
// concatenated in order) in the low ones, so the smallest key is the first optimizer's
// first offending gradient. Every check lowers kSiteFirstKey to the smallest key it met
// and adds the NaN and inf entries it met to the counts; the update logs the site
// (kLogFirstOverflow, kLogNanCount, kLogInfCount) and sets it back for the next iteration,
// in the same kernel, so eager, captured and replayed iterations are recorded alike and
// nothing is read on the host. A float64 holds every key and count below 2^53 exactly.
enum OverflowSiteField : int {
  kSiteFirstKey,  // the smallest key met; kNoOverflowKey: none
  kSiteNanCount,
  kSiteInfCount,
  kOverflowSiteFields,
};
constexpr int64_t kNoOverflowKey = INT64_MAX;

LUCID_HOST_DEVICE inline int64_t overflow_key(int ordinal, int64_t position) {
  return (static_cast<int64_t>(ordinal) << 32) | position;
}

// The site of an iteration that met nothing.
LUCID_HOST_DEVICE inline void reset_overflow_site(int64_t* site) {
  site[kSiteFirstKey] = kNoOverflowKey;
  site[kSiteNanCount] = 0;
  site[kSiteInfCount] = 0;
}

// Writes one update's row into the step log `log` (as above), after the update from `scale`
// to `new_scale` with the flag `found_inf`; `grad_norm` may be null (no clip). `site`: the
// iteration's overflow site (NOTE: [Overflow site]), or null; logged and set back.
LUCID_HOST_DEVICE inline void log_update(double* log, float scale, float new_scale, float found_inf,
                                         ScaleEvent event, const float* grad_norm, int64_t* site) {
  const auto n = static_cast<int64_t>(log[0]);
  double* row = log + (1 + n % kStepLogRows) * kStepLogFields;
  row[kLogUpdate] = static_cast<double>(n);
  row[kLogScale] = scale;
  row[kLogNewScale] = new_scale;
  row[kLogFoundInf] = found_inf;
  row[kLogEvent] = static_cast<double>(static_cast<int>(event));
  row[kLogGradNorm] = grad_norm != nullptr ? static_cast<double>(*grad_norm) : -1.0;
  row[kLogFirstOverflow] = -1.0;
  row[kLogNanCount] = 0.0;
  row[kLogInfCount] = 0.0;
  if (site != nullptr) {
    const int64_t first = site[kSiteFirstKey];
    row[kLogFirstOverflow] = first == kNoOverflowKey ? -1.0 : static_cast<double>(first);
    row[kLogNanCount] = static_cast<double>(site[kSiteNanCount]);
    row[kLogInfCount] = static_cast<double>(site[kSiteInfCount]);
    reset_overflow_site(site);
  }
  log[0] = static_cast<double>(n + 1);
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
