// SPDX-License-Identifier: BSD-3-Clause
#include <lucid/optim/fused_sgd.h>

#include "optim/fused_launch.h"

#include <torch/serialize/archive.h>
#include <torch/utils.h>

namespace lucid {
namespace optim {
namespace {

void check_options(const FusedSGDOptions& o) {
  TORCH_CHECK_VALUE(o.lr() >= 0, "Invalid learning rate: ", o.lr(), "; it must be >= 0.");
  TORCH_CHECK_VALUE(o.momentum() >= 0, "Invalid momentum value: ", o.momentum(),
                    "; it must be >= 0.");
  TORCH_CHECK_VALUE(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay(),
                    "; it must be >= 0.");
  TORCH_CHECK_VALUE(!o.nesterov() || (o.momentum() > 0 && o.dampening() == 0),
                    "Nesterov momentum requires a momentum > 0 and zero dampening.");
}

// The state lists of a group (detail::KeptGroups): with momentum the momentum buffers,
// then the step counters.
size_t state_count(const torch::optim::OptimizerOptions& options) {
  return static_cast<const FusedSGDOptions&>(options).momentum() != 0 ? 2 : 1;
}

const at::Tensor& state_tensor(const torch::optim::OptimizerParamState& state, size_t s,
                               size_t count) {
  const auto& sgd = static_cast<const FusedSGDParamState&>(state);
  return s + 1 == count ? sgd.step() : sgd.momentum_buffer();
}

detail::SgdHyper hyper_of(const FusedSGDOptions& o) {
  return {o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()};
}

}  // namespace

FusedSGDOptions::FusedSGDOptions(double lr) : lr_(lr) {}

void FusedSGDOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(dampening);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(nesterov);
}

void FusedSGDOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, momentum);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, dampening);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, nesterov);
}

FusedSGDOptions& FusedSGDOptions::lr(double value) {
  lr_ = value;
  live_.write(detail::LiveSlot::kLr, value);
  return *this;
}

FusedSGDOptions& FusedSGDOptions::momentum(double value) {
  momentum_ = value;
  live_.write(detail::LiveSlot::kMomentum, value);
  return *this;
}

FusedSGDOptions& FusedSGDOptions::weight_decay(double value) {
  weight_decay_ = value;
  live_.write(detail::LiveSlot::kWeightDecay, value);
  return *this;
}

double FusedSGDOptions::get_lr() const { return lr(); }

void FusedSGDOptions::set_lr(const double lr) { this->lr(lr); }

void FusedSGDParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(momentum_buffer);
}

void FusedSGDParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, momentum_buffer);
}

FusedSGD::FusedSGD(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                   FusedSGDOptions defaults)
    : FusedOptimizer(param_groups, std::make_unique<FusedSGDOptions>(defaults)) {
  check_options(defaults);
}

FusedSGD::FusedSGD(std::vector<torch::Tensor> params, FusedSGDOptions defaults)
    : FusedSGD({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

torch::Tensor FusedSGD::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = detail::run_closure(closure);
  const Scaling scaling = take_scaling();
  detail::KeptGroups& kept = kept_groups();
  if (detail::step_kept<FusedSGDOptions>(
          kept, param_groups_, state_, state_count, state_tensor, check_options,
          [&](const FusedSGDOptions& o, const at::Device& device, const auto& lists) {
            detail::SgdHyper hyper = hyper_of(o);
            hyper.live =
                detail::live_values(o.live(), device, o.lr(), o.weight_decay(), o.momentum());
            detail::launch_sgd(device, lists, hyper, scaling.scale, scaling.found_inf);
          })) {
    return loss;
  }
  detail::KeptGroups::Record record(param_groups_);
  detail::step_buckets<FusedSGDOptions>(
      param_groups_, "FusedSGD", check_options,
      [&](const FusedSGDOptions& o, detail::Bucket& bucket) {
        detail::SgdHyper hyper = hyper_of(o);
        hyper.live =
            detail::live_values(o.live(), bucket.device, o.lr(), o.weight_decay(), o.momentum());
        const bool momentum = o.momentum() != 0;
        std::vector<at::Tensor> buffers, steps;
        std::vector<std::vector<at::Tensor>> kept_states(state_count(o));
        for (size_t k = 0; k < bucket.originals.size(); ++k) {
          const at::Tensor& p = bucket.originals[k];
          auto& s = detail::param_state<FusedSGDParamState>(state_, p, [](FusedSGDParamState&) {});
          if (momentum) {
            // The kernel fills it from the first gradient (step counter 0).
            if (!s.momentum_buffer().defined()) {
              s.momentum_buffer(at::zeros_like(p));
            }
            s.momentum_buffer(detail::on_device(s.momentum_buffer(), p.device()));
            buffers.push_back(bucket.state(k, s.momentum_buffer(), "FusedSGD", "momentum_buffer"));
          }
          detail::check_step_counter(p, s.step(), "FusedSGD", bucket.group, bucket.index[k]);
          steps.push_back(s.step());
          for (size_t l = 0; l < kept_states.size(); ++l) {
            kept_states[l].push_back(state_tensor(s, l, kept_states.size()));
          }
        }
        record.add(bucket, std::move(kept_states));
        const int steps_list = momentum ? detail::SgdList::kStepsMomentum : detail::SgdList::kSteps;
        std::vector<std::vector<at::Tensor>> lists(steps_list + 1);
        lists[detail::SgdList::kParam] = bucket.params;
        lists[detail::SgdList::kGrad] = bucket.grads;
        if (momentum) {
          lists[detail::SgdList::kMomentumBuffer] = std::move(buffers);
        }
        lists[steps_list] = std::move(steps);
        return [&bucket, &scaling, hyper, lists = std::move(lists)] {
          detail::launch_sgd(bucket, lists, hyper, scaling.scale, scaling.found_inf);
        };
      });
  kept.adopt(std::move(record));
  return loss;
}

void FusedSGD::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedSGDParamState, FusedSGDOptions>(archive, *this);
}

void FusedSGD::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedSGDParamState, FusedSGDOptions>(archive, *this);
}

}  // namespace optim
}  // namespace lucid
