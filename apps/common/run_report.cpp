// SPDX-License-Identifier: BSD-3-Clause
#include "run_report.h"

#include <c10/util/Exception.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

extern char** environ;

namespace lucid {
namespace apps {
namespace fs = std::filesystem;

void ensure_writable_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TORCH_CHECK(!ec, "cannot create output directory ", dir, ": ", ec.message(), ".");
  TORCH_CHECK(fs::is_directory(dir), "output path ", dir, " exists and is not a directory.");
  ensure_writable_file((fs::path(dir) / ".lucid_write_probe").string());
}

void ensure_writable_file(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  TORCH_CHECK(!fs::is_directory(p, ec), "cannot write ", path, ": it is a directory.");
  const bool existed = fs::exists(p, ec);
  errno = 0;
  std::FILE* f = std::fopen(path.c_str(), "ab");
  TORCH_CHECK(f != nullptr, "cannot write ", path, ": ", std::strerror(errno), ".");
  std::fclose(f);
  if (!existed) fs::remove(p, ec);
}

void write_csv(const std::string& path, const std::vector<RunRecord>& runs) {
  std::ofstream out(path);
  TORCH_CHECK(out.good(), "cannot write ", path, ": ", std::strerror(errno), ".");
  out << "precision,step,loss,loss_avg,scale,skipped,overflow\n";
  for (const auto& r : runs) {
    const std::string name = to_string(r.precision);
    double window = 0;
    int64_t prev_skipped = 0;
    for (size_t i = 0; i < r.log.size(); ++i) {
      const auto& s = r.log[i];
      window += s.loss;
      if (i >= 20) window -= r.log[i - 20].loss;
      const double avg = window / static_cast<double>(std::min<size_t>(i + 1, 20));
      char line[160];
      std::snprintf(line, sizeof line, "%s,%lld,%.6g,%.6g,%.9g,%lld,%d\n", name.c_str(),
                    static_cast<long long>(s.step), s.loss, avg, s.scale,
                    static_cast<long long>(s.skipped), s.skipped > prev_skipped ? 1 : 0);
      out << line;
      prev_skipped = s.skipped;
    }
  }
  out.close();
  TORCH_CHECK(!out.fail(), "writing ", path, " failed: ", std::strerror(errno), ".");
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / "gnuplot";
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

namespace {

// gnuplot single-quoted string: only ' needs escaping (doubled).
std::string gp_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    out += c;
    if (c == '\'') out += '\'';
  }
  return out + "'";
}

// Runs that match overlap; dashes keep each one visible on top of the others.
int dash(Precision p) {
  switch (p) {
    case Precision::kFp32: return 1;
    case Precision::kFp16: return 1;
    case Precision::kFp16Scaled: return 2;
    case Precision::kBf16: return 3;
  }
  return 1;
}

const char* colour(Precision p) {
  switch (p) {
    case Precision::kFp32: return "#1f77b4";
    case Precision::kFp16: return "#d62728";
    case Precision::kFp16Scaled: return "#2ca02c";
    case Precision::kBf16: return "#9467bd";
  }
  return "black";
}

}  // namespace

std::string write_plot_script(const std::string& csv_path, const std::string& png_path,
                              const std::vector<RunRecord>& runs, const std::string& title) {
  const std::string script = (fs::path(png_path).replace_extension(".gp")).string();
  bool has_scaled = false;
  for (const auto& r : runs) has_scaled = has_scaled || uses_scaler(r.precision);
  {
    std::ofstream gp(script);
    TORCH_CHECK(gp.good(), "cannot write ", script, ": ", std::strerror(errno), ".");
    gp << "# Made by lucid-amp from " << csv_path << "; rerun: gnuplot " << script << "\n"
       << "set datafile separator ','\n"
       << "set terminal pngcairo size 1200," << (has_scaled ? 900 : 500) << " font 'sans,11'\n"
       << "set output " << gp_quote(png_path) << "\n"
       << "set multiplot layout " << (has_scaled ? 2 : 1) << ",1 title " << gp_quote(title)
       << "\n"
       << "set grid\nset key top right\nset xlabel 'step'\n"
       << "set title 'training loss (mean of the last 20 steps)'\nset ylabel 'loss'\n"
       << "plot ";
    for (size_t i = 0; i < runs.size(); ++i) {
      const std::string name = to_string(runs[i].precision);
      gp << (i ? ", \\\n     " : "") << gp_quote(csv_path) << " every ::1 using 2:(strcol(1) eq "
         << gp_quote(name) << " ? $4 : 1/0) with lines lw " << (dash(runs[i].precision) == 1 ? 3 : 2)
         << " dt " << dash(runs[i].precision) << " lc rgb '" << colour(runs[i].precision)
         << "' title " << gp_quote(name);
    }
    if (has_scaled) {
      gp << "\nset title 'loss scale (grows after each growth interval of clean steps, halves "
            "on overflow)'\nset ylabel 'scale'\nset logscale y 2\nset format y '2^{%L}'\n"
         << "plot ";
      bool first = true;
      for (const auto& r : runs) {
        if (!uses_scaler(r.precision)) continue;
        const std::string name = to_string(r.precision);
        gp << (first ? "" : ", \\\n     ") << gp_quote(csv_path)
           << " every ::1 using 2:(strcol(1) eq " << gp_quote(name)
           << " ? $5 : 1/0) with steps lw 2 lc rgb '" << colour(r.precision) << "' title "
           << gp_quote(name + " scale") << ", \\\n     " << gp_quote(csv_path)
           << " every ::1 using 2:(strcol(1) eq " << gp_quote(name)
           << " && $7 > 0 ? $5 : 1/0) with points pt 7 ps 0.8 lc rgb 'black' title "
           << gp_quote("overflow: step skipped");
        first = false;
      }
    }
    gp << "\nunset multiplot\n";
    TORCH_CHECK(gp.good(), "writing ", script, " failed.");
  }
  return script;
}

void plot_png(const std::string& csv_path, const std::string& png_path,
              const std::vector<RunRecord>& runs, const std::string& title) {
  const std::string gnuplot = find_gnuplot();
  TORCH_CHECK(!gnuplot.empty(), "gnuplot not found on PATH: install it with "
              "`apt-get install gnuplot-nox`, or pass --no-plot.");
  const std::string script = write_plot_script(csv_path, png_path, runs, title);
  pid_t pid = 0;
  std::string arg0 = gnuplot, arg1 = script;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  const int rc = posix_spawn(&pid, gnuplot.c_str(), nullptr, nullptr, argv, environ);
  TORCH_CHECK(rc == 0, "cannot start ", gnuplot, ": ", std::strerror(rc), ".");
  int status = 0;
  waitpid(pid, &status, 0);
  TORCH_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "gnuplot failed on ", script,
              " (its messages are above).");
}

void write_logs(const std::string& out_dir, const std::string& csv_name,
                const std::string& png_name, const std::vector<RunRecord>& runs,
                const std::string& title, bool plot) {
  namespace fs = std::filesystem;
  const std::string csv = (fs::path(out_dir) / csv_name).string();
  write_csv(csv, runs);
  std::printf("\nCSV log:   %s\n", fs::absolute(csv).string().c_str());
  const std::string png = (fs::path(out_dir) / png_name).string();
  if (plot) {
    plot_png(csv, png, runs, title);
    std::printf("plot:      %s\n", fs::absolute(png).string().c_str());
  } else {
    // No plot drawn (--no-plot, or no gnuplot here): the script, for another machine.
    const std::string script = write_plot_script(csv, png, runs, title);
    std::printf("plot script (not run): %s\n", fs::absolute(script).string().c_str());
  }
}

}  // namespace apps
}  // namespace lucid
