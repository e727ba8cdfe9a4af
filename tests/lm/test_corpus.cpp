// SPDX-License-Identifier: BSD-3-Clause
// The fortunes reader on fortune files made here: quotations split at "%" lines, only
// files with a strfile index read, in name order; a missing corpus names the package.

#include <gtest/gtest.h>

#include <c10/util/Exception.h>

#include <fstream>
#include <string>

#include "../support/scratch_dir.h"
#include "corpus.h"

using namespace lucid::lm;
namespace fs = std::filesystem;

namespace {
void write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}
std::string text_of(const ByteCorpus& c) {
  std::string s;
  for (const auto& t : {c.train, c.val}) {
    for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<char>(t[i].item<int64_t>());
  }
  return s;
}
}  // namespace

TEST(CorpusFiles, QuotationsAreSplitAtPercentLinesAndJoined) {
  const lucid_test::ScratchDir dir("lucid_lm_corpus");
  write(dir.path() / "b", "second file\n%\n");
  write(dir.path() / "b.dat", "index");
  write(dir.path() / "a", "one\n%\ntwo\nlines\n%\nthree\n");
  write(dir.path() / "a.dat", "index");
  write(dir.path() / "notes", "not indexed: never read\n");
  const ByteCorpus c = load_fortunes(dir.path().string(), 0.25);
  EXPECT_EQ(c.files, 2);
  EXPECT_EQ(c.quotations, 4);
  EXPECT_EQ(text_of(c), "one\n\ntwo\nlines\n\nthree\n\nsecond file\n\n");
  EXPECT_EQ(c.val.numel(), static_cast<int64_t>(text_of(c).size() / 4));
  EXPECT_EQ(c.train.scalar_type(), at::kLong);
}

TEST(CorpusFiles, MissingCorpusNamesThePackage) {
  const lucid_test::ScratchDir dir("lucid_lm_corpus");
  for (const std::string path : {(dir.path() / "absent").string(), dir.path().string()}) {
    try {
      load_fortunes(path);
      FAIL() << "no error for " << path;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("apt-get install fortunes"), std::string::npos)
          << e.what();
    }
  }
}
