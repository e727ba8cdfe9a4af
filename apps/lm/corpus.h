// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The language model's text: the quotations of Debian's `fortunes` package (files under
// /usr/share/games/fortunes), as bytes.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace lucid {
namespace lm {

/// Where the fortunes package puts its quotation files.
inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";
/// The environment variable that overrides kFortunesDir (the GPU machine's carried copy).
inline constexpr const char* kFortunesDirEnv = "LUCID_AMP_FORTUNES_DIR";

/// $LUCID_AMP_FORTUNES_DIR where it is set and not empty, else kFortunesDir.
std::string fortunes_dir();

/// A byte-level corpus split in two: the first bytes train, the last ones validate.
struct ByteCorpus {
  at::Tensor train;         ///< int64 [N_train], values 0..255
  at::Tensor val;           ///< int64 [N_val]
  int64_t quotations = 0;   ///< quotations read
  int64_t files = 0;        ///< quotation files read
};

/// Reads every quotation file of `dir` (a file with a strfile index `<name>.dat` beside
/// it; the indexes and the `.u8` links are skipped), in name order, splits each at its
/// lines holding only "%", and joins the quotations with a blank line. The last
/// `val_fraction` of the bytes validate. `limit_bytes` > 0 keeps only the first that many
/// bytes (before the split), for short runs. A missing folder, or one without quotation
/// files, throws c10::Error that names the package to install.
ByteCorpus load_fortunes(const std::string& dir, double val_fraction = 0.05,
                         int64_t limit_bytes = 0);

}  // namespace lm
}  // namespace lucid
