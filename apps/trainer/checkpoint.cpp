// Trainer::save and Trainer::load: one torch::serialize archive holding four nested
// archives, "model", "optimizer" (LibTorch's own formats), "scaler" (the GradScaler's
// state_dict, one float64 tensor per key) and "trainer" (config that decides the
// trajectory, loop position, counters and the step log). With these, a resumed run takes
// the same steps as an uninterrupted one: same weights, same Adam moments, same scale and
// growth tracker, same position in the same seeded data order.

#include <c10/util/Exception.h>
#include <torch/serialize.h>
#include <torch/serialize/archive.h>

#include <filesystem>
#include <fstream>

#include "trainer.h"

namespace lucid {
namespace trainer {
namespace {

void put(torch::serialize::OutputArchive& a, const std::string& key, double v) {
  a.write(key, at::tensor(v, at::kDouble));
}
void put(torch::serialize::OutputArchive& a, const std::string& key, int64_t v) {
  a.write(key, at::tensor(v, at::kLong));
}

at::Tensor get_tensor(torch::serialize::InputArchive& a, const std::string& key,
                      const std::string& path) {
  at::Tensor t;
  TORCH_CHECK(a.try_read(key, t), "checkpoint ", path, " lacks '", key,
              "': not a checkpoint written by this trainer's --save.");
  return t;
}
double get_double(torch::serialize::InputArchive& a, const std::string& key,
                  const std::string& path) {
  return get_tensor(a, key, path).item<double>();
}
int64_t get_int(torch::serialize::InputArchive& a, const std::string& key,
                const std::string& path) {
  return get_tensor(a, key, path).item<int64_t>();
}

}  // namespace

void Trainer::save(const std::string& path) {
  torch::serialize::OutputArchive root, model, optim, scaler, state;
  model_->save(model);
  optimizer_->save(optim);
  for (const auto& [key, value] : scaler_->state_dict()) put(scaler, key, value);

  put(state, "precision", static_cast<int64_t>(config_.precision));
  put(state, "batch_size", config_.batch_size);
  put(state, "seed", static_cast<int64_t>(config_.seed));
  put(state, "lr", config_.lr);
  put(state, "head_init_gain", config_.head_init_gain);
  put(state, "train_size", train_.size());
  put(state, "loss_norm", static_cast<int64_t>(config_.loss_norm));
  put(state, "flush_subnormals", static_cast<int64_t>(config_.flush_subnormals));
  put(state, "epoch", epoch_);
  put(state, "batch", batch_);
  put(state, "steps", result_.steps);
  put(state, "skipped", result_.skipped);
  const auto& zeros = model_->grad_zeros();
  put(state, "zero_entries", zeros.zeros.defined() ? zeros.zeros.item<int64_t>() : int64_t{0});
  put(state, "grad_entries", zeros.entries);
  put(state, "train_seconds", result_.train_seconds);
  const auto n = static_cast<int64_t>(result_.log.size());
  auto loss = at::empty({n}, at::kDouble), scale = at::empty({n}, at::kDouble);
  auto skipped = at::empty({n}, at::kLong);
  for (int64_t i = 0; i < n; ++i) {
    loss.data_ptr<double>()[i] = result_.log[i].loss;
    scale.data_ptr<double>()[i] = result_.log[i].scale;
    skipped.data_ptr<int64_t>()[i] = result_.log[i].skipped;
  }
  state.write("log_loss", loss);
  state.write("log_scale", scale);
  state.write("log_skipped", skipped);
  state.write("epoch_accuracy", at::tensor(result_.epoch_accuracy, at::kDouble).reshape({-1}));

  root.write("model", model);
  root.write("optimizer", optim);
  root.write("scaler", scaler);
  root.write("trainer", state);
  // Written beside the target and renamed into place, so that a crash or a full disk
  // never leaves half a checkpoint where the last good one was.
  const std::string tmp = path + ".tmp";
  root.save_to(tmp);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TORCH_CHECK(!ec, "cannot write checkpoint ", path, ": ", ec.message(), ".");
}

void Trainer::load(const std::string& path) {
  torch::serialize::InputArchive root, model, optim, scaler, state;
  try {
    root.load_from(path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "cannot read checkpoint ", path, ": ", e.what_without_backtrace());
  }
  TORCH_CHECK(root.try_read("trainer", state) && root.try_read("model", model) &&
                  root.try_read("optimizer", optim) && root.try_read("scaler", scaler),
              "checkpoint ", path, " is not one written by this trainer's --save.");

  auto check_same = [&](const char* what, auto saved, auto mine, const char* flag) {
    TORCH_CHECK_VALUE(saved == mine, "checkpoint ", path, " was written with ", what, " ",
                      saved, ", this run has ", mine, ": resume with ", flag, " ", saved,
                      " (they decide the trajectory).");
  };
  const auto saved_precision = static_cast<Precision>(get_int(state, "precision", path));
  TORCH_CHECK_VALUE(saved_precision == config_.precision, "checkpoint ", path,
                    " was written by a ", to_string(saved_precision), " run; resume it with "
                    "--precision ", to_string(saved_precision), ".");
  check_same("batch size", get_int(state, "batch_size", path), config_.batch_size,
             "--batch-size");
  check_same("seed", static_cast<uint64_t>(get_int(state, "seed", path)), config_.seed, "--seed");
  check_same("learning rate", get_double(state, "lr", path), config_.lr, "--lr");
  check_same("head gain", get_double(state, "head_init_gain", path), config_.head_init_gain,
             "--head-gain");
  TORCH_CHECK_VALUE(get_int(state, "loss_norm", path) == static_cast<int64_t>(config_.loss_norm),
                    "checkpoint ", path, " was written with the other --loss-norm.");
  TORCH_CHECK_VALUE(get_int(state, "flush_subnormals", path) == int64_t{config_.flush_subnormals},
                    "checkpoint ", path, " was written with the other --fp16-subnormals.");
  check_same("training-set size", get_int(state, "train_size", path), train_.size(),
             "--train-limit");

  // Read everything before changing anything, so that a bad checkpoint leaves the
  // trainer as it was (the scaler's load_state_dict validates on its own).
  std::map<std::string, double> scaler_state;
  for (const char* key :
       {"scale", "growth_factor", "backoff_factor", "growth_interval", "growth_tracker"}) {
    at::Tensor t;
    if (scaler.try_read(key, t)) scaler_state[key] = t.item<double>();
  }
  const int64_t epoch = get_int(state, "epoch", path), batch = get_int(state, "batch", path);
  const auto loss = get_tensor(state, "log_loss", path).to(at::kDouble).contiguous();
  const auto scale = get_tensor(state, "log_scale", path).to(at::kDouble).contiguous();
  const auto skipped = get_tensor(state, "log_skipped", path).to(at::kLong).contiguous();
  const auto accuracy = get_tensor(state, "epoch_accuracy", path).to(at::kDouble).contiguous();
  const int64_t steps = get_int(state, "steps", path);
  TORCH_CHECK(loss.numel() == steps && scale.numel() == steps && skipped.numel() == steps &&
                  batch >= 0 && batch < steps_per_epoch() && epoch >= 0,
              "checkpoint ", path, " is inconsistent (", steps, " steps, a log of ",
              loss.numel(), ", epoch ", epoch, " batch ", batch, ").");

  model_->load(model);
  optimizer_->load(optim);
  scaler_->load_state_dict(scaler_state);

  epoch_ = epoch;
  batch_ = batch;
  result_.steps = steps;
  result_.skipped = get_int(state, "skipped", path);
  model_->grad_zeros().zeros = at::tensor(get_int(state, "zero_entries", path), at::kLong).to(device_);
  model_->grad_zeros().entries = get_int(state, "grad_entries", path);
  result_.train_seconds = get_double(state, "train_seconds", path);
  result_.log.clear();
  for (int64_t i = 0; i < steps; ++i) {
    result_.log.push_back(StepRecord{i + 1, loss.data_ptr<double>()[i],
                                     scale.data_ptr<double>()[i], skipped.data_ptr<int64_t>()[i]});
  }
  result_.epoch_accuracy.assign(accuracy.data_ptr<double>(),
                                accuracy.data_ptr<double>() + accuracy.numel());
  if (!result_.epoch_accuracy.empty()) result_.test_accuracy = result_.epoch_accuracy.back();
  result_.final_scale = scaler_->get_scale();
}

}  // namespace trainer
}  // namespace lucid
