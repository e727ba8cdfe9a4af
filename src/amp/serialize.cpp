// SPDX-License-Identifier: BSD-3-Clause
// GradScaler's state I/O: state_dict / load_state_dict (maps of doubles, PyTorch's form)
// and save / load through torch::serialize archives (checkpoints).
//
// NOTE: [GradScaler archive format]
// GradScaler::save writes one nested archive under "lucid_amp_grad_scaler", so that it
// can share an archive with a model and an optimizer. Its entries are IValues:
//   format_version  int     2 (load reads 1..kGradScalerArchiveVersion)
//   enabled         bool
//   scale           double  the float32 scale, exactly
//   growth_factor, backoff_factor, min_scale, max_scale          double
//   growth_interval, growth_tracker, hysteresis, overflow_tracker int
//   steps_taken, steps_skipped, updates, overflow_updates, backoffs, growths,
//   overflow_streak  int    the counters (ScalerCounters)
//   since version 2:
//   hysteresis_refill, min_scale_policy (the enums as ints), overflow_warning_streak,
//   max_overflow_streak int; strict_inf_checks bool; updates_without_checks,
//   steps_without_gradients, min_scale_holds int (counters)
//   checksum        int     FNV-1a over all of the above (archive_checksum)
// The table archive_fields() lists each entry once (key, type, member), and save and load
// both walk it. A version 1 archive loads: the fields it lacks keep the loading scaler's
// options, and the counters it lacks start at 0.
// load reads and checks everything before it changes anything: a missing entry, an
// entry of the wrong type, an unknown version or a checksum that does not match throws
// c10::Error; values that are consistent but invalid (the checks of the options and of
// load_state_dict) throw c10::ValueError. Bytes that are not an archive at all are
// refused by torch::serialize::InputArchive::load_from (c10::Error) before this code runs.
// `enabled` is the one option not restored: an archive of a disabled scaler is refused by
// an enabled one (it holds no state), and a disabled scaler checks an archive and then
// ignores it, as its load_state_dict does.

#include <lucid/amp/serialize.h>

#include "amp/archive_check.h"
#include "amp/archive_format.h"
#include "amp/scaler_core.h"
#include "amp/scaler_state.h"

#include <c10/util/Exception.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <istream>
#include <iterator>
#include <ostream>
#include <sstream>
#include <type_traits>

namespace lucid {
namespace amp {
namespace detail {

namespace {

// Values as the archive holds them: integers and enums as int, doubles and the float32
// scale as double, bools as bool.
c10::IValue to_ivalue(bool v) { return c10::IValue(v); }
c10::IValue to_ivalue(float v) { return c10::IValue(static_cast<double>(v)); }
c10::IValue to_ivalue(int64_t v) { return c10::IValue(v); }

template <typename T>
constexpr ArchiveKind kind_of() {
  return std::is_same<T, bool>::value                                      ? ArchiveKind::kBool
         : std::is_same<T, double>::value || std::is_same<T, float>::value ? ArchiveKind::kDouble
                                                                           : ArchiveKind::kInt;
}

void from_ivalue(const c10::IValue& v, const char* /*key*/, bool& out) { out = v.toBool(); }
void from_ivalue(const c10::IValue& v, const char* /*key*/, int64_t& out) { out = v.toInt(); }
void from_ivalue(const c10::IValue& v, const char* key, float& out) {
  // The scale is saved as the double of its float32 value: anything else was not written
  // by GradScaler::save.
  const double d = v.toDouble();
  out = checked_scale(d, "state 'scale'");
  TORCH_CHECK_VALUE(static_cast<double>(out) == d, "GradScaler::load: '", key, "' ", d,
                    " is not a float32 value; the archive was not written by GradScaler::save.");
}

// The accessors of one member, reached through `Part` of ArchiveRecord (the record itself,
// its schedule or its counters).
template <auto kPart, auto kMember>
struct Access {
  static auto& of(ArchiveRecord& r) { return (r.*kPart).*kMember; }
  static const auto& of(const ArchiveRecord& r) { return (r.*kPart).*kMember; }
};
template <auto kMember>
struct Access<nullptr, kMember> {
  static auto& of(ArchiveRecord& r) { return r.*kMember; }
  static const auto& of(const ArchiveRecord& r) { return r.*kMember; }
};

template <auto kPart, auto kMember>
ArchiveField field(const char* key, int64_t since) {
  using A = Access<kPart, kMember>;
  using T = std::decay_t<decltype(A::of(std::declval<const ArchiveRecord&>()))>;
  return {key, kind_of<T>(), since,
          [](const ArchiveRecord& r, const char* /*key*/) { return to_ivalue(A::of(r)); },
          [](ArchiveRecord& r, const c10::IValue& v, const char* key) {
            from_ivalue(v, key, A::of(r));
          }};
}

// An option's entry: the option table's key, accessors and kind (an enum is saved as its
// value, an int); an enum value out of range is refused by validate_snapshot.
ArchiveField option_field(const char* key, int64_t since) {
  const OptionEntry* entry = find_option(key);
  TORCH_INTERNAL_ASSERT(entry != nullptr, "the archive names no option '", key, "'");
  const ArchiveKind kind = entry->kind == OptionKind::kDouble ? ArchiveKind::kDouble
                           : entry->kind == OptionKind::kBool ? ArchiveKind::kBool
                                                              : ArchiveKind::kInt;
  return {key, kind, since,
          [](const ArchiveRecord& r, const char* key) {
            return find_option(key)->get(r.schedule.options);
          },
          [](ArchiveRecord& r, const c10::IValue& v, const char* key) {
            find_option(key)->set(r.schedule.options, v);
          }};
}

constexpr auto kSchedule = &ArchiveRecord::schedule;
constexpr auto kCounters = &ArchiveRecord::counters;
using S = ScalerSnapshot;
using C = ScalerCounters;

// The order is the format: the checksum hashes the fields in it, and each version's
// fields are a prefix of the next one's.
const std::vector<ArchiveField>& all_fields() {
  static const std::vector<ArchiveField> fields = {
      field<nullptr, &ArchiveRecord::enabled>("enabled", 1),
      field<kSchedule, &S::scale>("scale", 1),
      option_field("growth_factor", 1),
      option_field("backoff_factor", 1),
      option_field("growth_interval", 1),
      field<kSchedule, &S::growth_tracker>("growth_tracker", 1),
      option_field("min_scale", 1),
      option_field("max_scale", 1),
      option_field("hysteresis", 1),
      field<kSchedule, &S::overflow_tracker>("overflow_tracker", 1),
      field<kCounters, &C::steps_taken>("steps_taken", 1),
      field<kCounters, &C::steps_skipped>("steps_skipped", 1),
      field<kCounters, &C::updates>("updates", 1),
      field<kCounters, &C::overflow_updates>("overflow_updates", 1),
      field<kCounters, &C::backoffs>("backoffs", 1),
      field<kCounters, &C::growths>("growths", 1),
      field<kCounters, &C::overflow_streak>("overflow_streak", 1),
      option_field("hysteresis_refill", 2),
      option_field("min_scale_policy", 2),
      option_field("overflow_warning_streak", 2),
      option_field("max_overflow_streak", 2),
      option_field("strict_inf_checks", 2),
      field<kCounters, &C::updates_without_checks>("updates_without_checks", 2),
      field<kCounters, &C::steps_without_gradients>("steps_without_gradients", 2),
      field<kCounters, &C::min_scale_holds>("min_scale_holds", 2),
  };
  return fields;
}

}  // namespace

std::vector<ArchiveField> archive_fields(int64_t version) {
  std::vector<ArchiveField> fields;
  for (const auto& field : all_fields()) {
    if (field.since_version <= version) {
      fields.push_back(field);
    }
  }
  return fields;
}

const std::vector<ArchiveField>& archive_fields() {
  static const std::vector<ArchiveField> fields = archive_fields(kGradScalerArchiveVersion);
  return fields;
}

namespace {

void fnv1a(uint64_t& hash, const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
}

void fnv1a_int(uint64_t& hash, int64_t value) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(value) >> (8 * i));
  }
  fnv1a(hash, bytes, 8);
}

}  // namespace

uint64_t archive_checksum(int64_t format_version, const std::vector<c10::IValue>& values) {
  // Each version's fields are a prefix of the next one's, so the keys of `values` are the
  // first values.size() of the whole table, whatever version is claimed.
  const std::vector<ArchiveField>& fields = all_fields();
  TORCH_INTERNAL_ASSERT(values.size() <= fields.size());
  uint64_t hash = 14695981039346656037ull;
  fnv1a(hash, "format_version", sizeof("format_version"));
  fnv1a_int(hash, format_version);
  for (size_t i = 0; i < values.size(); ++i) {
    fnv1a(hash, fields[i].key, std::strlen(fields[i].key) + 1);
    // By what the value holds, not what the field should hold: a value of the wrong
    // type is refused before the checksum is compared, and must not trip an assert here.
    int64_t bits = 0;
    const c10::IValue& v = values[i];
    if (v.isInt()) {
      bits = v.toInt();
    } else if (v.isBool()) {
      bits = v.toBool() ? 1 : 0;
    } else if (v.isDouble()) {
      const double d = v.toDouble();
      std::memcpy(&bits, &d, sizeof(bits));
    } else {
      const std::string tag = v.tagKind();
      fnv1a(hash, tag.data(), tag.size());
    }
    fnv1a_int(hash, bits);
  }
  return hash;
}

}  // namespace detail

namespace {

using detail::ArchiveKind;

constexpr const char* kLoadStateDict = "GradScaler::load_state_dict";
constexpr const char* kLoad = "GradScaler::load";

const double& required(const std::map<std::string, double>& state, const char* key) {
  const auto it = state.find(key);
  TORCH_CHECK_VALUE(it != state.end(), kLoadStateDict, ": the state has no '", key,
                    "' entry; pass a map produced by GradScaler::state_dict().");
  return it->second;
}

const double* optional_entry(const std::map<std::string, double>& state, const char* key) {
  const auto it = state.find(key);
  return it == state.end() ? nullptr : &it->second;
}

const char* kind_name(ArchiveKind kind) {
  switch (kind) {
    case ArchiveKind::kInt:
      return "an int";
    case ArchiveKind::kDouble:
      return "a float";
    case ArchiveKind::kBool:
      return "a bool";
  }
  return "?";
}

bool has_kind(const c10::IValue& value, ArchiveKind kind) {
  switch (kind) {
    case ArchiveKind::kInt:
      return value.isInt();
    case ArchiveKind::kDouble:
      return value.isDouble();
    case ArchiveKind::kBool:
      return value.isBool();
  }
  return false;
}

void check_counters(const ScalerCounters& c) {
  const int64_t all[] = {c.steps_taken,      c.steps_skipped,          c.updates,
                         c.overflow_updates, c.backoffs,               c.growths,
                         c.overflow_streak,  c.updates_without_checks, c.steps_without_gradients,
                         c.min_scale_holds};
  for (const int64_t v : all) {
    TORCH_CHECK_VALUE(v >= 0, kLoad, ": a counter is negative (", v,
                      "); the archive is not a GradScaler checkpoint.");
  }
  // overflow_updates + growths + updates_without_checks <= updates, taken without a sum
  // that a crafted archive could overflow: every counter is >= 0 here, so no difference
  // below goes negative once the one before it held.
  TORCH_CHECK_VALUE(
      c.overflow_updates <= c.updates && c.growths <= c.updates - c.overflow_updates &&
          c.updates_without_checks <= c.updates - c.overflow_updates - c.growths &&
          c.backoffs <= c.overflow_updates && c.overflow_streak <= c.overflow_updates &&
          c.min_scale_holds <= c.backoffs,
      kLoad, ": the counters contradict each other (updates ", c.updates, ", overflow_updates ",
      c.overflow_updates, ", backoffs ", c.backoffs, ", growths ", c.growths, ", overflow_streak ",
      c.overflow_streak, "); the archive is not a GradScaler checkpoint.");
}

// A snapshot that carries only `options`: what a load starts from (scaler_state.h).
detail::ScalerSnapshot snapshot_of(const GradScalerOptions& options) {
  detail::ScalerSnapshot s;
  s.options = options;
  return s;
}

}  // namespace

std::map<std::string, double> GradScaler::state_dict() const {
  if (!is_enabled()) {
    return {};  // as PyTorch: a disabled scaler has no state
  }
  const detail::ScalerSnapshot s = core().snapshot();
  std::map<std::string, double> state = {{"scale", static_cast<double>(s.scale)},
                                         {"growth_tracker", static_cast<double>(s.growth_tracker)}};
  for (const detail::OptionEntry& entry : detail::option_table()) {
    if (entry.in_state_dict == detail::InStateDict::kAlways ||
        (entry.in_state_dict == detail::InStateDict::kWhileOn &&
         detail::option_is_set(entry, s.options))) {
      state[entry.key] = detail::option_as_double(entry, s.options);
    }
  }
  // The hysteresis tracker goes with its guard.
  if (s.options.hysteresis() > 1) {
    state["overflow_tracker"] = static_cast<double>(s.overflow_tracker);
  }
  return state;
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  if (!is_enabled()) {
    return;  // nothing to load into a pass-through, as PyTorch
  }
  // Read and validate everything first, so that a bad map leaves the scaler as it was.
  detail::ScalerSnapshot s = snapshot_of(core().options());
  s.scale = detail::checked_scale(required(state, "scale"), "state 'scale'");
  // PyTorch's options are required. Guard keys are optional: absent, the scaler keeps its
  // own guards (a map from PyTorch or from an unguarded scaler says nothing about them).
  for (const detail::OptionEntry& entry : detail::option_table()) {
    if (entry.in_state_dict == detail::InStateDict::kNever) {
      continue;
    }
    const double* value = entry.in_state_dict == detail::InStateDict::kAlways
                              ? &required(state, entry.key)
                              : optional_entry(state, entry.key);
    if (value != nullptr) {
      entry.set(s.options, detail::option_value_of_double(entry, *value, kLoadStateDict));
    }
  }
  // PyTorch writes the tracker as "_growth_tracker"; either name is accepted.
  const double* tracker = optional_entry(state, "growth_tracker");
  const double* py_tracker = optional_entry(state, "_growth_tracker");
  TORCH_CHECK_VALUE(tracker != nullptr || py_tracker != nullptr, kLoadStateDict,
                    ": the state has no 'growth_tracker' entry (nor PyTorch's '_growth_tracker'); "
                    "pass a map produced by GradScaler::state_dict().");
  if (tracker != nullptr && py_tracker != nullptr) {
    TORCH_CHECK_VALUE(*tracker == *py_tracker, kLoadStateDict,
                      ": 'growth_tracker' (", *tracker, ") and '_growth_tracker' (",
                      *py_tracker, ") disagree; keep one of them.");
  }
  s.growth_tracker = detail::checked_integer(tracker != nullptr ? *tracker : *py_tracker,
                                             "growth_tracker", kLoadStateDict);
  // An absent overflow_tracker is 0.
  const double* overflow_tracker = optional_entry(state, "overflow_tracker");
  s.overflow_tracker =
      overflow_tracker != nullptr
          ? detail::checked_integer(*overflow_tracker, "overflow_tracker", kLoadStateDict)
          : 0;
  detail::validate_snapshot(s, kLoadStateDict);
  core().apply(s, nullptr);
}

void GradScaler::save(torch::serialize::OutputArchive& archive) const {
  // The counters are saved too: settle the ones still queued on the device first.
  const ScalerCounters counters = this->counters();
  const detail::ArchiveRecord record{is_enabled(), core().snapshot(), counters};
  const auto& fields = detail::archive_fields();
  std::vector<c10::IValue> values;
  values.reserve(fields.size());
  for (const auto& field : fields) {
    values.push_back(field.read(record, field.key));
  }
  torch::serialize::OutputArchive child(archive.compilation_unit());
  child.write("format_version", c10::IValue(kGradScalerArchiveVersion));
  for (size_t i = 0; i < fields.size(); ++i) {
    child.write(fields[i].key, values[i]);
  }
  const uint64_t checksum = detail::archive_checksum(kGradScalerArchiveVersion, values);
  child.write("checksum", c10::IValue(static_cast<int64_t>(checksum)));
  archive.write(kGradScalerArchiveKey, child);
}

void GradScaler::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive child;
  TORCH_CHECK(archive.try_read(kGradScalerArchiveKey, child), kLoad, ": the archive has no '",
              kGradScalerArchiveKey,
              "' entry, so it holds no lucid-amp GradScaler; write one with GradScaler::save or "
              "torch::save(scaler, ...).");
  // Structure first: every entry present, of its type, and the checksum right.
  c10::IValue version;
  TORCH_CHECK(child.try_read("format_version", version) && version.isInt(), kLoad,
              ": the GradScaler entry has no integer 'format_version'; the archive is "
              "truncated, corrupt or not a GradScaler checkpoint.");
  TORCH_CHECK(version.toInt() >= 1 && version.toInt() <= kGradScalerArchiveVersion, kLoad,
              ": the archive has format version ", version.toInt(),
              "; this lucid-amp reads versions 1 to ", kGradScalerArchiveVersion,
              " (a newer lucid-amp wrote it?).");
  const std::vector<detail::ArchiveField> fields = detail::archive_fields(version.toInt());
  std::vector<c10::IValue> values(fields.size());
  for (size_t i = 0; i < fields.size(); ++i) {
    TORCH_CHECK(child.try_read(fields[i].key, values[i]), kLoad, ": the archive has no '",
                fields[i].key, "' entry; it is truncated or not a GradScaler checkpoint.");
    TORCH_CHECK(has_kind(values[i], fields[i].kind), kLoad, ": '", fields[i].key,
                "' should be ", kind_name(fields[i].kind), " but holds a ",
                values[i].tagKind(), "; the archive is corrupt.");
  }
  c10::IValue checksum;
  TORCH_CHECK(child.try_read("checksum", checksum) && checksum.isInt(), kLoad,
              ": the archive has no integer 'checksum'; it is truncated or corrupt.");
  const uint64_t expected = detail::archive_checksum(version.toInt(), values);
  TORCH_CHECK(static_cast<uint64_t>(checksum.toInt()) == expected, kLoad,
              ": checksum mismatch (stored ", static_cast<uint64_t>(checksum.toInt()),
              ", computed ", expected, "); the archive is corrupt. Nothing was loaded.");

  // Then the values, with the checks every other source of state goes through. Fields an
  // older version lacks keep this scaler's options; its new counters start at 0.
  detail::ArchiveRecord record{true, snapshot_of(core().options()), ScalerCounters{}};
  for (size_t i = 0; i < fields.size(); ++i) {
    fields[i].write(record, values[i], fields[i].key);
  }
  detail::validate_snapshot(record.schedule, kLoad);
  check_counters(record.counters);
  const detail::ScalerSnapshot& s = record.schedule;
  const ScalerCounters& c = record.counters;

  if (!is_enabled()) {
    return;  // checked, and ignored, as load_state_dict does for a disabled scaler
  }
  TORCH_CHECK_VALUE(record.enabled, kLoad,
                    ": the archive was saved from a disabled GradScaler and holds no state "
                    "to load into this enabled one; build this scaler with enabled(false), or "
                    "load a checkpoint of an enabled scaler.");
  core().apply(s, &c);
}

namespace {

void load_scaler_from(GradScaler& scaler, std::istream& stream, const std::string& source) {
  // NOTE: [Archive integrity]: the zip and every record's CRC-32 are checked before
  // LibTorch parses anything (its reader skips CRCs, and its importer can crash on a
  // corrupt record).
  std::string bytes((std::istreambuf_iterator<char>(stream)), std::istreambuf_iterator<char>());
  TORCH_CHECK(!stream.bad(), "lucid::amp::load_scaler: reading ", source,
              " failed; nothing was loaded.");
  detail::check_zip_integrity(bytes, source);
  std::istringstream intact(bytes);
  torch::serialize::InputArchive archive;
  // LibTorch's reader throws c10::Error for a bad zip, torch::jit::ErrorReport (a
  // std::exception) for a bad record: both become one clear c10::Error.
  try {
    archive.load_from(intact);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "lucid::amp::load_scaler: ", source,
                " is not a readable torch::serialize archive; nothing was loaded. LibTorch "
                "says: ", e.what_without_backtrace());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "lucid::amp::load_scaler: ", source,
                " is not a readable torch::serialize archive; nothing was loaded. LibTorch "
                "says: ", e.what());
  }
  scaler.load(archive);
}

}  // namespace

void save_scaler(const GradScaler& scaler, std::ostream& stream) {
  torch::serialize::OutputArchive archive;
  scaler.save(archive);
  archive.save_to(stream);
}

void save_scaler(const GradScaler& scaler, const std::string& path) {
  torch::serialize::OutputArchive archive;
  scaler.save(archive);
  archive.save_to(path);
}

void load_scaler(GradScaler& scaler, std::istream& stream) {
  load_scaler_from(scaler, stream, "the stream");
}

void load_scaler(GradScaler& scaler, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file.good(), "lucid::amp::load_scaler: cannot open '", path,
              "' for reading; nothing was loaded.");
  load_scaler_from(scaler, file, "'" + path + "'");
}

torch::serialize::OutputArchive& operator<<(torch::serialize::OutputArchive& archive,
                                           const GradScaler& scaler) {
  scaler.save(archive);
  return archive;
}

torch::serialize::InputArchive& operator>>(torch::serialize::InputArchive& archive,
                                          GradScaler& scaler) {
  scaler.load(archive);
  return archive;
}

}  // namespace amp
}  // namespace lucid
