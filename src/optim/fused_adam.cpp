// SPDX-License-Identifier: BSD-3-Clause
#include <lucid/optim/fused_adam.h>

#include "optim/fused_launch.h"

#include <torch/serialize/archive.h>
#include <torch/utils.h>

namespace lucid {
namespace optim {
namespace {

void check_options(const FusedAdamOptions& o) {
  TORCH_CHECK_VALUE(o.lr() >= 0, "Invalid learning rate: ", o.lr(), "; it must be >= 0.");
  TORCH_CHECK_VALUE(o.eps() >= 0, "Invalid epsilon value: ", o.eps(), "; it must be >= 0.");
  const auto betas = o.betas();
  TORCH_CHECK_VALUE(0 <= std::get<0>(betas) && std::get<0>(betas) < 1.0,
                    "Invalid beta parameter at index 0: ", std::get<0>(betas),
                    "; it must be in [0, 1).");
  TORCH_CHECK_VALUE(0 <= std::get<1>(betas) && std::get<1>(betas) < 1.0,
                    "Invalid beta parameter at index 1: ", std::get<1>(betas),
                    "; it must be in [0, 1).");
  TORCH_CHECK_VALUE(o.weight_decay() >= 0, "Invalid weight_decay value: ", o.weight_decay(),
                    "; it must be >= 0.");
}

// The state lists of a group (detail::KeptGroups): exp_avg, exp_avg_sq, with amsgrad
// max_exp_avg_sq, then the step counters.
size_t state_count(const torch::optim::OptimizerOptions& options) {
  return static_cast<const FusedAdamOptions&>(options).amsgrad() ? 4 : 3;
}

const at::Tensor& state_tensor(const torch::optim::OptimizerParamState& state, size_t s,
                               size_t count) {
  const auto& adam = static_cast<const FusedAdamParamState&>(state);
  if (s + 1 == count) {
    return adam.step();
  }
  return s == 0 ? adam.exp_avg() : s == 1 ? adam.exp_avg_sq() : adam.max_exp_avg_sq();
}

detail::AdamHyper hyper_of(const FusedAdamOptions& o, bool decoupled_weight_decay) {
  return {o.lr(),      std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(),
          o.amsgrad(), decoupled_weight_decay};
}

}  // namespace

FusedAdamOptions::FusedAdamOptions(double lr) : lr_(lr) {}

void FusedAdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
}

void FusedAdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
}

FusedAdamOptions& FusedAdamOptions::lr(double value) {
  lr_ = value;
  live_.write(detail::LiveSlot::kLr, value);
  return *this;
}

FusedAdamOptions& FusedAdamOptions::weight_decay(double value) {
  weight_decay_ = value;
  live_.write(detail::LiveSlot::kWeightDecay, value);
  return *this;
}

double FusedAdamOptions::get_lr() const { return lr(); }

void FusedAdamOptions::set_lr(const double lr) { this->lr(lr); }

void FusedAdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_exp_avg_sq);
}

void FusedAdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, max_exp_avg_sq);
}

FusedAdam::FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                     FusedAdamOptions defaults)
    : FusedAdam(param_groups, defaults, /*decoupled_weight_decay=*/false) {}

FusedAdam::FusedAdam(std::vector<torch::Tensor> params, FusedAdamOptions defaults)
    : FusedAdam({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

FusedAdam::FusedAdam(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                     FusedAdamOptions defaults, bool decoupled_weight_decay)
    : FusedOptimizer(param_groups, std::make_unique<FusedAdamOptions>(defaults)),
      decoupled_weight_decay_(decoupled_weight_decay) {
  check_options(defaults);
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = detail::run_closure(closure);
  const Scaling scaling = take_scaling();
  const char* name = decoupled_weight_decay_ ? "FusedAdamW" : "FusedAdam";
  detail::KeptGroups& kept = kept_groups();
  if (detail::step_kept<FusedAdamOptions>(
          kept, param_groups_, state_, state_count, state_tensor, check_options,
          [&](const FusedAdamOptions& o, const at::Device& device, const auto& lists) {
            detail::AdamHyper hyper = hyper_of(o, decoupled_weight_decay_);
            hyper.live = detail::live_values(o.live(), device, o.lr(), o.weight_decay(), 0.0);
            detail::launch_adam(device, lists, hyper, scaling.scale, scaling.found_inf);
          })) {
    return loss;
  }
  detail::KeptGroups::Record record(param_groups_);
  detail::step_buckets<FusedAdamOptions>(
      param_groups_, name, check_options, [&](const FusedAdamOptions& o, detail::Bucket& bucket) {
        detail::AdamHyper hyper = hyper_of(o, decoupled_weight_decay_);
        hyper.live = detail::live_values(o.live(), bucket.device, o.lr(), o.weight_decay(), 0.0);
        std::vector<at::Tensor> exp_avg, exp_avg_sq, max_exp_avg_sq, steps;
        std::vector<std::vector<at::Tensor>> kept_states(state_count(o));
        for (size_t k = 0; k < bucket.originals.size(); ++k) {
          const at::Tensor& p = bucket.originals[k];
          auto& s =
              detail::param_state<FusedAdamParamState>(state_, p, [&](FusedAdamParamState& fresh) {
                fresh.exp_avg(at::zeros_like(p));
                fresh.exp_avg_sq(at::zeros_like(p));
              });
          if (o.amsgrad() && !s.max_exp_avg_sq().defined()) {
            s.max_exp_avg_sq(at::zeros_like(p));
          }
          s.exp_avg(detail::on_device(s.exp_avg(), p.device()));
          s.exp_avg_sq(detail::on_device(s.exp_avg_sq(), p.device()));
          exp_avg.push_back(bucket.state(k, s.exp_avg(), name, "exp_avg"));
          exp_avg_sq.push_back(bucket.state(k, s.exp_avg_sq(), name, "exp_avg_sq"));
          if (o.amsgrad()) {
            s.max_exp_avg_sq(detail::on_device(s.max_exp_avg_sq(), p.device()));
            max_exp_avg_sq.push_back(bucket.state(k, s.max_exp_avg_sq(), name, "max_exp_avg_sq"));
          }
          detail::check_step_counter(p, s.step(), name, bucket.group, bucket.index[k]);
          steps.push_back(s.step());
          for (size_t l = 0; l < kept_states.size(); ++l) {
            kept_states[l].push_back(state_tensor(s, l, kept_states.size()));
          }
        }
        record.add(bucket, std::move(kept_states));
        const int steps_list =
            o.amsgrad() ? detail::AdamList::kStepsAmsgrad : detail::AdamList::kSteps;
        std::vector<std::vector<at::Tensor>> lists(steps_list + 1);
        lists[detail::AdamList::kParam] = bucket.params;
        lists[detail::AdamList::kGrad] = bucket.grads;
        lists[detail::AdamList::kExpAvg] = std::move(exp_avg);
        lists[detail::AdamList::kExpAvgSq] = std::move(exp_avg_sq);
        if (o.amsgrad()) {
          lists[detail::AdamList::kMaxExpAvgSq] = std::move(max_exp_avg_sq);
        }
        lists[steps_list] = std::move(steps);
        return [&bucket, &scaling, hyper, lists = std::move(lists)] {
          detail::launch_adam(bucket, lists, hyper, scaling.scale, scaling.found_inf);
        };
      });
  kept.adopt(std::move(record));
  return loss;
}

void FusedAdam::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamParamState, FusedAdamOptions>(archive, *this);
}

void FusedAdam::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedAdamParamState, FusedAdamOptions>(archive, *this);
}

FusedAdamW::FusedAdamW(const std::vector<torch::optim::OptimizerParamGroup>& param_groups,
                       FusedAdamOptions defaults)
    : FusedAdam(param_groups, defaults, /*decoupled_weight_decay=*/true) {}

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, FusedAdamOptions defaults)
    : FusedAdamW({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

}  // namespace optim
}  // namespace lucid
