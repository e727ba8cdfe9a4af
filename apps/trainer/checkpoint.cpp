// SPDX-License-Identifier: BSD-3-Clause
// Trainer::save and Trainer::load: one torch::serialize archive holding "model" and
// "optimizer" (LibTorch's own formats), the GradScaler as GradScaler::save writes it
// (under lucid::amp::kGradScalerArchiveKey, with its format version and checksum), and
// "trainer" (config that decides the trajectory, loop position, counters and the step
// log). With these, a resumed run takes the same steps as an uninterrupted one: same
// weights, same Adam moments, same scale and growth tracker, same position in the same
// shuffled data order.
//
// The scaler goes through GradScaler::save/load, the library's one checkpoint format,
// so that lucid::amp::load_scaler reads the scaler out of a trainer checkpoint too, and
// so that loading can run load_scaler's archive check over the whole file (below).

#include <c10/util/Exception.h>
#include <lucid/amp/serialize.h>
#include <torch/serialize.h>
#include <torch/serialize/archive.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

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

// The bytes of the checkpoint at `path`, once they have passed what
// lucid::amp::load_scaler checks before it loads anything: the zip structure and every
// record's CRC-32 (the model's and the optimizer's records too), LibTorch's parse, and the
// scaler entry's format version, checksum and values. LibTorch's own reader skips the
// CRCs, so without this a flipped bit in the weights would load silently, and some
// corrupt records crash its importer. The check runs on a disabled scaler, which checks
// the entry and keeps nothing, so that a checkpoint of another precision (a disabled
// scaler's entry) still reaches the message that names the precision to resume with.
std::string checked_checkpoint_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  TORCH_CHECK(file.good(), "cannot read checkpoint ", path, ": cannot open it.");
  std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  TORCH_CHECK(!file.bad(), "cannot read checkpoint ", path, ": reading it failed.");
  lucid::amp::GradScaler probe(lucid::amp::GradScalerOptions().enabled(false));
  std::istringstream in(bytes);
  try {
    lucid::amp::load_scaler(probe, in);
    return bytes;
  } catch (const c10::Error& e) {
    const std::string why = e.what_without_backtrace();
    // GradScaler::load names its key when the archive has none, and it runs only after
    // the archive check and the parse have passed: then the bytes are safe to parse here,
    // to tell a checkpoint of the earlier trainer format from some other archive.
    const std::string no_scaler = std::string("no '") + lucid::amp::kGradScalerArchiveKey + "'";
    if (why.find(no_scaler) != std::string::npos) {
      torch::serialize::InputArchive root, nested;
      std::istringstream again(bytes);
      root.load_from(again);
      TORCH_CHECK(!(root.try_read("scaler", nested) && root.try_read("trainer", nested)),
                  "checkpoint ", path, " was written by an earlier lucid_amp_trainer, which "
                  "stored the scaler as plain tensors, without the format version, checksum "
                  "and archive check of GradScaler::save; this trainer does not read it. "
                  "Finish that run with the build that wrote it, or start it again (--save "
                  "writes the current format).");
      TORCH_CHECK(false, "checkpoint ", path, " is not one written by this trainer's --save: ",
                  why);
    }
    TORCH_CHECK(false, "cannot read checkpoint ", path, ": ", why);
  }
}

}  // namespace

void Trainer::save(const std::string& path) {
  torch::serialize::OutputArchive root, model, optim, state;
  model_->save(model);
  optimizer_->save(optim);

  put(state, "precision", static_cast<int64_t>(config_.precision));
  put(state, "batch_size", config_.batch_size);
  put(state, "seed", static_cast<int64_t>(config_.seed));
  put(state, "lr", config_.lr);
  put(state, "head_init_gain", config_.head_init_gain);
  put(state, "train_size", train_.size());
  put(state, "loss_norm", static_cast<int64_t>(config_.loss_norm));
  put(state, "loss_weight", config_.loss_weight);
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
  scaler_->save(root);
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
  const std::string bytes = checked_checkpoint_bytes(path);
  torch::serialize::InputArchive root, model, optim, state;
  std::istringstream in(bytes);
  root.load_from(in, device_);  // parsed once already, by the check
  TORCH_CHECK(root.try_read("trainer", state) && root.try_read("model", model) &&
                  root.try_read("optimizer", optim),
              "checkpoint ", path, " is not one written by this trainer's --save.");

  auto check_same = [&](const char* what, auto saved, auto mine, const char* flag) {
    TORCH_CHECK_VALUE(saved == mine, "checkpoint ", path, " was written with ", what, " ",
                      saved, ", this run has ", mine, ": resume with ", flag, " ", saved,
                      " (they decide the trajectory).");
  };
  const auto saved_precision = static_cast<apps::Precision>(get_int(state, "precision", path));
  TORCH_CHECK_VALUE(saved_precision == config_.precision, "checkpoint ", path,
                    " was written by a ", apps::to_string(saved_precision), " run; resume it with "
                    "--precision ", apps::to_string(saved_precision), ".");
  check_same("batch size", get_int(state, "batch_size", path), config_.batch_size,
             "--batch-size");
  check_same("seed", static_cast<uint64_t>(get_int(state, "seed", path)), config_.seed, "--seed");
  check_same("learning rate", get_double(state, "lr", path), config_.lr, "--lr");
  check_same("head gain", get_double(state, "head_init_gain", path), config_.head_init_gain,
             "--head-gain");
  TORCH_CHECK_VALUE(get_int(state, "loss_norm", path) == static_cast<int64_t>(config_.loss_norm),
                    "checkpoint ", path, " was written with the other --loss-norm.");
  // Checkpoints from before --loss-weight trained with weight 1.
  at::Tensor saved_weight;
  const double saved_loss_weight =
      state.try_read("loss_weight", saved_weight) ? saved_weight.item<double>() : 1.0;
  check_same("loss weight", saved_loss_weight, config_.loss_weight, "--loss-weight");
  TORCH_CHECK_VALUE(get_int(state, "flush_subnormals", path) == int64_t{config_.flush_subnormals},
                    "checkpoint ", path, " was written with the other --fp16-subnormals.");
  check_same("training-set size", get_int(state, "train_size", path), train_.size(),
             "--train-limit");

  // Read everything before changing anything, so that a bad checkpoint leaves the
  // trainer as it was (the scaler's entry was checked with the bytes).
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

  // The scaler first: GradScaler::load checks everything before it changes anything, so
  // if it refused, nothing else would have changed either.
  scaler_->load(root);
  model_->load(model);
  optimizer_->load(optim);

  epoch_ = epoch;
  batch_ = batch;
  result_.steps = steps;
  result_.skipped = get_int(state, "skipped", path);
  model_->grad_zeros().zeros = at::tensor(get_int(state, "zero_entries", path), at::kLong).to(device_);
  model_->grad_zeros().entries = get_int(state, "grad_entries", path);
  result_.train_seconds = get_double(state, "train_seconds", path);
  result_.log.clear();
  for (int64_t i = 0; i < steps; ++i) {
    result_.log.push_back(apps::StepRecord{i + 1, loss.data_ptr<double>()[i],
                                     scale.data_ptr<double>()[i], skipped.data_ptr<int64_t>()[i]});
  }
  result_.epoch_accuracy.assign(accuracy.data_ptr<double>(),
                                accuracy.data_ptr<double>() + accuracy.numel());
  if (!result_.epoch_accuracy.empty()) result_.test_accuracy = result_.epoch_accuracy.back();
  result_.final_scale = scaler_->get_scale();
}

}  // namespace trainer
}  // namespace lucid
