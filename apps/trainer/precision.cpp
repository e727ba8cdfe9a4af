#include "precision.h"

#include <c10/util/Exception.h>

namespace lucid {
namespace trainer {

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32: return "fp32";
    case Precision::kFp16: return "fp16";
    case Precision::kFp16Scaled: return "fp16-scaled";
    case Precision::kBf16: return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  for (Precision p : all_precisions()) {
    if (to_string(p) == name) return p;
  }
  TORCH_CHECK_VALUE(false, "unknown precision '", name,
                    "': choose one of fp32, fp16, fp16-scaled, bf16.");
}

const std::vector<Precision>& all_precisions() {
  static const std::vector<Precision> all = {Precision::kFp32, Precision::kFp16,
                                             Precision::kFp16Scaled, Precision::kBf16};
  return all;
}

}  // namespace trainer
}  // namespace lucid
