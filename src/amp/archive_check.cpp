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
// flags or directory entries that torch::serialize does not write (byte flips there got
// past the first version of this check and reached LibTorch's reader, which refused
// them after reading uninitialised memory under valgrind), data inside the file, and
// the data's CRC-32 equal to the recorded one (deflated records are inflated
// here for that, with the small bounds-checked inflater below). Accidental corruption
// (bit rot, a torn write, truncation) is then refused with a clear error before LibTorch
// sees it. An archive crafted to keep its CRCs right can still reach LibTorch's parsers:
// like torch.load, do not load checkpoints from untrusted sources.

#include "amp/archive_check.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <vector>

namespace lucid {
namespace amp {
namespace detail {
namespace {

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) {
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      }
      t[n] = c;
    }
    return t;
  }();
  return table;
}

// ---------------------------------------------------------------------------------------
// Inflate (RFC 1951), after Mark Adler's puff: canonical Huffman codes decoded bit by bit.
// Every read is bounds-checked; every failure throws.

constexpr int kMaxBits = 15;

struct Huffman {
  std::array<int16_t, kMaxBits + 1> count{};
  std::vector<int16_t> symbol;
};

class Inflater {
 public:
  Inflater(const uint8_t* data, size_t size, size_t limit, const std::string& what)
      : in_(data), size_(size), limit_(limit), what_(what) {
    // Deflate expands at most ~1032:1; a header claiming more is refused before this.
    out_.reserve(std::min<size_t>(limit, size_t{1} << 20));
  }

  std::string run() {
    bool last = false;
    do {
      last = bits(1) == 1;
      switch (bits(2)) {
        case 0:
          stored();
          break;
        case 1:
          fixed();
          break;
        case 2:
          dynamic();
          break;
        default:
          fail("a block of the reserved type 3");
      }
    } while (!last);
    TORCH_CHECK(out_.size() == limit_, what_, " inflates to ", out_.size(),
                " bytes, but its header says ", limit_, "; the archive is corrupt.");
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(const char* why) {
    TORCH_CHECK(false, what_, " is not a valid deflate stream (", why,
                "); the archive is corrupt.");
  }

  int bits(int need) {
    uint32_t val = bitbuf_;
    while (bitcnt_ < need) {
      if (pos_ == size_) {
        fail("it ends early");
      }
      val |= static_cast<uint32_t>(in_[pos_++]) << bitcnt_;
      bitcnt_ += 8;
    }
    bitbuf_ = val >> need;
    bitcnt_ -= need;
    return static_cast<int>(val & ((1u << need) - 1));
  }

  void put(uint8_t byte) {
    if (out_.size() == limit_) {
      fail("it inflates past its declared size");
    }
    out_.push_back(static_cast<char>(byte));
  }

  void stored() {
    bitbuf_ = 0;
    bitcnt_ = 0;  // to a byte boundary
    if (size_ - pos_ < 4) {
      fail("a stored block's length is cut off");
    }
    const unsigned len = in_[pos_] | (in_[pos_ + 1] << 8);
    const unsigned nlen = in_[pos_ + 2] | (in_[pos_ + 3] << 8);
    pos_ += 4;
    if (len != (~nlen & 0xffffu)) {
      fail("a stored block's length check fails");
    }
    if (size_ - pos_ < len) {
      fail("a stored block is cut off");
    }
    for (unsigned i = 0; i < len; ++i) {
      put(in_[pos_++]);
    }
  }

  int decode(const Huffman& h) {
    int code = 0, first = 0, index = 0;
    for (int len = 1; len <= kMaxBits; ++len) {
      code |= bits(1);
      const int count = h.count[len];
      if (code - count < first) {
        return h.symbol[index + (code - first)];
      }
      index += count;
      first += count;
      first <<= 1;
      code <<= 1;
    }
    fail("a code that is not in its Huffman table");
  }

  // Builds a canonical code from code lengths; refuses over-subscribed sets.
  void construct(Huffman& h, const int16_t* length, int n) {
    h.count.fill(0);
    for (int s = 0; s < n; ++s) {
      ++h.count[length[s]];
    }
    if (h.count[0] == n) {
      h.symbol.assign(n, 0);
      return;  // no codes: decoding one fails
    }
    int left = 1;
    for (int len = 1; len <= kMaxBits; ++len) {
      left <<= 1;
      left -= h.count[len];
      if (left < 0) {
        fail("an over-subscribed Huffman code");
      }
    }
    std::array<int16_t, kMaxBits + 1> offs{};
    for (int len = 1; len < kMaxBits; ++len) {
      offs[len + 1] = static_cast<int16_t>(offs[len] + h.count[len]);
    }
    h.symbol.assign(n, 0);
    for (int s = 0; s < n; ++s) {
      if (length[s] != 0) {
        h.symbol[offs[length[s]]++] = static_cast<int16_t>(s);
      }
    }
  }

  void codes(const Huffman& lencode, const Huffman& distcode) {
    static const int16_t lbase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                      31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
    static const int16_t lext[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                     2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
    static const int16_t dbase[30] = {1,    2,    3,    4,    5,    7,     9,     13,    17,  25,
                                      33,   49,   65,   97,   129,  193,   257,   385,   513, 769,
                                      1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
    static const int16_t dext[30] = {0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                     6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
    for (;;) {
      int symbol = decode(lencode);
      if (symbol < 256) {
        put(static_cast<uint8_t>(symbol));
      } else if (symbol == 256) {
        return;
      } else {
        symbol -= 257;
        if (symbol >= 29) {
          fail("an invalid length symbol");
        }
        const int len = lbase[symbol] + bits(lext[symbol]);
        const int dsym = decode(distcode);
        if (dsym >= 30) {
          fail("an invalid distance symbol");
        }
        const size_t dist = static_cast<size_t>(dbase[dsym] + bits(dext[dsym]));
        if (dist > out_.size()) {
          fail("a distance back past the start of the output");
        }
        for (int i = 0; i < len; ++i) {
          put(static_cast<uint8_t>(out_[out_.size() - dist]));
        }
      }
    }
  }

  void fixed() {
    int16_t lengths[288 + 30];
    int s = 0;
    for (; s < 144; ++s) lengths[s] = 8;
    for (; s < 256; ++s) lengths[s] = 9;
    for (; s < 280; ++s) lengths[s] = 7;
    for (; s < 288; ++s) lengths[s] = 8;
    for (int d = 0; d < 30; ++d) lengths[288 + d] = 5;
    Huffman lencode, distcode;
    construct(lencode, lengths, 288);
    construct(distcode, lengths + 288, 30);
    codes(lencode, distcode);
  }

  void dynamic() {
    static const int16_t order[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};
    const int nlen = bits(5) + 257;
    const int ndist = bits(5) + 1;
    const int ncode = bits(4) + 4;
    if (nlen > 286 || ndist > 30) {
      fail("too many length or distance codes");
    }
    int16_t lengths[286 + 30] = {};
    for (int i = 0; i < ncode; ++i) {
      lengths[order[i]] = static_cast<int16_t>(bits(3));
    }
    Huffman lencode, distcode;
    construct(lencode, lengths, 19);
    int index = 0;
    while (index < nlen + ndist) {
      int symbol = decode(lencode);
      if (symbol < 16) {
        lengths[index++] = static_cast<int16_t>(symbol);
        continue;
      }
      int16_t len = 0;
      if (symbol == 16) {
        if (index == 0) {
          fail("a repeat with no previous length");
        }
        len = lengths[index - 1];
        symbol = 3 + bits(2);
      } else if (symbol == 17) {
        symbol = 3 + bits(3);
      } else {
        symbol = 11 + bits(7);
      }
      if (index + symbol > nlen + ndist) {
        fail("code lengths that run past their count");
      }
      while (symbol--) {
        lengths[index++] = len;
      }
    }
    if (lengths[256] == 0) {
      fail("no end-of-block code");
    }
    construct(lencode, lengths, nlen);
    construct(distcode, lengths + nlen, ndist);
    codes(lencode, distcode);
  }

  const uint8_t* in_;
  size_t size_;
  size_t pos_ = 0;
  uint32_t bitbuf_ = 0;
  int bitcnt_ = 0;
  size_t limit_;
  std::string out_;
  const std::string& what_;
};

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
  const auto& table = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) {
    crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  }
  return ~crc;
}

std::string inflate_raw(const uint8_t* data, size_t size, size_t expected_size,
                        const std::string& what) {
  return Inflater(data, size, expected_size, what).run();
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
      // refused before anything is allocated for it).
      if (usize > csize * 1032 + 64) {
        bad("the deflated record '" + name + "' claims " + std::to_string(usize) +
            " bytes from " + std::to_string(csize));
      }
      const std::string out = inflate_raw(p, csize, usize, "'" + name + "' in " + source);
      actual = crc32(out.data(), out.size());
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
