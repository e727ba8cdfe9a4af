// SPDX-License-Identifier: BSD-3-Clause
#include <lucid/amp.h>

#include <cstdio>
#include <cstring>

int main() {
  // The library linked is the one whose headers were compiled against.
  if (std::strcmp(lucid::amp::version(), LUCID_AMP_VERSION_STRING) != 0) {
    std::printf("consumer: library %s, headers %s\n", lucid::amp::version(),
                LUCID_AMP_VERSION_STRING);
    return 1;
  }
  lucid::amp::GradScaler scaler;
  auto loss = at::full({}, 2.0, at::kHalf);
  auto scaled = scaler.scale(loss);
  std::printf("consumer: lucid-amp %s scale %.0f scaled %.0f\n", lucid::amp::version(),
              scaler.get_scale(), scaled.item<double>());
  return scaled.item<double>() == 131072.0 ? 0 : 1;
}
