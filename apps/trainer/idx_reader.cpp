// SPDX-License-Identifier: BSD-3-Clause
#include "idx_reader.h"

#include <c10/util/Exception.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace lucid {
namespace trainer {
namespace {

// Larger than any real IDX file of bytes; guards the allocation against a header that is
// garbage but happens to start with the right magic.
constexpr int64_t kMaxElements = int64_t{1} << 32;

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads up to `n` bytes; returns how many were read. zlib reads plain files as they are,
// so this serves uncompressed IDX files too.
size_t read_some(gzFile f, uint8_t* out, size_t n, const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(f, out + done, chunk);
    if (got < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      TORCH_CHECK(false, "corrupt IDX file ", path, ": the gzip stream is damaged (zlib: ",
                  errnum == Z_ERRNO ? std::strerror(errno) : msg, ").");
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  errno = 0;
  GzFile f(gzopen(path.c_str(), "rb"));
  TORCH_CHECK(f != nullptr, "cannot open IDX file ", path, ": ",
              errno ? std::strerror(errno) : "out of memory", ".");

  uint8_t magic[4];
  const size_t got_magic = read_some(f.get(), magic, 4, path);
  TORCH_CHECK(got_magic == 4, "truncated IDX file ", path, ": ", got_magic,
              " bytes, too short for the 4-byte magic number.");
  TORCH_CHECK(magic[0] == 0 && magic[1] == 0 && magic[2] == 0x08 && magic[3] >= 1 &&
                  magic[3] <= 4,
              "not an IDX file of bytes: ", path, " starts with 0x", std::hex,
              (unsigned(magic[0]) << 24 | unsigned(magic[1]) << 16 | unsigned(magic[2]) << 8 |
               unsigned(magic[3])),
              std::dec, "; expected 0x0000080N (unsigned bytes, N = 1..4 dimensions).");

  IdxArray out;
  const int ndims = magic[3];
  int64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    uint8_t b[4];
    TORCH_CHECK(read_some(f.get(), b, 4, path) == 4, "truncated IDX file ", path,
                ": the header ends inside the size of dimension ", d, " of ", ndims, ".");
    const int64_t size = int64_t{b[0]} << 24 | int64_t{b[1]} << 16 | int64_t{b[2]} << 8 | b[3];
    out.dims.push_back(size);
    count *= size;
    TORCH_CHECK(count <= kMaxElements, "corrupt IDX file ", path,
                ": the header's dimensions describe more than 2^32 elements.");
  }

  out.data.resize(static_cast<size_t>(count));
  const size_t got = read_some(f.get(), out.data.data(), out.data.size(), path);
  TORCH_CHECK(got == out.data.size(), "truncated IDX file ", path, ": the header announces ",
              count, " bytes of data, the file holds ", got, ".");
  uint8_t extra;
  TORCH_CHECK(read_some(f.get(), &extra, 1, path) == 0, "corrupt IDX file ", path,
              ": data continues past the ", count, " bytes the header announces.");
  // A gzip stream cut short can still deliver every byte asked for; zlib reports it only
  // at the end.
  int errnum = Z_OK;
  const char* msg = gzerror(f.get(), &errnum);
  TORCH_CHECK(errnum == Z_OK || errnum == Z_STREAM_END, "corrupt IDX file ", path,
              ": the gzip stream is damaged (zlib: ", msg, ").");
  return out;
}

Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      int64_t limit) {
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  TORCH_CHECK(images.dims.size() == 3 && images.dims[1] == 28 && images.dims[2] == 28,
              "unexpected IDX images file ", images_path, ": expected [N, 28, 28], got ",
              c10::IntArrayRef(images.dims), ".");
  TORCH_CHECK(labels.dims.size() == 1, "unexpected IDX labels file ", labels_path,
              ": expected one dimension, got ", c10::IntArrayRef(labels.dims), ".");
  TORCH_CHECK(images.dims[0] == labels.dims[0], "IDX files do not match: ", images_path,
              " holds ", images.dims[0], " images, ", labels_path, " ", labels.dims[0],
              " labels.");
  for (size_t i = 0; i < labels.data.size(); ++i) {
    TORCH_CHECK(labels.data[i] < 10, "corrupt IDX labels file ", labels_path, ": label ",
                int(labels.data[i]), " at index ", i, " (Fashion-MNIST has classes 0..9).");
  }
  int64_t n = images.dims[0];
  if (limit > 0 && limit < n) n = limit;

  Dataset out;
  auto bytes = at::from_blob(images.data.data(), {n, 1, 28, 28}, at::kByte);
  // Fashion-MNIST's training-set mean and standard deviation of pixel/255.
  out.images = bytes.to(at::kFloat).div_(255.0).sub_(0.2860).div_(0.3530);
  out.labels = at::from_blob(labels.data.data(), {n}, at::kByte).to(at::kLong);
  return out;
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv(kFashionMnistDirEnv);
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kFashionMnistDir);
}

FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit,
                                int64_t test_limit) {
  namespace fs = std::filesystem;
  const char* names[] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                         "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
  for (const char* name : names) {
    const fs::path p = fs::path(dir) / name;
    std::error_code ec;
    TORCH_CHECK(fs::is_regular_file(p, ec), "Fashion-MNIST not found: ", p.string(),
                " does not exist. Install Debian's package with "
                "`apt-get install dataset-fashion-mnist` (it puts the files in ",
                kFashionMnistDir, "), or pass --data DIR with the four IDX .gz files.");
  }
  const fs::path d(dir);
  FashionMnist out;
  out.train = load_idx_pair((d / names[0]).string(), (d / names[1]).string(), train_limit);
  out.test = load_idx_pair((d / names[2]).string(), (d / names[3]).string(), test_limit);
  return out;
}

}  // namespace trainer
}  // namespace lucid
