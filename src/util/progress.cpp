#include "util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace fs {
namespace {

std::string amount(std::uint64_t bytes, bool gb) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (gb ? 1e9 : 1e6));
  return buf;
}

std::string duration(double s) {
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%.0f s", std::ceil(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60,
                  static_cast<int>(s) % 60);
  else
    std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600,
                  static_cast<int>(s) / 60 % 60);
  return buf;
}

std::string rate(std::uint64_t bytes, double seconds) {
  char buf[32];
  const double r = static_cast<double>(bytes) / seconds;
  if (r >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB/s", r / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.1f MB/s", r / 1e6);
  return buf;
}

}  // namespace

std::string progress_line(const std::string& label, std::uint64_t done, std::uint64_t total,
                          double seconds) {
  const bool gb = total >= 1'000'000'000;
  std::string line =
      label + ": " + amount(done, gb) + " / " + amount(total, gb) + (gb ? " GB" : " MB");
  if (seconds > 0 && done > 0) {
    line += "  " + rate(done, seconds);
    if (done < total) {
      const double left = static_cast<double>(total - done) / (static_cast<double>(done) / seconds);
      line += "  " + duration(left) + " left";
    }
  }
  return line;
}

std::string progress_done_line(const std::string& label, std::uint64_t total, double seconds) {
  const bool gb = total >= 1'000'000'000;
  std::string line = label + ": " + amount(total, gb) + (gb ? " GB" : " MB") + " in ";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  line += buf;
  if (seconds > 0) line += " (" + rate(total, seconds) + ")";
  return line;
}

ProgressMeter::ProgressMeter(std::string label, std::uint64_t total, std::FILE* out, bool force)
    : label_(std::move(label)),
      total_(total),
      out_(out),
      active_(out != nullptr && (force || isatty(fileno(out)) == 1)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  if (active_) draw(progress_line(label_, 0, total_, 0));
}

ProgressMeter::~ProgressMeter() {
  finish();
}

double ProgressMeter::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ProgressMeter::draw(const std::string& line) {
  // Pad over a longer previous line; \r returns to the start of the same line.
  const auto pad = last_width_ > line.size() ? last_width_ - line.size() : 0;
  std::fprintf(out_, "\r%s%*s", line.c_str(), static_cast<int>(pad), "");
  std::fflush(out_);
  last_width_ = line.size();
}

void ProgressMeter::add(std::uint64_t bytes) {
  done_ = std::min(total_, done_ + bytes);
  if (!active_ || finished_) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ < std::chrono::milliseconds(100) && done_ < total_) return;
  last_draw_ = now;
  draw(progress_line(label_, done_, total_, elapsed()));
}

void ProgressMeter::finish(bool ok) {
  if (!active_ || finished_) return;
  finished_ = true;
  if (ok) {
    draw(progress_done_line(label_, total_, elapsed()));
    std::fputc('\n', out_);
  } else {
    draw("");
    std::fputc('\r', out_);
  }
  std::fflush(out_);
}

}  // namespace fs
