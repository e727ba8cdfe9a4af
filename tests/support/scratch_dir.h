// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// A scratch directory of its own under the system's temporary directory (mkdtemp, so
// that parallel runs never share one), removed with everything in it when the object
// goes (remove_tree: never std::filesystem::remove_all, see remove_tree.h). Declare it
// before anything that keeps files in it open (a c10d FileStore, a process group), so
// that those go first.

#include "remove_tree.h"

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace lucid_test {

class ScratchDir {
 public:
  // Makes <temp>/<prefix>_XXXXXX; throws std::runtime_error if it cannot.
  explicit ScratchDir(const std::string& prefix = "lucid_test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot make a scratch directory " + pattern);
    }
    path_ = pattern;
  }
  ~ScratchDir() { remove_tree(path_.string()); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the directory.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace lucid_test
