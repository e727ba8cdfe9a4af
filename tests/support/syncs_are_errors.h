// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// CUDA builds only. While a SyncsAreErrors lives, CUDA's sync debug mode is "error": any
// host synchronisation (a read-back, a blocking copy) throws, so a test can show that a
// stretch of code never waits for the device.

#include <c10/cuda/CUDAFunctions.h>

namespace lucid_test {

struct SyncsAreErrors {
  SyncsAreErrors() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  }
  ~SyncsAreErrors() {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  SyncsAreErrors(const SyncsAreErrors&) = delete;
  SyncsAreErrors& operator=(const SyncsAreErrors&) = delete;
};

}  // namespace lucid_test
