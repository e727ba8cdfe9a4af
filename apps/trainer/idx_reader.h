// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// IDX files (the MNIST family's format), plain or gzip-compressed, and the Fashion-MNIST
// data set that Debian's dataset-fashion-mnist package installs.

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lucid {
namespace trainer {

/// Where dataset-fashion-mnist puts the four files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
/// The environment variable that overrides kFashionMnistDir.
inline constexpr const char* kFashionMnistDirEnv = "LUCID_AMP_FASHION_MNIST_DIR";

/// The default data folder: $LUCID_AMP_FASHION_MNIST_DIR where it is set and not empty,
/// else kFashionMnistDir. The GPU machine has no Debian package: its script carries the
/// four files and points the variable at them, so that the program's --data default and
/// the tests read the same copy.
std::string fashion_mnist_dir();

/// An IDX array of unsigned bytes: its dimensions and its elements, row-major.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

/// Reads an IDX file of unsigned bytes (type code 0x08), gzip-compressed or not. A file
/// that cannot be opened, a wrong magic number, a data section shorter or longer than
/// the header says, or a damaged gzip stream throw c10::Error naming the file and what
/// was wrong.
IdxArray read_idx(const std::string& path);

/// Images and labels of one split.
struct Dataset {
  at::Tensor images;  ///< float32 [N, 1, 28, 28], normalised to mean 0, std 1
  at::Tensor labels;  ///< int64 [N], values 0..9
  int64_t size() const { return labels.defined() ? labels.size(0) : 0; }
};

/// Reads an images file ([N,28,28]) and a labels file ([N], values < 10) into a Dataset;
/// shapes that do not fit throw c10::Error. `limit` > 0 keeps the first `limit` examples.
Dataset load_idx_pair(const std::string& images_path, const std::string& labels_path,
                      int64_t limit = 0);

/// Both splits of Fashion-MNIST.
struct FashionMnist {
  Dataset train, test;
};

/// Loads train-*-ubyte.gz and t10k-*-ubyte.gz from `dir` (limits as in load_idx_pair).
/// A missing file throws c10::Error that names the package to install.
FashionMnist load_fashion_mnist(const std::string& dir, int64_t train_limit = 0,
                                int64_t test_limit = 0);

}  // namespace trainer
}  // namespace lucid
