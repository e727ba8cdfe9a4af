// SPDX-License-Identifier: BSD-3-Clause
#pragma once

// What a program's finished runs leave behind: the CSV step log and the PNG plot
// (gnuplot), and the checks that make an unwritable output path fail before training
// rather than after.

#include <string>
#include <vector>

#include "run_record.h"

namespace lucid {
namespace apps {

/// Creates `dir` (and parents) if needed and proves a file can be created in it;
/// c10::Error naming the directory and the system's reason otherwise.
void ensure_writable_dir(const std::string& dir);
/// Proves `path` can be written (its directory exists and takes a new file) without
/// leaving anything behind; c10::Error otherwise.
void ensure_writable_file(const std::string& path);

/// Writes the step log of every run, one row per step:
/// precision,step,loss,loss_avg,scale,skipped,overflow (skipped: steps skipped so far;
/// overflow: 1 if this step was skipped; loss_avg: mean of the last 20 losses).
void write_csv(const std::string& path, const std::vector<RunRecord>& runs);

/// The gnuplot program on PATH, or "" if there is none.
std::string find_gnuplot();
/// Writes the gnuplot script that plot_png runs (beside `png_path`, extension .gp) and
/// returns its path; a machine without gnuplot (the GPU machine) leaves it for another
/// to run. c10::Error if it cannot be written.
std::string write_plot_script(const std::string& csv_path, const std::string& png_path,
                              const std::vector<RunRecord>& runs, const std::string& title);
/// Writes a gnuplot script beside `png_path` and runs gnuplot on it: loss curves of all
/// runs above, the loss scale (log2 axis, overflows marked) below. c10::Error if gnuplot
/// is missing (naming the package) or fails.
void plot_png(const std::string& csv_path, const std::string& png_path,
              const std::vector<RunRecord>& runs, const std::string& title);

/// A program's outputs after its runs: the step log `csv_name` and the plot `png_name` in
/// `out_dir` (with `plot` false, or on a machine without gnuplot, only the plot's script),
/// printing where each went. c10::Error as write_csv and plot_png.
void write_logs(const std::string& out_dir, const std::string& csv_name,
                const std::string& png_name, const std::vector<RunRecord>& runs,
                const std::string& title, bool plot);

}  // namespace apps
}  // namespace lucid
