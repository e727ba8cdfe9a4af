// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The LibTorch versions lucid-amp supports: those it is tested against (2.13 on the CPU in
// CI, 2.11 with CUDA on the GPU machine). CMakeLists.txt refuses an older LibTorch at
// configure time; src/amp/version.cpp includes this header so that a build that bypasses
// CMake (the Python package's setup.py) fails here too, with the versions named. Code for
// a difference between supported releases, should one appear, goes here and nowhere else.

#include <torch/version.h>

static_assert(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 11),
              "lucid-amp needs LibTorch 2.11 or later (tested: 2.11 and 2.13)");
