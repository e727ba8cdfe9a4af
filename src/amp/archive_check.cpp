// SPDX-License-Identifier: BSD-3-Clause
// NOTE: [Archive integrity]
// A torch::serialize archive is a zip file: data.pkl (the pickled attributes), the
// TorchScript source of the module class (code/...py, some records deflated), constants
// and a version record. PyTorch builds its zip reader (miniz) with CRC checks off, so a
// flipped byte reaches the parsers unnoticed, and LibTorch 1.13's TorchScript importer
// crashes (SIGSEGV in ScriptTypeParser::parseClassConstant) on some single-byte
// corruptions of the code records (found by test_serialize's byte-flip test). The values
// lucid-amp writes carry their own checksum (NOTE: [GradScaler archive format]), but the
// crash comes before they are read. So load_scaler checks the zip first: every record
// where the central directory says, local and central headers agreeing, one volume, no
// flags or directory entries that torch::serialize does not write (byte flips there
// reach LibTorch's reader, which refuses them only after reading uninitialised memory
// under valgrind), data inside the file, and the data's CRC-32 equal to the recorded
// one. zlib computes the CRC-32 and inflates the deflated records (raw deflate, in
// pieces, so that a record's claimed size costs no memory). Accidental corruption (bit
// rot, a torn write, truncation) is then refused with a clear error before LibTorch
// sees it. An archive crafted to keep its CRCs right can still reach LibTorch's parsers:
// like torch.load, do not load checkpoints from untrusted sources.

#include "amp/archive_check.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>

namespace lucid {
namespace amp {
namespace detail {
namespace {

// zlib counts input and output in uInt (32 bits); longer buffers go in pieces of this.
constexpr size_t kMaxZlibPiece = std::numeric_limits<uInt>::max();
// Output is inflated into a buffer of at most this size, then handed on.
constexpr size_t kInflatePiece = size_t{1} << 16;

// Inflates the raw deflate stream (RFC 1951, no zlib header or trailer, as zip records
// hold it) data[0, size) with zlib, handing each piece of output to sink(bytes, n).
// Throws c10::Error naming `what` when zlib refuses the stream, when the stream ends
// before its last block, and when its output is not exactly `expected_size` bytes (the
// output is cut off one byte past that size, never inflated further). Input after the
// last block is not read.
template <typename Sink>
void inflate_pieces(const uint8_t* data, size_t size, size_t expected_size,
                    const std::string& what, Sink&& sink) {
  const auto fail = [&](const std::string& why) {
    TORCH_CHECK(false, what, " is not a valid deflate stream (", why,
                "); the archive is corrupt.");
  };
  z_stream z{};
  // Negative window bits: raw deflate, with the largest window (32 KiB) the format allows.
  const int init = inflateInit2(&z, -MAX_WBITS);
  TORCH_CHECK(init == Z_OK, "zlib could not start inflating ", what, " (", zError(init), ")");
  struct End {
    z_stream* z;
    ~End() { inflateEnd(z); }
  } end{&z};
  // One byte more than the declared size fits, so that output past it is seen.
  const size_t piece = std::min(expected_size, kInflatePiece - 1) + 1;
  const std::unique_ptr<Bytef[]> buf(new Bytef[piece]);
  size_t in_left = size, produced = 0;
  for (;;) {
    if (z.avail_in == 0 && in_left > 0) {
      const size_t n = std::min(in_left, kMaxZlibPiece);
      z.next_in = const_cast<Bytef*>(data + (size - in_left));
      z.avail_in = static_cast<uInt>(n);
      in_left -= n;
    }
    z.next_out = buf.get();
    z.avail_out = static_cast<uInt>(piece);
    const int rc = inflate(&z, Z_NO_FLUSH);
    const size_t n = piece - z.avail_out;
    if (n > expected_size - produced) {
      fail("it inflates past its declared size");
    }
    sink(buf.get(), n);
    produced += n;
    if (rc == Z_STREAM_END) {
      break;
    }
    if (rc == Z_DATA_ERROR) {
      // zlib names the fault: an invalid block type, stored length, code set, code or
      // distance, or a distance back past the start of the output.
      fail(std::string("zlib: ") + (z.msg != nullptr ? z.msg : "invalid data"));
    }
    TORCH_CHECK(rc != Z_MEM_ERROR, "zlib ran out of memory inflating ", what);
    // Z_BUF_ERROR: no progress with room for output, so every input byte has been
    // given (input is fed before each call) and the stream needs more than there is.
    if (rc == Z_BUF_ERROR) {
      fail("it ends early");
    }
    if (rc != Z_OK) {
      fail(std::string("zlib: ") + zError(rc));
    }
  }
  TORCH_CHECK(produced == expected_size, what, " inflates to ", produced,
              " bytes, but its header says ", expected_size, "; the archive is corrupt.");
}

// ---------------------------------------------------------------------------------------
// Zip structure.

uint32_t le16(const std::string& b, size_t at) {
  return static_cast<uint8_t>(b[at]) | (static_cast<uint32_t>(static_cast<uint8_t>(b[at + 1])) << 8);
}
uint32_t le32(const std::string& b, size_t at) { return le16(b, at) | (le16(b, at + 2) << 16); }
uint64_t le64(const std::string& b, size_t at) {
  return le32(b, at) | (static_cast<uint64_t>(le32(b, at + 4)) << 32);
}

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                   kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;

// [at, at + n) lies within `size`, without overflow.
bool within(uint64_t at, uint64_t n, uint64_t size) { return at <= size && n <= size - at; }

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (size > 0) {
    const size_t n = std::min(size, kMaxZlibPiece);
    c = ::crc32(c, p, static_cast<uInt>(n));
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(c);
}

std::string inflate_raw(const uint8_t* data, size_t size, size_t expected_size,
                        const std::string& what) {
  std::string out;
  out.reserve(std::min<size_t>(expected_size, size_t{1} << 20));
  inflate_pieces(data, size, expected_size, what, [&](const Bytef* bytes, size_t n) {
    out.append(reinterpret_cast<const char*>(bytes), n);
  });
  return out;
}

size_t check_zip_integrity(const std::string& b, const std::string& source) {
  const uint64_t size = b.size();
  const auto bad = [&](const std::string& why) {
    TORCH_CHECK(false, "lucid::amp::load_scaler: ", source,
                " is not an intact torch::serialize archive: ", why,
                ". It is truncated or corrupt; nothing was loaded.");
  };
  // The end-of-central-directory record: the last 22 bytes plus its comment.
  if (size < 22) {
    bad("it is too short to be a zip archive (" + std::to_string(size) + " bytes)");
  }
  uint64_t end = size;  // position of the record
  for (uint64_t at = size - 22 + 1; at-- > 0 && size - at <= 22 + 0xffff;) {
    if (le32(b, at) == kEndSig && at + 22 + le16(b, at + 20) == size) {
      end = at;
      break;
    }
  }
  if (end == size) {
    bad("it has no end-of-central-directory record at its end");
  }
  // One volume, as torch::serialize writes (miniz refuses the rest after parsing it).
  // Zip64 archives may put all ones in the 16-bit fields.
  const auto one_volume16 = [](uint32_t v) { return v == 0 || v == 0xffff; };
  if (!one_volume16(le16(b, end + 4)) || !one_volume16(le16(b, end + 6)) ||
      le16(b, end + 8) != le16(b, end + 10)) {
    bad("its end record describes a multi-volume archive");
  }
  uint64_t entries = le16(b, end + 10);
  uint64_t cd_size = le32(b, end + 12);
  uint64_t cd_offset = le32(b, end + 16);
  uint64_t cd_limit = end;  // where the central directory must end
  const bool zip64_locator = end >= 20 && le32(b, end - 20) == kLocator64Sig;
  if (zip64_locator || entries == 0xffff || cd_size == 0xffffffffu || cd_offset == 0xffffffffu) {
    // Zip64 (PyTorch always writes it): a locator just before the record points at the
    // zip64 end record, which holds the directory's 64-bit count, size and offset.
    if (!zip64_locator) {
      bad("its zip64 locator is missing");
    }
    const uint64_t at = le64(b, end - 20 + 8);
    if (!within(at, 56, end - 20) || le32(b, at) != kEnd64Sig) {
      bad("its zip64 end record is missing");
    }
    if (le32(b, end - 20 + 4) != 0 || le32(b, end - 20 + 16) != 1 || le32(b, at + 16) != 0 ||
        le32(b, at + 20) != 0 || le64(b, at + 24) != le64(b, at + 32)) {
      bad("its zip64 records describe a multi-volume archive");
    }
    entries = le64(b, at + 32);
    cd_size = le64(b, at + 40);
    cd_offset = le64(b, at + 48);
    cd_limit = at;
  }
  if (!within(cd_offset, cd_size, cd_limit) || cd_offset + cd_size != cd_limit) {
    bad("its central directory lies outside the file");
  }
  if (entries == 0) {
    bad("it holds no records");
  }
  uint64_t at = cd_offset;
  for (uint64_t e = 0; e < entries; ++e) {
    if (!within(at, 46, cd_limit) || le32(b, at) != kCentralSig) {
      bad("central directory entry " + std::to_string(e) + " is damaged");
    }
    const uint32_t flags = le16(b, at + 8);
    const uint32_t method = le16(b, at + 10);
    const uint32_t crc = le32(b, at + 16);
    uint64_t csize = le32(b, at + 20);
    uint64_t usize = le32(b, at + 24);
    const uint64_t name_len = le16(b, at + 28);
    const uint64_t extra_len = le16(b, at + 30);
    const uint64_t comment_len = le16(b, at + 32);
    uint64_t local = le32(b, at + 42);
    if (!within(at + 46, name_len + extra_len + comment_len, cd_limit)) {
      bad("central directory entry " + std::to_string(e) + " runs past the directory");
    }
    const std::string name = b.substr(at + 46, name_len);
    // Zip64 sizes and offset, in this order, for the fields that are all ones.
    if (csize == 0xffffffffu || usize == 0xffffffffu || local == 0xffffffffu) {
      uint64_t x = at + 46 + name_len;
      const uint64_t x_end = x + extra_len;
      bool found = false;
      while (x + 4 <= x_end) {
        const uint32_t id = le16(b, x), len = le16(b, x + 2);
        if (x + 4 + len > x_end) {
          break;
        }
        if (id == 0x0001) {
          uint64_t f = x + 4;
          const uint64_t f_end = f + len;
          const auto next = [&](uint64_t& field) {
            if (field == 0xffffffffu) {
              if (f + 8 > f_end) {
                bad("the zip64 field of '" + name + "' is short");
              }
              field = le64(b, f);
              f += 8;
            }
          };
          next(usize);
          next(csize);
          next(local);
          found = true;
          break;
        }
        x += 4 + len;
      }
      if (!found) {
        bad("'" + name + "' lacks its zip64 sizes");
      }
    }
    if ((flags & 1u) != 0) {
      bad("'" + name + "' is encrypted");
    }
    // Only the flags torch::serialize writes: sizes in a data descriptor (bit 3) and
    // UTF-8 names (bit 11); the local header repeats them (checked below).
    if ((flags & ~0x0808u) != 0) {
      bad("'" + name + "' has zip flags torch::serialize does not write");
    }
    if (le16(b, at + 34) != 0) {
      bad("'" + name + "' starts on another volume");
    }
    // A directory entry (MS-DOS attribute bit, or a name ending in '/') holds no record.
    if ((le32(b, at + 38) & 0x10u) != 0 || (!name.empty() && name.back() == '/')) {
      bad("'" + name + "' is marked as a directory");
    }
    if (!within(local, 30, cd_offset) || le32(b, local) != kLocalSig) {
      bad("the local header of '" + name + "' is missing");
    }
    const uint64_t local_name_len = le16(b, local + 26);
    const uint64_t local_extra_len = le16(b, local + 28);
    if (local_name_len != name_len || !within(local + 30, name_len, cd_offset) ||
        b.compare(local + 30, name_len, name) != 0) {
      bad("the local header of '" + name + "' names another record");
    }
    if (le16(b, local + 8) != method || le16(b, local + 6) != flags) {
      bad("the headers of '" + name + "' disagree on its compression or flags");
    }
    const uint64_t data = local + 30 + local_name_len + local_extra_len;
    if (!within(data, csize, cd_offset)) {
      bad("the data of '" + name + "' runs past the end of the records");
    }
    const auto* p = reinterpret_cast<const uint8_t*>(b.data()) + data;
    uint32_t actual = 0;
    if (method == 0) {
      if (csize != usize) {
        bad("the stored record '" + name + "' has two different sizes");
      }
      actual = crc32(p, csize);
    } else if (method == 8) {
      // Deflate cannot expand more than 1032:1, so a larger claim is corrupt (and is
      // refused before any of the record is inflated).
      if (usize > csize * 1032 + 64) {
        bad("the deflated record '" + name + "' claims " + std::to_string(usize) +
            " bytes from " + std::to_string(csize));
      }
      inflate_pieces(p, csize, usize, "'" + name + "' in " + source,
                     [&](const Bytef* bytes, size_t n) { actual = crc32(bytes, n, actual); });
    } else {
      bad("'" + name + "' uses compression method " + std::to_string(method) +
          ", which torch::serialize does not write");
    }
    if (actual != crc) {
      bad("the data of '" + name + "' does not match its CRC-32");
    }
    at += 46 + name_len + extra_len + comment_len;
  }
  if (at != cd_offset + cd_size) {
    bad("its central directory has bytes beyond its entries");
  }
  return static_cast<size_t>(entries);
}

}  // namespace detail
}  // namespace amp
}  // namespace lucid
