// SPDX-License-Identifier: BSD-3-Clause
// End-to-end: one GPT-small-like training step from C++ (12 blocks, d=768, 12 heads,
// batch 16 x 512) with float16 autocast, GradScaler and FusedAdamW — the model of
// the PyTorch baseline script's "fp16_scaler" step (PyTorch's Python loop
// with its fused AdamW); run the script in the same call to compare.

#include <lucid/amp.h>
#include <torch/torch.h>

#include <ATen/cuda/CUDAEvent.h>


#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

// As torch.nn.MultiheadAttention (packed in-projection, out-projection) followed by the
// anchor's pre-norm block; attention through scaled_dot_product_attention, which is
// what nn.MultiheadAttention uses in training when no weights are returned.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t d, int64_t heads)
      : d_(d), heads_(heads),
        ln1(register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        in_proj(register_module("in_proj", torch::nn::Linear(d, 3 * d))),
        out_proj(register_module("out_proj", torch::nn::Linear(d, d))),
        ln2(register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        fc1(register_module("fc1", torch::nn::Linear(d, 4 * d))),
        fc2(register_module("fc2", torch::nn::Linear(4 * d, d))) {}

  torch::Tensor forward(torch::Tensor x) {
    const int64_t b = x.size(0), t = x.size(1), dh = d_ / heads_;
    auto qkv = in_proj(ln1(x)).view({b, t, 3, heads_, dh}).permute({2, 0, 3, 1, 4});
    auto a = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]);
    x = x + out_proj(a.transpose(1, 2).reshape({b, t, d_}));
    return x + fc2(torch::gelu(fc1(ln2(x))));
  }

  int64_t d_, heads_;
  torch::nn::LayerNorm ln1;
  torch::nn::Linear in_proj, out_proj;
  torch::nn::LayerNorm ln2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int64_t d = 768, layers = 12, t = 512, b = 16;
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) model->push_back(Block(d, 12));
  model->to(torch::kCUDA);
  auto x = torch::randn({b, t, d}, torch::kCUDA), y = torch::randn({b, t, d}, torch::kCUDA);
  lucid::optim::FusedAdamW opt(model->parameters(), lucid::optim::FusedAdamWOptions(1e-4));
  lucid::amp::GradScaler scaler;
  auto step = [&] {
    for (auto& p : model->parameters()) p.mutable_grad() = torch::Tensor();  // set_to_none
    torch::Tensor out;
    {
      lucid::amp::autocast guard(torch::kCUDA, torch::kHalf);
      out = model->forward(x);
    }
    auto loss = torch::mse_loss(out.to(torch::kFloat), y);
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
  };
  for (int i = 0; i < 5; ++i) step();
  torch::cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
    start.record();
    step();
    stop.record();
    stop.synchronize();
    times.push_back(start.elapsed_time(stop));
  }
  std::sort(times.begin(), times.end());
  std::printf("gpt-small fp16 autocast + GradScaler + FusedAdamW step (C++): median %.3f ms, scale %.0f\n",
              times[times.size() / 2], scaler.get_scale());
  return 0;
}
