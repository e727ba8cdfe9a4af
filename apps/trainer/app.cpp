// SPDX-License-Identifier: BSD-3-Clause
// run_app: the trainer program's flow. Every check that can fail on bad input (output
// folder, checkpoint path, gnuplot, data) runs before the first training step, so that a
// mistake costs seconds, not a training run.

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <filesystem>

#include "cli.h"
#include "progress_bar.h"
#include "report.h"
#include "run_report.h"

namespace lucid {
namespace trainer {

void run_app(const CliOptions& o) {
  namespace fs = std::filesystem;
  if (o.threads > 0) at::set_num_threads(o.threads);
  apps::ensure_writable_dir(o.out_dir);
  if (!o.save_path.empty()) apps::ensure_writable_file(o.save_path);
  if (!o.resume_path.empty()) {
    std::error_code ec;
    TORCH_CHECK(fs::is_regular_file(o.resume_path, ec), "cannot resume: checkpoint ",
                o.resume_path, " does not exist.");
  }
  if (o.plot) {
    TORCH_CHECK(!apps::find_gnuplot().empty(), "gnuplot not found on PATH: the loss plot needs it. "
                "Install it with `apt-get install gnuplot-nox`, or pass --no-plot.");
  }

  const FashionMnist data = load_fashion_mnist(o.data_dir, o.train_limit, o.test_limit);
  const std::vector<apps::Precision> modes =
      o.compare ? o.modes : std::vector<apps::Precision>{o.config.precision};
  std::printf("Fashion-MNIST from %s: %lld training images, %lld test images\n",
              o.data_dir.c_str(), static_cast<long long>(data.train.size()),
              static_cast<long long>(data.test.size()));
  std::printf("device %s, %d threads, batch %lld, Adam lr %g, seed %llu, epochs %lld, "
              "loss %s x %g, head gain %g%s\n",
              o.config.device.c_str(), at::get_num_threads(),
              static_cast<long long>(o.config.batch_size), o.config.lr,
              static_cast<unsigned long long>(o.config.seed),
              static_cast<long long>(o.config.epochs),
              o.config.loss_norm == LossNorm::kBatchMean ? "batch mean" : "batch sum / N",
              o.config.loss_weight, o.config.head_init_gain,
              o.config.device == "cpu" ? "; fp16 = float16 range emulated on the CPU"
                                       : "; fp16 = real float16 autocast");
  std::fflush(stdout);

  std::vector<RunResult> results;
  for (apps::Precision p : modes) {
    TrainConfig config = o.config;
    config.precision = p;
    Trainer trainer(config, data.train, data.test);
    if (!o.resume_path.empty()) {
      trainer.load(o.resume_path);
      std::printf("%s: resumed from %s at step %lld (scale %g)\n", apps::to_string(p).c_str(),
                  o.resume_path.c_str(), static_cast<long long>(trainer.result().steps),
                  trainer.scaler().get_scale());
    }
    apps::ProgressBar bar(apps::to_string(p));
    auto on_step = [&](const apps::StepEvent& e) {
      if (o.progress) bar.update(e);
    };
    auto on_epoch = [&](int64_t epoch, double accuracy) {
      bar.finish();
      std::printf("%-11s epoch %lld: test accuracy %.2f %%\n", apps::to_string(p).c_str(),
                  static_cast<long long>(epoch + 1), accuracy);
      std::fflush(stdout);
    };
    results.push_back(trainer.run(on_step, on_epoch));
    bar.finish();
    if (!o.save_path.empty()) {
      trainer.save(o.save_path);
      std::printf("checkpoint: %s (step %lld)\n", o.save_path.c_str(),
                  static_cast<long long>(results.back().steps));
    }
  }

  std::printf("\n%s", results_table(results).c_str());
  char title[200];
  std::snprintf(title, sizeof title,
                "lucid-amp on Fashion-MNIST: %lld training images, %lld epoch(s), %s",
                static_cast<long long>(data.train.size()),
                static_cast<long long>(o.config.epochs),
                o.config.device == "cpu" ? "CPU (float16 range emulated)" : "CUDA");
  apps::write_logs(o.out_dir, "train_log.csv", "train_curves.png",
                   std::vector<apps::RunRecord>(results.begin(), results.end()), title, o.plot);
}

}  // namespace trainer
}  // namespace lucid
