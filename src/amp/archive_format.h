// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: the fields of a GradScaler archive, in order, and its
// checksum. Described in src/amp/serialize.cpp; the fuzz target uses these to build
// archives with a valid checksum around invalid values.

#include <lucid/amp/diagnostics.h>

#include "amp/scaler_state.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {

enum class ArchiveKind { kInt, kDouble, kBool };

// What one archive holds: the scaler's schedule (with its options but `enabled`), whether
// it was enabled, and its counters.
struct ArchiveRecord {
  bool enabled = true;
  ScalerSnapshot schedule;
  ScalerCounters counters;
};

// One entry of the archive: its key, its type, the first format version that has it, and
// how it is read from and written into an ArchiveRecord (archive_fields() builds these
// from member pointers, or an option's from the option table, so each entry names its
// member once). `key` is the entry's own key.
struct ArchiveField {
  const char* key;
  ArchiveKind kind;
  int64_t since_version;
  c10::IValue (*read)(const ArchiveRecord& record, const char* key);
  // `value` holds `kind` (load checks that first); `key` names it in messages. Throws
  // c10::ValueError for a value the member cannot hold (a scale that is not a float32
  // value, an unknown enum value).
  void (*write)(ArchiveRecord& record, const c10::IValue& value, const char* key);
};

// Every field of format version `version` after "format_version" and before "checksum",
// in the order they are written and hashed; save and load both walk this table.
std::vector<ArchiveField> archive_fields(int64_t version);
// The fields of the version GradScaler::save writes.
const std::vector<ArchiveField>& archive_fields();

// FNV-1a (64 bits) over the format version and each field's key and 8 value bytes (the
// int64, the double's bits, or the bool as an int64), in archive_fields(format_version)
// order.
// `values` holds one IValue per field (of any type: one of the wrong type hashes its tag).
uint64_t archive_checksum(int64_t format_version, const std::vector<c10::IValue>& values);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
