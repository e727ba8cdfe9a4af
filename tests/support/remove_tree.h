// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// Removes a scratch directory and everything in it, ignoring errors, without
// std::filesystem::remove_all.
//
// NOTE: [std::filesystem and PyTorch's libtorch.so]
// PyTorch 2.11's libtorch.so carries its own copies of std::filesystem functions, and a
// program linked against it binds there. On the H200 machine, remove_all of a directory
// holding files crashed inside that copy (cuda-gdb: a jump to address 0 from
// libtorch.so's remove_all, both overloads); create_directories with an error_code,
// remove and temp_directory_path ran. So tests, examples and benchmarks clean up with
// this function (POSIX nftw, children first) or fs::remove, never remove_all.

#include <ftw.h>
#include <stdio.h>

#include <string>

namespace lucid_test {

inline void remove_tree(const std::string& path) {
  nftw(
      path.c_str(),
      [](const char* entry, const struct stat*, int, struct FTW*) {
        ::remove(entry);  // a file, or a directory already emptied (FTW_DEPTH)
        return 0;
      },
      16, FTW_DEPTH | FTW_PHYS);
}

}  // namespace lucid_test
