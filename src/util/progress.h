// Progress of a long byte-counted job (loading weights onto a device, convert, inspect) on a
// terminal: "loading: 12.3 / 40.1 GB  2.10 GB/s  13 s left", redrawn in place at most ten times
// a second, and a final line with the total and the rate. Silent when the stream is not a
// terminal (logs, pipes, tests), so scripted output stays exactly what it was.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace fs {

// One line of the meter: done and total in decimal GB (or MB below 1 GB), the rate, and the time
// left at that rate ("", not a guess, until a rate is known).
std::string progress_line(const std::string& label, std::uint64_t done, std::uint64_t total,
                          double seconds);
// The final line: the total, the time and the rate.
std::string progress_done_line(const std::string& label, std::uint64_t total, double seconds);

class ProgressMeter {
 public:
  // Draws on `out` only when it is a terminal (isatty) or `force` is set (tests).
  ProgressMeter(std::string label, std::uint64_t total, std::FILE* out = stderr,
                bool force = false);
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  void add(std::uint64_t bytes);
  // Draws the final line (once; the destructor calls it). `ok` false erases the meter instead:
  // a failed job's error message follows on a clean line.
  void finish(bool ok = true);
  bool active() const { return active_; }

 private:
  double elapsed() const;
  void draw(const std::string& line);

  std::string label_;
  std::uint64_t total_ = 0, done_ = 0;
  std::FILE* out_ = nullptr;
  bool active_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::size_t last_width_ = 0;
};

}  // namespace fs
