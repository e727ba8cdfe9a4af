#pragma once

// Internal: what every fused optimizer's step() shares — gathering a parameter group
// into per-device, per-dtype buckets, and routing one launch to the CPU or CUDA kernel.

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <vector>

#include "optim/fused_hyper.h"

namespace lucid {
namespace optim {
namespace detail {

// The parameters of one group that have a gradient, on one device with one dtype.
// `params` and `grads` are contiguous: a non-contiguous parameter is worked on through a
// contiguous copy that write_back() copies into it afterwards.
struct Bucket {
  at::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> originals;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> grads;

  void write_back() const;
};

// Checks every gradient of the group (dense; float32 or float64; same dtype and device as
// its parameter; on the CPU or CUDA) before anything changes, then buckets them.
std::vector<Bucket> bucket_group(const torch::optim::OptimizerParamGroup& group,
                                 const char* optimizer_name);

// One launch over a bucket's lists (kernels' order, step counters last); `scale` and
// `found_inf` as in ScalerAware::set_grad_scaling.
void launch_adam(const Bucket& bucket, const std::vector<std::vector<at::Tensor>>& lists,
                 const AdamHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf);
void launch_sgd(const Bucket& bucket, const std::vector<std::vector<at::Tensor>>& lists,
                const SgdHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf);

// A float32 0-dim step counter on `device`.
at::Tensor new_step_counter(const at::Device& device);

// `t` on `device` (state loaded from an archive arrives on the CPU).
at::Tensor on_device(const at::Tensor& t, const at::Device& device);

}  // namespace detail
}  // namespace optim
}  // namespace lucid
