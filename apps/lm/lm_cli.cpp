// SPDX-License-Identifier: BSD-3-Clause
#include "lm_cli.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>

#include "guarded_main.h"
#include "lm_report.h"
#include "progress_bar.h"
#include "run_report.h"

namespace lucid {
namespace lm {

std::optional<LmOptions> parse_lm_cli(int argc, char** argv, int& exit_code) {
  LmOptions o;
  LmConfig& c = o.config;
  std::string precision = apps::to_string(c.precision);
  std::vector<std::string> modes;
  for (auto p : o.modes) modes.push_back(apps::to_string(p));
  const std::vector<std::string> names = {"fp32", "fp16", "fp16-scaled", "bf16"};

  CLI::App app{
      "lucid_amp_lm: trains a small byte-level GPT on the quotations of Debian's fortunes "
      "package with FusedAdamW, in fp32, fp16 without loss scaling, fp16 with "
      "lucid::amp::GradScaler, or bf16. The loss is the ordinary mean token cross-entropy. "
      "On CUDA fp16 and bf16 use real autocast; on the CPU float16's range is emulated.",
      "lucid_amp_lm"};
  app.get_formatter()->column_width(34);
  auto* prec = app.add_option("-p,--precision", precision, "Precision of a single run")
                   ->check(CLI::IsMember(names))
                   ->capture_default_str();
  auto* cmp = app.add_flag("--compare", o.compare,
                           "Run every precision of --modes with the same seed, weights and "
                           "batches, then print a table");
  app.add_option("--modes", modes, "Precisions that --compare runs, comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app.add_option("--corpus", o.corpus_dir,
                 "Folder of fortune files (Debian package fortunes; the default is "
                 "$LUCID_AMP_FORTUNES_DIR where set)")
      ->capture_default_str();
  app.add_option("--device", c.device, "cpu, or cuda (real float16 autocast)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--steps", c.steps, "Training steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("-b,--batch-size", c.batch_size, "Sequences per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--context", c.shape.context, "Bytes per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--d-model", c.shape.d_model, "Width of the residual stream")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--layers", c.shape.layers, "Transformer blocks")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--heads", c.shape.heads, "Attention heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", c.lr, "FusedAdamW's learning rate")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "FusedAdamW's decoupled weight decay")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  std::string subnormals = c.flush_subnormals ? "flush" : "keep";
  app.add_option("--fp16-subnormals", subnormals,
                 "CPU float16 emulation: keep IEEE subnormals (CUDA) or flush them (Metal)")
      ->check(CLI::IsMember({"flush", "keep"}))
      ->capture_default_str();
  app.add_option("--eval-batches", c.eval_batches, "Validation batches")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--limit-bytes", o.limit_bytes, "Use only the corpus's first N bytes (0: all)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--init-scale", c.init_scale, "GradScaler's initial loss scale")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--growth-interval", c.growth_interval,
                 "GradScaler: clean steps before the scale doubles")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", c.seed, "Seed of the initial weights and of every step's batch")
      ->capture_default_str();
  app.add_option("-o,--out", o.out_dir, "Output folder for lm_log.csv and lm_curves.png")
      ->capture_default_str();
  app.add_flag("!--no-progress", o.progress, "No progress bar");
  app.add_flag("!--no-plot", o.plot, "No PNG plot (gnuplot is then not needed)");
  app.add_option("--threads", o.threads, "CPU threads for LibTorch (0: its default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmp->excludes(prec);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    exit_code = app.exit(e);
    return std::nullopt;
  }
  c.precision = apps::parse_precision(precision);
  c.flush_subnormals = subnormals == "flush";
  o.modes.clear();
  for (const auto& m : modes) o.modes.push_back(apps::parse_precision(m));
  exit_code = 0;
  return o;
}

std::vector<LmResult> run_lm_app(const LmOptions& o) {
  if (o.threads > 0) at::set_num_threads(o.threads);
  apps::ensure_writable_dir(o.out_dir);
  if (o.plot) {
    TORCH_CHECK(!apps::find_gnuplot().empty(), "gnuplot not found on PATH: the loss plot "
                "needs it. Install it with `apt-get install gnuplot-nox`, or pass --no-plot.");
  }
  const ByteCorpus corpus = load_fortunes(o.corpus_dir, 0.05, o.limit_bytes);
  const auto& s = o.config.shape;
  std::printf("fortunes from %s: %lld files, %lld quotations, %lld training bytes, %lld "
              "validation bytes\n",
              o.corpus_dir.c_str(), static_cast<long long>(corpus.files),
              static_cast<long long>(corpus.quotations),
              static_cast<long long>(corpus.train.numel()),
              static_cast<long long>(corpus.val.numel()));
  std::printf("device %s, %d threads; GPT d=%lld, %lld layers, %lld heads, context %lld; "
              "batch %lld x %lld tokens, mean token loss; FusedAdamW lr %g wd %g; %lld steps, "
              "seed %llu%s\n",
              o.config.device.c_str(), at::get_num_threads(), static_cast<long long>(s.d_model),
              static_cast<long long>(s.layers), static_cast<long long>(s.heads),
              static_cast<long long>(s.context), static_cast<long long>(o.config.batch_size),
              static_cast<long long>(s.context), o.config.lr, o.config.weight_decay,
              static_cast<long long>(o.config.steps),
              static_cast<unsigned long long>(o.config.seed),
              o.config.device == "cpu" ? "; fp16 = float16 range emulated on the CPU"
                                       : "; fp16 = real float16 autocast");
  std::fflush(stdout);

  const auto modes = o.compare ? o.modes : std::vector<apps::Precision>{o.config.precision};
  std::vector<LmResult> results;
  std::vector<apps::RunRecord> runs;
  for (auto p : modes) {
    LmConfig config = o.config;
    config.precision = p;
    LmTrainer t(config, corpus);
    apps::ProgressBar bar(apps::to_string(p));
    results.push_back(t.run([&](const apps::StepEvent& e) {
      if (o.progress) bar.update(e);
    }));
    bar.finish();
    runs.push_back(results.back().run);
    std::printf("%-11s validation loss %.3f -> %.3f nats/byte\n", apps::to_string(p).c_str(),
                results.back().val_loss_start, results.back().val_loss);
    std::fflush(stdout);
  }
  std::printf("\n%s", lm_results_table(results).c_str());
  char title[200];
  std::snprintf(title, sizeof title,
                "lucid-amp: byte-level GPT on fortunes, %lld steps of %lld tokens, %s",
                static_cast<long long>(o.config.steps),
                static_cast<long long>(o.config.batch_size * s.context),
                o.config.device == "cpu" ? "CPU (float16 range emulated)" : "CUDA");
  apps::write_logs(o.out_dir, "lm_log.csv", "lm_curves.png", runs, title, o.plot);
  return results;
}

int lm_main(int argc, char** argv) {
  return apps::guarded_main(argc, argv, parse_lm_cli, run_lm_app);
}

}  // namespace lm
}  // namespace lucid
