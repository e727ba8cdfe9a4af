#pragma once

// Removes a scratch directory and everything in it, ignoring errors, without
// std::filesystem::remove_all: PyTorch 2.11's libtorch.so carries its own copy of that
// function, a program linked against it binds there, and on the H200 machine it crashed
// on a directory holding files (NOTE: [std::filesystem and PyTorch's libtorch.so] in
// tests/trainer/test_idx_reader.cpp). POSIX nftw walks the tree instead, children first.

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
