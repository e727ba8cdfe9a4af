// SPDX-License-Identifier: BSD-3-Clause
#include "optim/fused_launch.h"

#include "common/device_kernels.h"
#include "common/plain_tensor.h"
#include "optim/fused_backend.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace lucid {
namespace optim {
namespace detail {

void check_like_param(const at::Tensor& param, const at::Tensor& t, const char* optimizer,
                      const char* what, size_t group, size_t index) {
  TORCH_CHECK(t.defined(), optimizer, ": the ", what, " of parameter ", index, " of param group ",
              group, " is missing.");
  common::check_plain_tensor(t, optimizer, "the ", what, " of parameter ", index,
                             " of param group ", group);
  TORCH_CHECK(t.layout() == c10::kStrided && t.sizes() == param.sizes() &&
                  t.scalar_type() == param.scalar_type() && t.device() == param.device(),
              optimizer, ": the ", what, " of parameter ", index, " of param group ", group,
              " is a ", t.scalar_type(), " tensor of sizes ", t.sizes(), " on ", t.device(),
              ", but the parameter is a ", param.scalar_type(), " tensor of sizes ", param.sizes(),
              " on ", param.device(),
              ". Resize or replace a parameter together with its gradient and state (or "
              "delete its state); nothing was changed.");
}

void check_step_counter(const at::Tensor& param, const at::Tensor& t, const char* optimizer,
                        size_t group, size_t index) {
  TORCH_CHECK(t.defined() && t.numel() == 1 && t.scalar_type() == at::kFloat &&
                  t.device() == param.device(),
              optimizer, ": the step counter of parameter ", index, " of param group ", group,
              " must be one float32 element on ", param.device(), "; it is ",
              t.defined() ? t.toString() : std::string("missing"), " of sizes ",
              t.defined() ? t.sizes() : c10::IntArrayRef{}, ". Nothing was changed.");
}

at::Tensor Bucket::state(size_t k, const at::Tensor& t, const char* optimizer, const char* what) {
  const at::Tensor& p = params[k];
  if (t.defined() && t.layout() == c10::kStrided && launchable(p, t)) {
    return t;
  }
  check_like_param(originals[k], t, optimizer, what, group, index[k]);
  at::Tensor copy = at::empty_like(p).copy_(t);
  copies.emplace_back(t, copy);
  return copy;
}

void Bucket::write_back() const {
  for (size_t i = 0; i < originals.size(); ++i) {
    if (!originals[i].is_same(params[i])) {
      originals[i].copy_(params[i]);
    }
  }
  for (const auto& [tensor, copy] : copies) {
    tensor.copy_(copy);
  }
}

std::vector<Bucket> bucket_params(const std::vector<at::Tensor>& params,
                                  const std::vector<size_t>& index, size_t group,
                                  const char* optimizer_name) {
  TORCH_INTERNAL_ASSERT(index.size() == params.size());
  for (size_t n = 0; n < params.size(); ++n) {
    const at::Tensor& p = params[n];
    const at::Tensor& g = p.grad();
    const size_t i = index[n];
    common::check_plain_tensor(p, optimizer_name, "parameter ", i, " of param group ", group);
    TORCH_CHECK(g.defined(), optimizer_name, ": parameter ", i, " of param group ", group,
                " has no gradient.");
    common::check_plain_tensor(g, optimizer_name, "the gradient of parameter ", i,
                               " of param group ", group);
    TORCH_CHECK_NOT_IMPLEMENTED(
        !g.is_sparse(), optimizer_name, " does not support sparse gradients (parameter ", i,
        " of param group ", group,
        "); use PyTorch's own SGD or Adam (torch.optim, torch::optim) for them.");
    TORCH_CHECK_NOT_IMPLEMENTED(
        p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble, optimizer_name,
        " updates float32 and float64 parameters; parameter ", i, " of param group ", group, " is ",
        p.scalar_type(), ". Keep master weights in float32 and let autocast run the forward pass.");
    TORCH_CHECK_NOT_IMPLEMENTED(p.is_cpu() || p.is_cuda(), optimizer_name,
                                " runs on CPU and CUDA; parameter ", i, " of param group ", group,
                                " is on ", p.device(),
                                ". Use PyTorch's own optimizer (torch.optim, torch::optim) there.");
    check_like_param(p, g, optimizer_name, "gradient", group, i);
  }
  std::vector<Bucket> buckets;
  for (size_t n = 0; n < params.size(); ++n) {
    const at::Tensor& p = params[n];
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& b) {
      return b.device == p.device() && b.dtype == p.scalar_type();
    });
    if (it == buckets.end()) {
      buckets.push_back(Bucket{p.device(), p.scalar_type(), group, {}, {}, {}, {}, {}, {}});
      it = std::prev(buckets.end());
    }
    const at::Tensor launch = p.is_non_overlapping_and_dense() ? p : p.contiguous();
    const at::Tensor& g = p.grad();
    it->index.push_back(index[n]);
    it->position.push_back(n);
    it->originals.push_back(p);
    it->params.push_back(launch);
    it->grads.push_back(launchable(launch, g) ? g : at::empty_like(launch).copy_(g));
  }
  return buckets;
}

std::vector<Bucket> bucket_group(const torch::optim::OptimizerParamGroup& group, size_t group_index,
                                 const char* optimizer_name) {
  std::vector<at::Tensor> with_grad;
  std::vector<size_t> index;
  const auto& params = group.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) {
      with_grad.push_back(params[i]);
      index.push_back(i);
    }
  }
  return bucket_params(with_grad, index, group_index, optimizer_name);
}

namespace {

// The table for `device`. bucket_group has refused every device other than the CPU and
// CUDA, and lucid-amp is built with its CUDA kernels whenever its LibTorch has CUDA, so a
// missing table is an internal error.
const FusedOptimBackend& backend_for(const at::Device& device) {
  const FusedOptimBackend* table = device_kernels(device.type()).optim;
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
