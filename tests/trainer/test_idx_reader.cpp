// SPDX-License-Identifier: BSD-3-Clause
// IDX parsing: good files (gzip and plain), truncated ones, a wrong magic number, and the
// data-set-level checks. The files are written here; the real data set is not needed.

#include <gtest/gtest.h>
#include <zlib.h>

#include <c10/util/Exception.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../support/expect_throws.h"
#include "../support/scratch_dir.h"
#include "idx_reader.h"

using lucid::trainer::load_fashion_mnist;
using lucid::trainer::load_idx_pair;
using lucid::trainer::read_idx;
using lucid_test::message_of;

namespace {

std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                               uint8_t type = 0x08) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

class IdxFiles : public ::testing::Test {
 protected:
  std::string write_plain(const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto p = dir_.file(name);
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                             static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto p = dir_.file(name);
    gzFile f = gzopen(p.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
    return p;
  }
  lucid_test::ScratchDir dir_{"lucid_idx"};
};

std::vector<uint8_t> pixels(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

}  // namespace

TEST_F(IdxFiles, ReadsAGzippedImagesFile) {
  const auto data = pixels(3 * 28 * 28);
  const auto arr = read_idx(write_gz("img.gz", idx_bytes({3, 28, 28}, data)));
  EXPECT_EQ(arr.dims, (std::vector<int64_t>{3, 28, 28}));
  EXPECT_EQ(arr.data, data);
}

TEST_F(IdxFiles, ReadsAPlainLabelsFile) {
  const auto arr = read_idx(write_plain("lab", idx_bytes({4}, {1, 2, 3, 9})));
  EXPECT_EQ(arr.dims, (std::vector<int64_t>{4}));
  EXPECT_EQ(arr.data, (std::vector<uint8_t>{1, 2, 3, 9}));
}

TEST_F(IdxFiles, TruncatedDataIsRefusedWithBothCounts) {
  auto bytes = idx_bytes({2, 28, 28}, pixels(2 * 28 * 28));
  bytes.resize(bytes.size() - 100);
  const auto msg = message_of([&] { read_idx(write_gz("t.gz", bytes)); });
  EXPECT_NE(msg.find("truncated IDX file"), std::string::npos) << msg;
  EXPECT_NE(msg.find("announces 1568 bytes of data, the file holds 1468"), std::string::npos) << msg;
}

TEST_F(IdxFiles, TruncatedHeaderIsRefused) {
  auto bytes = idx_bytes({2, 28, 28}, {});
  bytes.resize(9);  // magic, first size, one byte of the second
  const auto msg = message_of([&] { read_idx(write_plain("h", bytes)); });
  EXPECT_NE(msg.find("header ends inside the size of dimension 1"), std::string::npos) << msg;
}

TEST_F(IdxFiles, CutGzipStreamIsRefused) {
  // Compress a valid file, then cut the compressed bytes: zlib must notice.
  const auto p = write_gz("full.gz", idx_bytes({20, 28, 28}, pixels(20 * 28 * 28)));
  std::ifstream in(p, std::ios::binary);
  std::vector<char> gz((std::istreambuf_iterator<char>(in)), {});
  gz.resize(gz.size() / 2);
  const auto cut = write_plain("cut.gz", std::vector<uint8_t>(gz.begin(), gz.end()));
  const auto msg = message_of([&] { read_idx(cut); });
  EXPECT_TRUE(msg.find("truncated IDX file") != std::string::npos ||
              msg.find("gzip stream is damaged") != std::string::npos)
      << msg;
}

TEST_F(IdxFiles, WrongMagicIsRefused) {
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', 0, 0, 0, 0};
  auto msg = message_of([&] { read_idx(write_plain("x.png", png)); });
  EXPECT_NE(msg.find("not an IDX file of bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0x89504e47"), std::string::npos) << msg;
  // Right layout, wrong element type (0x0D: float32).
  msg = message_of([&] { read_idx(write_gz("f.gz", idx_bytes({1}, {0, 0, 0, 0}, 0x0D))); });
  EXPECT_NE(msg.find("not an IDX file of bytes"), std::string::npos) << msg;
}

TEST_F(IdxFiles, TrailingBytesAreRefused) {
  auto bytes = idx_bytes({2}, {1, 2});
  bytes.push_back(3);
  const auto msg = message_of([&] { read_idx(write_plain("long", bytes)); });
  EXPECT_NE(msg.find("data continues past the 2 bytes"), std::string::npos) << msg;
}

TEST_F(IdxFiles, MissingFileIsRefused) {
  const auto msg = message_of([&] { read_idx(dir_.file("nothing.gz")); });
  EXPECT_NE(msg.find("cannot open IDX file"), std::string::npos) << msg;
}

TEST_F(IdxFiles, PairBecomesNormalisedTensors) {
  const auto img = write_gz("i.gz", idx_bytes({3, 28, 28}, std::vector<uint8_t>(3 * 784, 255)));
  const auto lab = write_gz("l.gz", idx_bytes({3}, {0, 5, 9}));
  const auto ds = load_idx_pair(img, lab, /*limit=*/2);
  ASSERT_EQ(ds.size(), 2);
  EXPECT_EQ(ds.images.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(ds.images.scalar_type(), at::kFloat);
  EXPECT_NEAR(ds.images[1][0][5][5].item<float>(), (1.0 - 0.2860) / 0.3530, 1e-5);
  EXPECT_EQ(ds.labels[1].item<int64_t>(), 5);
}

TEST_F(IdxFiles, PairChecksShapesCountsAndLabels) {
  const auto img = write_gz("i.gz", idx_bytes({2, 28, 28}, pixels(2 * 784)));
  const auto lab3 = write_gz("l3.gz", idx_bytes({3}, {0, 1, 2}));
  EXPECT_NE(message_of([&] { load_idx_pair(img, lab3); }).find("holds 2 images"),
            std::string::npos);
  const auto bad = write_gz("lb.gz", idx_bytes({2}, {0, 10}));
  EXPECT_NE(message_of([&] { load_idx_pair(img, bad); }).find("label 10 at index 1"),
            std::string::npos);
  const auto small = write_gz("s.gz", idx_bytes({2, 14, 14}, pixels(2 * 196)));
  EXPECT_NE(message_of([&] { load_idx_pair(small, lab3); }).find("expected [N, 28, 28]"),
            std::string::npos);
}

TEST_F(IdxFiles, MissingDataSetNamesThePackage) {
  const auto msg = message_of([&] { load_fashion_mnist(dir_.path().string()); });
  EXPECT_NE(msg.find("Fashion-MNIST not found"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
}
