// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the checks every source of a scaler's state goes through (options, update's
// new_scale, load_state_dict, archives), and the snapshot state I/O is built on.

#include <lucid/amp/grad_scaler_options.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <limits>

namespace lucid {
namespace amp {
namespace detail {

// The scale is stored in float32, so it must be a positive float32 value; returns it
// rounded to float32. `what` names the value in the message ("init_scale").
float checked_scale(double value, const char* what);
void check_growth_factor(double value);
void check_backoff_factor(double value);
// The tracker is int32 on the device (as PyTorch keeps it), so the interval must fit.
void check_growth_interval(int64_t value);
// min_scale: finite, >= 0 (0 = off).
void check_min_scale(double value);
// max_scale: +inf (off) or a positive value float32 can hold.
void check_max_scale(double value);
// hysteresis: in [1, 2147483647] (1 = off).
void check_hysteresis(int64_t value);
// A scale (already rounded to float32) must lie in [min_scale, max_scale rounded to float32].
void check_scale_within_guards(float scale, double min_scale, double max_scale, const char* what);
// A state_dict carries integers as doubles: a whole number within int32's range.
int64_t checked_integer(double value, const char* key, const char* who);

// Every option and the relations between them (the GradScaler constructor).
void validate_options(const GradScalerOptions& options);

// Everything that defines a scaler's schedule from here on.
struct ScalerSnapshot {
  float scale = 0.0f;
  double growth_factor = 0.0;
  double backoff_factor = 0.0;
  int64_t growth_interval = 1;
  int64_t growth_tracker = 0;
  double min_scale = 0.0;
  double max_scale = std::numeric_limits<double>::infinity();
  int64_t hysteresis = 1;
  int64_t overflow_tracker = 0;
  HysteresisRefill hysteresis_refill = HysteresisRefill::kOnGrowth;
  MinScalePolicy min_scale_policy = MinScalePolicy::kThrow;
  int64_t overflow_warning_streak = 100;
  int64_t max_overflow_streak = 0;
  bool strict_inf_checks = false;
};

// Checks every field and the relations between them; throws c10::ValueError naming the
// field and `who` (the entry point).
void validate_snapshot(const ScalerSnapshot& snapshot, const char* who);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
