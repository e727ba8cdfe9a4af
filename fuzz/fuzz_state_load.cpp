// SPDX-License-Identifier: BSD-3-Clause
// libFuzzer target: everything that reads a GradScaler's state from outside.
//
// The first input byte picks the mode; the rest is its input:
//   0  raw bytes -> lucid::amp::load_scaler (zip + CRC-32 check, LibTorch's reader,
//      GradScaler::load)
//   1  structured archive: 10-byte records that set, retype or drop entries of a valid
//      GradScaler archive (and a last byte that says whether the checksum is recomputed),
//      written with torch::serialize and loaded -> exercises every validation behind the
//      checksum, which random bytes almost never get past
//   2  state map: 9-byte records (key selector, double bits) -> load_state_dict
//   3  raw deflate -> detail::inflate_raw (zlib behind the archive check's piecewise
//      loop and size and error checks), checked against zlib's inflate called directly
// Properties (a violation aborts, which libFuzzer reports as a crash):
//   - only c10::Error escapes a load (c10::ValueError from load_state_dict);
//   - a refused load leaves every observable of the scaler as it was;
//   - an accepted load leaves a valid scaler: its state_dict loads into a fresh scaler
//     and reads back the same;
//   - inflate_raw accepts every stream that zlib, called directly, inflates, with the
//     same bytes.
//
// Build and run: scripts/fuzz.sh (clang++ -fsanitize=fuzzer,address,undefined).
// LUCID_FUZZ_WRITE_CORPUS=dir writes the starting corpus (one valid input of each kind)
// into dir and exits.

#include <lucid/amp.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include "amp/archive_check.h"
#include "amp/archive_format.h"

#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using lucid::amp::GradScaler;
using lucid::amp::GradScalerOptions;

[[noreturn]] void violated(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "PROPERTY VIOLATED: %s %s\n", what, detail.c_str());
  std::abort();
}

struct Observed {
  std::map<std::string, double> state;
  lucid::amp::ScalerCounters c;
  double min_scale, max_scale;
  int64_t hysteresis;
  bool operator==(const Observed& o) const {
    return state == o.state && c.steps_taken == o.c.steps_taken &&
           c.steps_skipped == o.c.steps_skipped && c.updates == o.c.updates &&
           c.overflow_updates == o.c.overflow_updates && c.backoffs == o.c.backoffs &&
           c.growths == o.c.growths && c.overflow_streak == o.c.overflow_streak &&
           min_scale == o.min_scale && max_scale == o.max_scale && hysteresis == o.hysteresis;
  }
};

Observed observe(const GradScaler& s) {
  return {s.state_dict(), s.counters(), s.options().min_scale(), s.options().max_scale(),
          s.options().hysteresis()};
}

// The scaler every input is loaded into: guards on, some history, tensors made.
GradScaler target_scaler() {
  GradScaler s(GradScalerOptions().init_scale(1024).growth_interval(3).hysteresis(2).max_scale(1 << 20));
  s.scale(torch::ones({}));
  auto p = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD opt(std::vector<torch::Tensor>{p}, torch::optim::SGDOptions(0.1));
  for (int i = 0; i < 3; ++i) {
    p.mutable_grad() = torch::tensor({1.0f, i == 1 ? INFINITY : 2.0f});
    s.step(opt);
    s.update();
  }
  return s;
}

// An accepted load must leave a valid scaler.
void check_valid(const GradScaler& s) {
  GradScaler fresh;
  try {
    fresh.load_state_dict(s.state_dict());
  } catch (const c10::Error& e) {
    violated("an accepted load left a state its own load_state_dict refuses:",
             e.what_without_backtrace());
  }
  if (fresh.state_dict() != s.state_dict()) {
    violated("state_dict does not round-trip after an accepted load");
  }
}

void load_and_check(const std::string& bytes) {
  GradScaler s = target_scaler();
  const Observed before = observe(s);
  std::istringstream in(bytes);
  try {
    lucid::amp::load_scaler(s, in);
  } catch (const c10::Error&) {
    if (!(observe(s) == before)) {
      violated("a refused archive changed the scaler");
    }
    return;
  } catch (const std::exception& e) {
    violated("load_scaler let a non-c10 exception escape:", e.what());
  }
  check_valid(s);
}

// Mode 1: the entries of a valid archive, mutated.
struct Entries {
  std::vector<std::string> keys;  // format_version, the fields, checksum
  std::vector<c10::IValue> values;
  std::vector<bool> present;
};

Entries valid_entries() {
  std::ostringstream out;
  lucid::amp::save_scaler(target_scaler(), out);
  std::istringstream in(out.str());
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  torch::serialize::InputArchive child;
  archive.read(lucid::amp::kGradScalerArchiveKey, child);
  Entries e;
  e.keys.push_back("format_version");
  for (const auto& f : lucid::amp::detail::archive_fields()) {
    e.keys.push_back(f.key);
  }
  e.keys.push_back("checksum");
  for (const auto& k : e.keys) {
    c10::IValue v;
    child.read(k, v);
    e.values.push_back(v);
    e.present.push_back(true);
  }
  return e;
}

std::string structured(const uint8_t* data, size_t size) {
  static const Entries base = valid_entries();
  Entries e = base;
  const size_t n = e.keys.size();
  size_t i = 0;
  for (; i + 10 <= size; i += 10) {
    const size_t k = data[i] % n;
    int64_t bits;
    std::memcpy(&bits, data + i + 2, 8);
    double d;
    std::memcpy(&d, data + i + 2, 8);
    switch (data[i + 1] % 8) {
      case 0:
        e.values[k] = c10::IValue(bits);
        break;
      case 1:
        e.values[k] = c10::IValue(d);
        break;
      case 2:
        e.values[k] = c10::IValue(static_cast<bool>(bits & 1));
        break;
      case 3:
        e.present[k] = false;
        break;
      case 4:
        e.values[k] = c10::IValue(std::string(reinterpret_cast<const char*>(data + i + 2), 8));
        break;
      case 5:
        e.values[k] = c10::IValue(torch::full({}, d, torch::kDouble));
        break;
      case 6:  // small integers: the ranges that matter (trackers, intervals, counters)
        e.values[k] = c10::IValue(static_cast<int64_t>(static_cast<int8_t>(data[i + 2])));
        break;
      default:  // doubles near the interesting ones
        e.values[k] = c10::IValue(std::ldexp(1.0, static_cast<int8_t>(data[i + 2])));
        break;
    }
  }
  const bool fix_checksum = i >= size || (data[i] & 1) == 0;
  if (fix_checksum) {
    std::vector<c10::IValue> fields(e.values.begin() + 1, e.values.end() - 1);
    const int64_t version = e.values[0].isInt() ? e.values[0].toInt() : 1;
    e.values[n - 1] =
        c10::IValue(static_cast<int64_t>(lucid::amp::detail::archive_checksum(version, fields)));
  }
  torch::serialize::OutputArchive archive;
  torch::serialize::OutputArchive child(archive.compilation_unit());
  for (size_t k = 0; k < n; ++k) {
    if (e.present[k]) {
      child.write(e.keys[k], e.values[k]);
    }
  }
  archive.write(lucid::amp::kGradScalerArchiveKey, child);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void state_map(const uint8_t* data, size_t size) {
  static const char* keys[] = {"scale",          "growth_factor",  "backoff_factor",
                               "growth_interval", "growth_tracker", "_growth_tracker",
                               "min_scale",      "max_scale",      "hysteresis",
                               "overflow_tracker", "unknown"};
  GradScaler s = target_scaler();
  std::map<std::string, double> m = s.state_dict();  // start valid, then mutate
  for (size_t i = 0; i + 9 <= size; i += 9) {
    const char* key = keys[data[i] % 11];
    double d;
    std::memcpy(&d, data + i + 1, 8);
    if (data[i] >= 0xf0) {
      m.erase(key);
    } else if (data[i] >= 0xc0) {
      m[key] = static_cast<double>(static_cast<int8_t>(data[i + 1]));  // small integers
    } else {
      m[key] = d;
    }
  }
  const Observed before = observe(s);
  try {
    s.load_state_dict(m);
  } catch (const c10::ValueError&) {
    if (!(observe(s) == before)) {
      violated("a refused state_dict changed the scaler");
    }
    return;
  } catch (const c10::Error& e) {
    violated("load_state_dict threw c10::Error, not c10::ValueError:", e.what_without_backtrace());
  } catch (const std::exception& e) {
    violated("load_state_dict let a non-c10 exception escape:", e.what());
  }
  check_valid(s);
  const auto got = s.state_dict();
  for (const char* k : {"growth_factor", "backoff_factor", "growth_interval"}) {
    if (got.at(k) != m.at(k)) {
      violated("an accepted state_dict did not load", k);
    }
  }
}

void inflate_against_zlib(const uint8_t* data, size_t size) {
  // zlib first: what does it make of the stream?
  std::string ref;
  bool zlib_ok = false;
  {
    z_stream z{};
    if (inflateInit2(&z, -15) != Z_OK) {
      return;
    }
    z.next_in = const_cast<Bytef*>(data);
    z.avail_in = static_cast<uInt>(size);
    char buf[4096];
    int rc = Z_OK;
    while (rc == Z_OK && ref.size() < (1u << 20)) {
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof(buf);
      rc = inflate(&z, Z_NO_FLUSH);
      ref.append(buf, sizeof(buf) - z.avail_out);
      if (rc == Z_BUF_ERROR && z.avail_in == 0) {
        break;  // ran out of input
      }
    }
    zlib_ok = rc == Z_STREAM_END;
    inflateEnd(&z);
  }
  std::string mine;
  bool mine_ok = false;
  try {
    mine = lucid::amp::detail::inflate_raw(data, size, zlib_ok ? ref.size() : size * 4 + 8, "fuzz");
    mine_ok = true;
  } catch (const c10::Error&) {
  }
  if (zlib_ok && (!mine_ok || mine != ref)) {
    violated("inflate_raw disagrees with zlib on a stream zlib accepts");
  }
}

void write_corpus(const char* dir) {
  const auto put = [&](const std::string& name, uint8_t mode, const std::string& body) {
    std::ofstream f(std::string(dir) + "/" + name, std::ios::binary);
    f.put(static_cast<char>(mode));
    f << body;
  };
  std::ostringstream archive;
  lucid::amp::save_scaler(target_scaler(), archive);
  put("raw_valid_archive", 0, archive.str());
  std::ostringstream plain;
  lucid::amp::save_scaler(GradScaler(), plain);
  put("raw_default_archive", 0, plain.str());
  put("structured_valid", 1, "");
  put("structured_scale_nan", 1, std::string("\x02\x01\x00\x00\x00\x00\x00\x00\xf8\x7f", 10));
  put("structured_drop_checksum", 1, std::string("\x12\x03\x00\x00\x00\x00\x00\x00\x00\x00", 10));
  std::string map;
  for (int k = 0; k < 5; ++k) {
    const double v = k == 0 ? 512.0 : k == 1 ? 2.0 : k == 2 ? 0.5 : k == 3 ? 4.0 : 1.0;
    map.push_back(static_cast<char>(k));
    map.append(reinterpret_cast<const char*>(&v), 8);
  }
  put("map_valid", 2, map);
  put("inflate_fixed", 3, std::string("\xcb\x48\xcd\xc9\xc9\x07\x00", 7));
  put("inflate_stored", 3, std::string("\x01\x07\x00\xf8\xff\x73\x74\x6f\x72\x65\x64\x21", 12));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("LUCID_FUZZ_WRITE_CORPUS")) {
    write_corpus(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  switch (data[0] % 4) {
    case 0:
      load_and_check(std::string(reinterpret_cast<const char*>(body), n));
      break;
    case 1:
      if (n <= 400) {  // a few dozen records is plenty; keeps each run short
        load_and_check(structured(body, n));
      }
      break;
    case 2:
      state_map(body, n);
      break;
    default:
      inflate_against_zlib(body, n);
      break;
  }
  return 0;
}
