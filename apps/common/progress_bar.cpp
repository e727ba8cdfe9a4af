// SPDX-License-Identifier: BSD-3-Clause
#include "progress_bar.h"

#include <unistd.h>

#include <cmath>

namespace lucid {
namespace apps {
namespace {

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const long s = std::lround(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, std::FILE* out)
    : label_(std::move(label)), out_(out), tty_(isatty(fileno(out)) != 0) {}

std::string ProgressBar::render(const std::string& label, const StepEvent& e, int width) {
  const double frac = e.total_steps ? double(e.step) / double(e.total_steps) : 1.0;
  const int filled = static_cast<int>(std::lround(frac * width));
  std::string bar(static_cast<size_t>(std::max(0, filled)), '#');
  bar.resize(static_cast<size_t>(width), '.');
  // The ETA assumes the remaining steps cost what the ones so far did (resumed runs: the
  // time of the earlier part is included, and so are its steps).
  const double eta = e.step ? e.elapsed_s / double(e.step) * double(e.total_steps - e.step) : NAN;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%-11s ep %lld/%lld [%s] step %lld/%lld  loss %.4f  scale %g  skipped %lld  "
                "ETA %s",
                label.c_str(), static_cast<long long>(e.epoch + 1),
                static_cast<long long>(e.epochs), bar.c_str(), static_cast<long long>(e.step),
                static_cast<long long>(e.total_steps), e.loss, e.scale,
                static_cast<long long>(e.skipped), clock_text(eta).c_str());
  return buf;
}

void ProgressBar::update(const StepEvent& e) {
  const bool last = e.step == e.total_steps;
  if (tty_) {
    const auto now = std::chrono::steady_clock::now();
    if (!last && open_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    // \r back to the start of the line, \033[K clears what a longer line left behind.
    std::fprintf(out_, "\r%s\033[K", render(label_, e).c_str());
    open_ = true;
  } else {
    const int64_t decile = e.total_steps ? e.step * 10 / e.total_steps : 10;
    if (decile == last_decile_ && !last) return;
    last_decile_ = decile;
    std::fprintf(out_, "%s\n", render(label_, e).c_str());
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (open_) std::fprintf(out_, "\n");
  open_ = false;
  std::fflush(out_);
}

}  // namespace apps
}  // namespace lucid
