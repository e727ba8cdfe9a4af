// SPDX-License-Identifier: BSD-3-Clause
#include "optim/fused_launch.h"

#include "common/plain_tensor.h"
#include "optim/fused_backend.h"

#include <c10/util/Exception.h>

namespace lucid {
namespace optim {
namespace detail {

void Bucket::write_back() const {
  for (size_t i = 0; i < originals.size(); ++i) {
    if (!originals[i].is_same(params[i])) {
      originals[i].copy_(params[i]);
    }
  }
}

std::vector<Bucket> bucket_group(const torch::optim::OptimizerParamGroup& group,
                                 const char* optimizer_name) {
  std::vector<Bucket> buckets;
  const auto& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const at::Tensor& g = p.grad();
    if (!g.defined()) {
      continue;
    }
    common::check_plain_tensor(p, optimizer_name, "parameter ", i);
    common::check_plain_tensor(g, optimizer_name, "the gradient of parameter ", i);
    TORCH_CHECK_NOT_IMPLEMENTED(!g.is_sparse(), optimizer_name,
                                " does not support sparse gradients (parameter ", i,
                                "); use torch::optim::SGD or Adam for sparse parameters.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, optimizer_name,
        " updates float32 and float64 parameters; parameter ", i, " is ", p.scalar_type(),
        ". Keep master weights in float32 and let autocast run the forward pass.");
    TORCH_CHECK(g.scalar_type() == p.scalar_type(), optimizer_name, ": parameter ", i, " is ",
                p.scalar_type(), " but its gradient is ", g.scalar_type(), ".");
    TORCH_CHECK(g.device() == p.device(), optimizer_name, ": parameter ", i, " is on ",
                p.device(), " but its gradient is on ", g.device(), ".");
    TORCH_CHECK_NOT_IMPLEMENTED(p.is_cpu() || p.is_cuda(), optimizer_name,
                                " runs on CPU and CUDA; parameter ", i, " is on ", p.device(),
                                ". Use the torch::optim optimizer there.");
  }
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) {
      continue;
    }
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.device == p.device() && b.dtype == p.scalar_type();
    });
    if (it == buckets.end()) {
      buckets.push_back({p.device(), p.scalar_type(), {}, {}, {}});
      it = std::prev(buckets.end());
    }
    it->originals.push_back(p);
    it->params.push_back(p.is_contiguous() ? p : p.contiguous());
    it->grads.push_back(g.is_contiguous() ? g : g.contiguous());
  }
  return buckets;
}

namespace {

// The table for `device`. bucket_group has refused every device other than the CPU and
// CUDA, and lucid-amp is built with its CUDA kernels whenever its LibTorch has CUDA, so a
// missing table is an internal error.
const FusedOptimBackend& backend_for(const at::Device& device) {
  const FusedOptimBackend* table = find_fused_backend(device.type());
  TORCH_INTERNAL_ASSERT(table != nullptr, "lucid-amp has no fused optimizer kernels for ", device,
                        " in this build");
  return *table;
}

}  // namespace

void launch_adam(const at::Device& device, const std::vector<std::vector<at::Tensor>>& lists,
                 const AdamHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf) {
  backend_for(device).adam_(lists, hyper, scale, found_inf);
}

void launch_sgd(const at::Device& device, const std::vector<std::vector<at::Tensor>>& lists,
                const SgdHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf) {
  backend_for(device).sgd_(lists, hyper, scale, found_inf);
}

void launch_adam(const Bucket& bucket, const std::vector<std::vector<at::Tensor>>& lists,
                 const AdamHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf) {
  launch_adam(bucket.device, lists, hyper, scale, found_inf);
  bucket.write_back();
}

void launch_sgd(const Bucket& bucket, const std::vector<std::vector<at::Tensor>>& lists,
                const SgdHyper& hyper, const at::Tensor& scale, const at::Tensor& found_inf) {
  launch_sgd(bucket.device, lists, hyper, scale, found_inf);
  bucket.write_back();
}

at::Tensor new_step_counter(const at::Device& device) {
  return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
}

at::Tensor on_device(const at::Tensor& t, const at::Device& device) {
  return (!t.defined() || t.device() == device) ? t : t.to(device);
}

}  // namespace detail
}  // namespace optim
}  // namespace lucid
