// SPDX-License-Identifier: BSD-3-Clause
// The value checks shared by GradScaler's constructor, update(new_scale),
// load_state_dict and load (src/amp/scaler_state.h).

#include "amp/scaler_state.h"

#include <cfloat>
#include <cmath>

namespace lucid {
namespace amp {
namespace detail {

float checked_scale(double value, const char* what) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0.0, "GradScaler: ", what,
                    " must be finite and > 0, got ", value, ".");
  TORCH_CHECK_VALUE(value <= static_cast<double>(FLT_MAX), "GradScaler: ", what, " ", value,
                    " exceeds float32's largest finite value ", FLT_MAX,
                    "; the scale is kept in float32, pass a smaller value.");
  const float rounded = static_cast<float>(value);
  TORCH_CHECK_VALUE(rounded > 0.0f, "GradScaler: ", what, " ", value,
                    " rounds to 0 in float32, where the scale is kept; pass a larger value.");
  return rounded;
}

void check_growth_factor(double value) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 1.0,
                    "GradScaler: growth_factor must be finite and > 1.0, got ", value, ".");
}

void check_backoff_factor(double value) {
  TORCH_CHECK_VALUE(value > 0.0 && value < 1.0,
                    "GradScaler: backoff_factor must be in (0, 1), got ", value, ".");
}

void check_growth_interval(int64_t value) {
  TORCH_CHECK_VALUE(value >= 1 && value <= std::numeric_limits<int32_t>::max(),
                    "GradScaler: growth_interval must be in [1, 2147483647], got ", value, ".");
}

void check_min_scale(double value) {
  TORCH_CHECK_VALUE(std::isfinite(value) && value >= 0.0,
                    "GradScaler: min_scale must be finite and >= 0 (0 turns the guard off), got ",
                    value, ".");
}

void check_max_scale(double value) {
  TORCH_CHECK_VALUE(value > 0.0 && (std::isinf(value) || value <= static_cast<double>(FLT_MAX)),
                    "GradScaler: max_scale must be > 0 and at most float32's largest value ",
                    FLT_MAX, " (or +inf, which turns the guard off), got ", value, ".");
  TORCH_CHECK_VALUE(static_cast<float>(value) > 0.0f, "GradScaler: max_scale ", value,
                    " rounds to 0 in float32, where the scale is kept; pass a larger value.");
}

void check_hysteresis(int64_t value) {
  TORCH_CHECK_VALUE(value >= 1 && value <= std::numeric_limits<int32_t>::max(),
                    "GradScaler: hysteresis must be in [1, 2147483647] (1 turns it off), got ",
                    value, ".");
}

void check_scale_within_guards(float scale, double min_scale, double max_scale,
                               const char* what) {
  TORCH_CHECK_VALUE(static_cast<double>(scale) >= min_scale, "GradScaler: ", what, " ", scale,
                    " is below min_scale ", min_scale,
                    "; pass a scale >= min_scale or lower min_scale.");
  TORCH_CHECK_VALUE(scale <= static_cast<float>(max_scale), "GradScaler: ", what, " ", scale,
                    " is above max_scale ", max_scale,
                    "; pass a scale <= max_scale or raise max_scale.");
}

void validate_options(const GradScalerOptions& options) {
  const float init_scale = checked_scale(options.init_scale(), "init_scale");
  check_growth_factor(options.growth_factor());
  check_backoff_factor(options.backoff_factor());
  check_growth_interval(options.growth_interval());
  // The guards (NOTE: [Guards] in scale_schedule.h); off by default.
  check_min_scale(options.min_scale());
  check_max_scale(options.max_scale());
  TORCH_CHECK_VALUE(options.min_scale() <= options.max_scale(), "GradScaler: min_scale ",
                    options.min_scale(), " is above max_scale ", options.max_scale(), ".");
  check_hysteresis(options.hysteresis());
  TORCH_CHECK_VALUE(options.overflow_warning_streak() >= 0,
                    "GradScaler: overflow_warning_streak must be >= 0 (0 turns the warning off), "
                    "got ", options.overflow_warning_streak(), ".");
  TORCH_CHECK_VALUE(options.max_overflow_streak() >= 0,
                    "GradScaler: max_overflow_streak must be >= 0 (0 turns the guard off), got ",
                    options.max_overflow_streak(), ".");
  check_scale_within_guards(init_scale, options.min_scale(), options.max_scale(), "init_scale");
}

int64_t checked_integer(double value, const char* key, const char* who) {
  TORCH_CHECK_VALUE(std::isfinite(value) && std::floor(value) == value &&
                        std::abs(value) <= static_cast<double>(std::numeric_limits<int32_t>::max()),
                    who, ": '", key, "' must be a whole number within int32's range, got ", value,
                    ".");
  return static_cast<int64_t>(value);
}

void validate_snapshot(const ScalerSnapshot& s, const char* who) {
  // checked_scale's message names "state 'scale'"; the value is float32 already.
  checked_scale(static_cast<double>(s.scale), "state 'scale'");
  check_growth_factor(s.growth_factor);
  check_backoff_factor(s.backoff_factor);
  check_growth_interval(s.growth_interval);
  TORCH_CHECK_VALUE(s.growth_tracker >= 0 && s.growth_tracker < s.growth_interval, who,
                    ": 'growth_tracker' must be in [0, growth_interval=", s.growth_interval,
                    "), got ", s.growth_tracker, ".");
  check_min_scale(s.min_scale);
  check_max_scale(s.max_scale);
  TORCH_CHECK_VALUE(s.min_scale <= s.max_scale, who, ": min_scale ", s.min_scale,
                    " is above max_scale ", s.max_scale, ".");
  check_hysteresis(s.hysteresis);
  TORCH_CHECK_VALUE(s.overflow_tracker >= 0 && s.overflow_tracker < s.hysteresis, who,
                    ": 'overflow_tracker' must be in [0, hysteresis=", s.hysteresis, "), got ",
                    s.overflow_tracker, ".");
  TORCH_CHECK_VALUE(s.overflow_warning_streak >= 0, who,
                    ": 'overflow_warning_streak' must be >= 0, got ", s.overflow_warning_streak, ".");
  TORCH_CHECK_VALUE(s.max_overflow_streak >= 0, who,
                    ": 'max_overflow_streak' must be >= 0, got ", s.max_overflow_streak, ".");
  check_scale_within_guards(s.scale, s.min_scale, s.max_scale, "state 'scale'");
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
