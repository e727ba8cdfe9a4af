#pragma once

// The four ways the trainer can run, and their names on the command line.

#include <string>
#include <vector>

namespace lucid {
namespace trainer {

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

}  // namespace trainer
}  // namespace lucid
