#pragma once

// Internal: the fields of a GradScaler archive (format version 1), in order, and its
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

struct ArchiveField {
  const char* key;
  ArchiveKind kind;
};

// Every field after "format_version" and before "checksum", in the order they are
// written and hashed.
const std::vector<ArchiveField>& archive_fields();

// FNV-1a (64 bits) over the format version and each field's key and 8 value bytes (the
// int64, the double's bits, or the bool as an int64), in archive_fields() order.
// `values` holds one IValue per field (of any type: one of the wrong type hashes its tag).
uint64_t archive_checksum(int64_t format_version, const std::vector<c10::IValue>& values);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
