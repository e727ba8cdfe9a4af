#pragma once

// Internal: integrity check of a torch::serialize archive (a zip file) before LibTorch
// parses it. NOTE: [Archive integrity] in src/amp/archive_check.cpp says why.

#include <cstddef>
#include <cstdint>
#include <string>

namespace lucid {
namespace amp {
namespace detail {

// CRC-32 (IEEE 802.3, the zip polynomial) of `size` bytes, continuing from `crc`.
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// Checks that `bytes` is one well-formed zip archive in which every record's data
// matches its CRC-32 (stored records as they are, deflated records once inflated), and
// returns the number of records. Throws c10::Error naming `source` and what is wrong.
// Reads only `bytes`; never allocates more than the archive's declared record sizes.
size_t check_zip_integrity(const std::string& bytes, const std::string& source);

// Inflates a raw deflate stream (RFC 1951) of exactly `expected_size` bytes; throws
// c10::Error (naming `what`) on any malformed input, or when the output would differ in
// size. Exposed for the tests and the fuzz target.
std::string inflate_raw(const uint8_t* data, size_t size, size_t expected_size,
                        const std::string& what);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
