// SPDX-License-Identifier: BSD-3-Clause
// The table of options and the value checks shared by GradScaler's constructor,
// update(new_scale), load_state_dict and load (src/amp/scaler_state.h).

#include "amp/scaler_state.h"

#include <cfloat>
#include <cmath>
#include <limits>

namespace lucid {
namespace amp {
namespace detail {

namespace {

c10::IValue to_ivalue(double v) { return c10::IValue(v); }
c10::IValue to_ivalue(int64_t v) { return c10::IValue(v); }
c10::IValue to_ivalue(bool v) { return c10::IValue(v); }
c10::IValue to_ivalue(MinScalePolicy v) { return c10::IValue(static_cast<int64_t>(v)); }
c10::IValue to_ivalue(HysteresisRefill v) { return c10::IValue(static_cast<int64_t>(v)); }

void from_ivalue(const c10::IValue& v, double& out) { out = v.toDouble(); }
void from_ivalue(const c10::IValue& v, int64_t& out) { out = v.toInt(); }
void from_ivalue(const c10::IValue& v, bool& out) { out = v.toBool(); }
template <typename Enum>
void from_ivalue(const c10::IValue& v, Enum& out) {
  out = static_cast<Enum>(v.toInt());
}

// The range checks of the table; `entry` is the option's own.
void any_value(const c10::IValue& /*value*/, const OptionEntry& /*entry*/) {}

void positive_float32(const c10::IValue& value, const OptionEntry& entry) {
  checked_scale(value.toDouble(), entry.key);
}

void finite_above_one(const c10::IValue& value, const OptionEntry& entry) {
  const double v = value.toDouble();
  TORCH_CHECK_VALUE(std::isfinite(v) && v > 1.0, "GradScaler: ", entry.key,
                    " must be finite and > 1.0, got ", v, ".");
}

void in_open_unit_interval(const c10::IValue& value, const OptionEntry& entry) {
  const double v = value.toDouble();
  TORCH_CHECK_VALUE(v > 0.0 && v < 1.0, "GradScaler: ", entry.key, " must be in (0, 1), got ", v,
                    ".");
}

// A count kept in an int32 tracker on the device (as PyTorch keeps its growth tracker); a
// guard's (hysteresis) default 1 turns it off.
void positive_int32(const c10::IValue& value, const OptionEntry& entry) {
  const int64_t v = value.toInt();
  TORCH_CHECK_VALUE(v >= 1 && v <= std::numeric_limits<int32_t>::max(), "GradScaler: ", entry.key,
                    " must be in [1, 2147483647]",
                    entry.in_state_dict == InStateDict::kWhileOn ? " (1 turns it off)" : "",
                    ", got ", v, ".");
}

// A guard or a warning whose 0 turns it off.
void non_negative(const c10::IValue& value, const OptionEntry& entry) {
  const char* key = entry.key;
  if (value.isInt()) {
    TORCH_CHECK_VALUE(value.toInt() >= 0, "GradScaler: ", key,
                      " must be >= 0 (0 turns it off), got ", value.toInt(), ".");
    return;
  }
  const double v = value.toDouble();
  TORCH_CHECK_VALUE(std::isfinite(v) && v >= 0.0, "GradScaler: ", key,
                    " must be finite and >= 0 (0 turns it off), got ", v, ".");
}

// +inf (off) or a positive value float32 can hold.
void float32_or_infinity(const c10::IValue& value, const OptionEntry& entry) {
  const char* key = entry.key;
  const double v = value.toDouble();
  TORCH_CHECK_VALUE(v > 0.0 && (std::isinf(v) || v <= static_cast<double>(FLT_MAX)),
                    "GradScaler: ", key, " must be > 0 and at most float32's largest value ",
                    FLT_MAX, " (or +inf, which turns it off), got ", v, ".");
  TORCH_CHECK_VALUE(static_cast<float>(v) > 0.0f, "GradScaler: ", key, " ", v,
                    " rounds to 0 in float32, where the scale is kept; pass a larger value.");
}

void known_enum_value(const c10::IValue& value, const OptionEntry& entry) {
  const int64_t v = value.toInt();
  TORCH_CHECK_VALUE(v >= 0 && v < static_cast<int64_t>(entry.value_names.size()),
                    "GradScaler: ", entry.key, " must be in [0, ", entry.value_names.size(),
                    "), got ", v, ".");
}

constexpr OptionKind kind_of(double) { return OptionKind::kDouble; }
constexpr OptionKind kind_of(int64_t) { return OptionKind::kInt; }
constexpr OptionKind kind_of(bool) { return OptionKind::kBool; }
constexpr OptionKind kind_of(MinScalePolicy) { return OptionKind::kEnum; }
constexpr OptionKind kind_of(HysteresisRefill) { return OptionKind::kEnum; }

}  // namespace

// One line per option: its name (the accessor of GradScalerOptions and the key), its
// check, and for an enum the names of its values.
// clang-format off
#define LUCID_AMP_OPTION(name, check, in_state_dict, ...)                                   \
  OptionEntry{#name, kind_of(GradScalerOptions().name()), {__VA_ARGS__},                    \
              [](const GradScalerOptions& o) { return to_ivalue(o.name()); },               \
              [](GradScalerOptions& o, const c10::IValue& v) { from_ivalue(v, o.name()); }, \
              check, InStateDict::in_state_dict}
// clang-format on

const std::vector<OptionEntry>& option_table() {
  static const std::vector<OptionEntry> table = {
      LUCID_AMP_OPTION(init_scale, positive_float32, kNever),
      LUCID_AMP_OPTION(growth_factor, finite_above_one, kAlways),
      LUCID_AMP_OPTION(backoff_factor, in_open_unit_interval, kAlways),
      LUCID_AMP_OPTION(growth_interval, positive_int32, kAlways),
      LUCID_AMP_OPTION(enabled, any_value, kNever),
      LUCID_AMP_OPTION(graph_safe, any_value, kNever),
      LUCID_AMP_OPTION(min_scale, non_negative, kWhileOn),
      // In MinScalePolicy's order.
      LUCID_AMP_OPTION(min_scale_policy, known_enum_value, kNever, "throw", "clamp"),
      LUCID_AMP_OPTION(max_scale, float32_or_infinity, kWhileOn),
      LUCID_AMP_OPTION(hysteresis, positive_int32, kWhileOn),
      // In HysteresisRefill's order.
      LUCID_AMP_OPTION(hysteresis_refill, known_enum_value, kNever, "on_growth", "on_clean_update"),
      LUCID_AMP_OPTION(overflow_warning_streak, non_negative, kNever),
      LUCID_AMP_OPTION(max_overflow_streak, non_negative, kNever),
      LUCID_AMP_OPTION(strict_inf_checks, any_value, kNever),
  };
  return table;
}

#undef LUCID_AMP_OPTION

const OptionEntry* find_option(const std::string& key) {
  for (const OptionEntry& entry : option_table()) {
    if (key == entry.key) {
      return &entry;
    }
  }
  return nullptr;
}

int64_t enum_value(const OptionEntry& entry, const std::string& name) {
  std::string names;
  for (size_t i = 0; i < entry.value_names.size(); ++i) {
    if (name == entry.value_names[i]) {
      return static_cast<int64_t>(i);
    }
    names += (i == 0 ? "'" : (i + 1 == entry.value_names.size() ? " or '" : ", '"));
    names += std::string(entry.value_names[i]) + "'";
  }
  C10_THROW_ERROR(ValueError,
                  c10::str("GradScaler: ", entry.key, " must be ", names, ", got '", name, "'."));
}

c10::IValue option_value_of_double(const OptionEntry& entry, double value, const char* who) {
  TORCH_INTERNAL_ASSERT(entry.kind == OptionKind::kDouble || entry.kind == OptionKind::kInt);
  if (entry.kind == OptionKind::kInt) {
    return c10::IValue(checked_integer(value, entry.key, who));
  }
  return c10::IValue(value);
}

double option_as_double(const OptionEntry& entry, const GradScalerOptions& options) {
  const c10::IValue v = entry.get(options);
  return v.isDouble() ? v.toDouble() : static_cast<double>(v.isInt() ? v.toInt() : v.toBool());
}

bool option_is_set(const OptionEntry& entry, const GradScalerOptions& options) {
  return option_as_double(entry, options) != option_as_double(entry, GradScalerOptions());
}

const char* enum_name(const OptionEntry& entry, const GradScalerOptions& options) {
  return entry.value_names.at(static_cast<size_t>(entry.get(options).toInt()));
}

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

void check_scale_within_guards(float scale, double min_scale, double max_scale,
                               const char* what) {
  TORCH_CHECK_VALUE(static_cast<double>(scale) >= min_scale, "GradScaler: ", what, " ", scale,
                    " is below min_scale ", min_scale,
                    "; pass a scale >= min_scale or lower min_scale.");
  TORCH_CHECK_VALUE(scale <= static_cast<float>(max_scale), "GradScaler: ", what, " ", scale,
                    " is above max_scale ", max_scale,
                    "; pass a scale <= max_scale or raise max_scale.");
}

namespace {

// Each option's own range, then min_scale <= max_scale; `who` prefixes the relation's
// message.
void check_each_option(const GradScalerOptions& options, const char* who) {
  for (const OptionEntry& entry : option_table()) {
    entry.check(entry.get(options), entry);
  }
  TORCH_CHECK_VALUE(options.min_scale() <= options.max_scale(), who, ": min_scale ",
                    options.min_scale(), " is above max_scale ", options.max_scale(), ".");
}

}  // namespace

void validate_options(const GradScalerOptions& options) {
  check_each_option(options, "GradScaler");
  const float init_scale = static_cast<float>(options.init_scale());
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
  check_each_option(s.options, who);
  const GradScalerOptions& o = s.options;
  TORCH_CHECK_VALUE(s.growth_tracker >= 0 && s.growth_tracker < o.growth_interval(), who,
                    ": 'growth_tracker' must be in [0, growth_interval=", o.growth_interval(),
                    "), got ", s.growth_tracker, ".");
  TORCH_CHECK_VALUE(s.overflow_tracker >= 0 && s.overflow_tracker < o.hysteresis(), who,
                    ": 'overflow_tracker' must be in [0, hysteresis=", o.hysteresis(), "), got ",
                    s.overflow_tracker, ".");
  check_scale_within_guards(s.scale, o.min_scale(), o.max_scale(), "state 'scale'");
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
