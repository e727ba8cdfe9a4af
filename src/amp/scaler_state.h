// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the table of options, the checks every source of a scaler's state goes
// through (options, update's new_scale, load_state_dict, archives), and the snapshot
// state I/O is built on.
//
// NOTE: [One declaration per option]
// GradScalerOptions declares each option (its type, default and meaning). option_table()
// lists each once more, with what code that handles every option needs so that it never
// names one: its key (the one spelling in state dicts, archives, Python keywords and
// options dicts), its kind, its accessors and its range check. validate_options, the
// snapshot's checks, the archive's option entries and the Python binding's constructor
// and options() walk the table. What PyTorch's API spells out (the state_dict keys, the
// Python signature) names options where that API does; the relations between options
// (min_scale <= max_scale, init_scale within the guards) are checked after the table.

#include <lucid/amp/grad_scaler_options.h>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

enum class OptionKind { kDouble, kInt, kBool, kEnum };

// Whether state_dict() holds an option: PyTorch's always; a guard only while it is on
// (differs from its default), so that a default scaler's map is PyTorch's; the others
// never (archives hold them).
enum class InStateDict { kNever, kAlways, kWhileOn };

struct OptionEntry {
  const char* key;
  OptionKind kind;
  // kEnum: the name of each value, in value order (Python spells an enum by name).
  std::vector<const char*> value_names;
  // The value as an archive holds it: a double, an int (an enum by its value) or a bool.
  c10::IValue (*get)(const GradScalerOptions& options);
  // `value` holds the kind's type (an enum's value in range: enum_value, or archives'
  // own check); the option is set without a range check.
  void (*set)(GradScalerOptions& options, const c10::IValue& value);
  // Throws c10::ValueError naming the option (`entry`, this one) when `value` is out of
  // its range.
  void (*check)(const c10::IValue& value, const OptionEntry& entry);
  InStateDict in_state_dict;
};

// `value` (a state_dict's double) as the IValue entry.set takes: an integer option's
// value must be whole and within int32's range (checked_integer, `who` in the message);
// never for an enum or a bool option (they are not in state dicts).
c10::IValue option_value_of_double(const OptionEntry& entry, double value, const char* who);
// The option's value as a state_dict's double.
double option_as_double(const OptionEntry& entry, const GradScalerOptions& options);
// Whether the option differs from its default.
bool option_is_set(const OptionEntry& entry, const GradScalerOptions& options);

// Every option of GradScalerOptions, in its declaration order.
const std::vector<OptionEntry>& option_table();
// The entry whose key is `key`, or nullptr.
const OptionEntry* find_option(const std::string& key);
// The value of enum option `entry` named `name`; c10::ValueError listing the names.
int64_t enum_value(const OptionEntry& entry, const std::string& name);
// The name of an enum option's current value.
const char* enum_name(const OptionEntry& entry, const GradScalerOptions& options);

// The scale is stored in float32, so it must be a positive float32 value; returns it
// rounded to float32. `what` names the value in the message ("init_scale").
float checked_scale(double value, const char* what);
// A scale (already rounded to float32) must lie in [min_scale, max_scale rounded to float32].
void check_scale_within_guards(float scale, double min_scale, double max_scale, const char* what);
// A state_dict carries integers as doubles: a whole number within int32's range.
int64_t checked_integer(double value, const char* key, const char* who);

// Every option (the table's checks) and the relations between them (the GradScaler
// constructor).
void validate_options(const GradScalerOptions& options);

// Everything that defines a scaler's schedule from here on: its options and where the
// schedule stands. A load starts from the loading scaler's options and replaces what its
// source holds (init_scale, enabled and graph_safe are never replaced: they describe the
// scaler, not its schedule).
struct ScalerSnapshot {
  GradScalerOptions options;
  float scale = 0.0f;
  int64_t growth_tracker = 0;
  int64_t overflow_tracker = 0;
};

// Checks every option and the state against them; throws c10::ValueError naming the field
// and `who` (the entry point).
void validate_snapshot(const ScalerSnapshot& snapshot, const char* who);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
