#include <lucid/amp.h>

#include <cstdio>

int main() {
  lucid::amp::GradScaler scaler;
  auto loss = at::full({}, 2.0, at::kHalf);
  auto scaled = scaler.scale(loss);
  std::printf("consumer: scale %.0f scaled %.0f\n", scaler.get_scale(), scaled.item<double>());
  return scaled.item<double>() == 131072.0 ? 0 : 1;
}
