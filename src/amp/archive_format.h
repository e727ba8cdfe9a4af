#pragma once

// Internal: the fields of a GradScaler archive, in order, and its
// checksum. Described in src/amp/serialize.cpp; the fuzz target uses these to build
// archives with a valid checksum around invalid values.

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

enum class ArchiveKind { kInt, kDouble, kBool };

// The values of one archive, as written (the scale as the double of its float32 value).
struct ArchiveRecord {
  bool enabled = true;
  double scale = 0.0;
  double growth_factor = 0.0;
  double backoff_factor = 0.0;
  int64_t growth_interval = 0;
  int64_t growth_tracker = 0;
  double min_scale = 0.0;
  double max_scale = 0.0;
  int64_t hysteresis = 0;
  int64_t overflow_tracker = 0;
  int64_t steps_taken = 0;
  int64_t steps_skipped = 0;
  int64_t updates = 0;
  int64_t overflow_updates = 0;
  int64_t backoffs = 0;
  int64_t growths = 0;
  int64_t overflow_streak = 0;
  // Since format version 2.
  int64_t hysteresis_refill = 0;  // HysteresisRefill as an int
  int64_t min_scale_policy = 0;   // MinScalePolicy as an int
  int64_t overflow_warning_streak = 0;
  int64_t max_overflow_streak = 0;
  bool strict_inf_checks = false;
  int64_t updates_without_checks = 0;
  int64_t steps_without_gradients = 0;
  int64_t min_scale_holds = 0;
};

// One entry of the archive: its key, its type and the ArchiveRecord member holding it
// (the member pointer of `kind`'s type is set, the others are null).
struct ArchiveField {
  const char* key;
  ArchiveKind kind;
  int64_t ArchiveRecord::*int_member = nullptr;
  double ArchiveRecord::*double_member = nullptr;
  bool ArchiveRecord::*bool_member = nullptr;
  // The first format version that has the field.
  int64_t since_version = 1;
};

// Every field of format version `version` after "format_version" and before "checksum",
// in the order they are written and hashed; save and load both walk this table.
std::vector<ArchiveField> archive_fields(int64_t version);
// The fields of the version GradScaler::save writes.
const std::vector<ArchiveField>& archive_fields();

// The field's value in `record`, as the IValue save writes.
c10::IValue read_field(const ArchiveRecord& record, const ArchiveField& field);
// Stores `value` (which must hold the field's kind) into `record`.
void write_field(ArchiveRecord& record, const ArchiveField& field, const c10::IValue& value);

// FNV-1a (64 bits) over the format version and each field's key and 8 value bytes (the
// int64, the double's bits, or the bool as an int64), in archive_fields(format_version)
// order.
// `values` holds one IValue per field (of any type: one of the wrong type hashes its tag).
uint64_t archive_checksum(int64_t format_version, const std::vector<c10::IValue>& values);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
