// SPDX-License-Identifier: BSD-3-Clause
// The reference API's example, in C++ (docs/behaviour.md): train nn::Linear(4, 1)
// with autocast and the GradScaler for three steps, then one step with clipping of the
// unscaled gradients. Prints the scale and loss at each step.

#include <lucid/amp.h>
#include <torch/torch.h>

#include <cstdio>

int main() {
  torch::manual_seed(0);
  torch::Device device = torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  torch::nn::Linear model(4, 1);
  model->to(device);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  torch::nn::MSELoss loss_fn;
  lucid::amp::GradScaler scaler;
  std::printf("device %s\n", device.str().c_str());
  for (int i = 0; i < 3; ++i) {
    auto x = torch::randn({8, 4}, device), y = torch::randn({8, 1}, device);
    optimizer.zero_grad();
    torch::Tensor out;
    {
      lucid::amp::autocast guard(device.type());
      out = model->forward(x);
    }
    auto loss = loss_fn(out.to(torch::kFloat), y);
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(optimizer).has_value();
    scaler.update();
    std::printf("step %d  loss %.6f  scale %.1f  %s\n", i, loss.item<float>(),
                scaler.get_scale(), stepped ? "stepped" : "skipped");
  }
  // clipping the unscaled gradients
  auto x = torch::randn({8, 4}, device), y = torch::randn({8, 1}, device);
  optimizer.zero_grad();
  auto loss = loss_fn(model->forward(x), y);
  scaler.scale(loss).backward();
  scaler.unscale_(optimizer);
  auto norm = torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
  scaler.step(optimizer);
  scaler.update();
  std::printf("step 3  loss %.6f  scale %.1f  clipped grad norm %.6f\n", loss.item<float>(),
              scaler.get_scale(), static_cast<double>(norm));
  return 0;
}
