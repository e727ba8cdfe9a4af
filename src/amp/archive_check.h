// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Internal: integrity check of a torch::serialize archive (a zip file) before LibTorch
// parses it. NOTE: [Archive integrity] in src/amp/archive_check.cpp says why.

#include <cstddef>
#include <cstdint>
#include <string>

namespace lucid {
namespace amp {
namespace detail {

// CRC-32 (IEEE 802.3, the zip polynomial) of `size` bytes, continuing from `crc`
// (zlib's crc32, fed in pieces that fit its 32-bit lengths).
uint32_t crc32(const void* data, size_t size, uint32_t crc = 0);

// Checks that `bytes` is one well-formed zip archive in which every record's data
// matches its CRC-32 (stored records as they are, deflated records once inflated), and
// returns the number of records. Throws c10::Error naming `source` and what is wrong.
// Reads only `bytes`; inflates a deflated record 64 KiB at a time, whatever size it
// claims, and keeps none of it.
size_t check_zip_integrity(const std::string& bytes, const std::string& source);

// Inflates a raw deflate stream (RFC 1951) of exactly `expected_size` bytes with zlib;
// throws c10::Error (naming `what`) on any stream zlib refuses, one that ends early, or
// when the output would differ in size. Bytes after the stream's last block are not
// read. The zip check inflates the same way, without keeping the output. Exposed for the
// tests and the fuzz target.
std::string inflate_raw(const uint8_t* data, size_t size, size_t expected_size,
                        const std::string& what);

}  // namespace detail
}  // namespace amp
}  // namespace lucid
