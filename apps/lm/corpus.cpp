// SPDX-License-Identifier: BSD-3-Clause
#include "corpus.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace lucid {
namespace lm {
namespace fs = std::filesystem;

std::string fortunes_dir() {
  const char* env = std::getenv(kFortunesDirEnv);
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kFortunesDir);
}

namespace {

// A quotation file is one that strfile indexed: `<name>.dat` lies beside it. That leaves
// out the indexes themselves, the `.u8` links (the same text again) and anything else.
std::vector<fs::path> quotation_files(const std::string& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& p = entry.path();
    if (p.extension() == ".dat" || p.extension() == ".u8") continue;
    if (!fs::is_regular_file(p, ec)) continue;
    if (fs::exists(fs::path(p.string() + ".dat"), ec)) files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

ByteCorpus load_fortunes(const std::string& dir, double val_fraction, int64_t limit_bytes) {
  TORCH_CHECK_VALUE(val_fraction > 0 && val_fraction < 1,
                    "the validation share must lie in (0, 1), got ", val_fraction, ".");
  std::error_code ec;
  const std::string missing_hint =
      " Install Debian's package with `apt-get install fortunes` (it puts the quotations "
      "in " + std::string(kFortunesDir) + "), or pass --corpus DIR.";
  TORCH_CHECK(fs::is_directory(dir, ec), "fortunes corpus not found: ", dir,
              " is not a folder.", missing_hint);
  const auto files = quotation_files(dir);
  TORCH_CHECK(!files.empty(), "fortunes corpus not found: ", dir,
              " holds no quotation file (a file with a strfile index <name>.dat beside it).",
              missing_hint);

  ByteCorpus out;
  std::string text;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    TORCH_CHECK(in.good(), "cannot read ", path.string(), ".");
    std::string line, quotation;
    auto flush = [&] {
      if (quotation.empty()) return;
      text += quotation;
      text += '\n';  // with the quotation's own last newline: a blank line between two
      quotation.clear();
      ++out.quotations;
    };
    while (std::getline(in, line)) {
      if (line == "%") {
        flush();
      } else {
        quotation += line;
        quotation += '\n';
      }
    }
    flush();
    ++out.files;
  }
  if (limit_bytes > 0 && limit_bytes < static_cast<int64_t>(text.size())) {
    text.resize(static_cast<size_t>(limit_bytes));
  }
  const auto n = static_cast<int64_t>(text.size());
  const auto n_val = static_cast<int64_t>(static_cast<double>(n) * val_fraction);
  TORCH_CHECK(n_val >= 2 && n - n_val >= 2, "the fortunes corpus in ", dir, " is too short (",
              n, " bytes) to split.");
  auto bytes = at::from_blob(text.data(), {n}, at::kByte).to(at::kLong);
  out.train = bytes.narrow(0, 0, n - n_val).clone();
  out.val = bytes.narrow(0, n - n_val, n_val).clone();
  return out;
}

}  // namespace lm
}  // namespace lucid
