// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// The four precisions either program trains in, and their names on the command line.

#include <c10/core/Device.h>

#include <string>
#include <vector>

namespace lucid {
namespace apps {

/// fp32: plain float32. fp16: float16 forward and backward, no loss scaling (gradients
/// underflow). fp16-scaled: the same with lucid::amp::GradScaler. bf16: bfloat16 autocast
/// (float32's range, so no scaling needed).
enum class Precision { kFp32, kFp16, kFp16Scaled, kBf16 };

/// The command-line name: "fp32", "fp16", "fp16-scaled" or "bf16".
std::string to_string(Precision precision);
/// Parses a command-line name; anything else throws c10::ValueError listing the choices.
Precision parse_precision(const std::string& name);
/// All four, in the order --compare runs them.
const std::vector<Precision>& all_precisions();
/// Whether the run uses the GradScaler.
inline bool uses_scaler(Precision p) { return p == Precision::kFp16Scaled; }
/// Whether the run's forward and backward are in float16 (real or emulated).
inline bool is_fp16(Precision p) { return p == Precision::kFp16 || p == Precision::kFp16Scaled; }

/// "cpu" or "cuda" as a device; c10::ValueError for another name, c10::Error for cuda
/// where this LibTorch sees no GPU (naming the CPU-only Debian package).
c10::Device parse_training_device(const std::string& name);

/// Makes float32 on CUDA mean float32: TF32 off for cuDNN's convolutions (on by default
/// in every LibTorch) and for cuBLAS, and deterministic cuDNN algorithms, so that the fp32
/// row of a comparison is a float32 baseline and a rerun repeats it. Process-wide (ATen
/// has one context); harmless where no GPU is used.
void use_exact_cuda_float32();

}  // namespace apps
}  // namespace lucid
