// The watchdog kills a command that runs too long or grows too large, whole process group
// included, and reports why as JSON.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test_support.h"

namespace fs {
namespace {

// Processes of group `pgid` that are not zombies, from /proc/PID/stat.
int live_processes_in_group(int pgid) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const auto name = entry.path().filename().string();
    if (name.empty() || name[0] < '0' || name[0] > '9') continue;
    std::ifstream in(entry.path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != "Z" && state != "X") ++n;
  }
  return n;
}

struct Outcome {
  int rc = 0;
  nlohmann::json report;
};

Outcome watch(const std::string& args) {
  test::ScratchDir dir;
  const auto report = dir.file("report.json");
  std::string out;
  Outcome o;
  o.rc = test::run_command(test::watchdog_binary() + " --report " + report + " " + args, &out);
  const auto bytes = test::read_bytes(report);
  o.report = nlohmann::json::parse(std::string(bytes.begin(), bytes.end()));
  return o;
}

TEST(Watchdog, PassesThroughExitCode) {
  const auto o = watch("-- sh -c 'exit 7'");
  EXPECT_EQ(o.rc, 7);
  EXPECT_EQ(o.report["reason"], "exited");
  EXPECT_EQ(o.report["exit_code"], 7);
}

TEST(Watchdog, KillsOnTimeoutWithTheWholeGroup) {
  // The shell's background child must die too.
  const auto o = watch("--timeout-s 0.5 -- sh -c 'sleep 30 & sleep 30'");
  EXPECT_EQ(o.rc, 124);
  EXPECT_EQ(o.report["reason"], "timeout");
  EXPECT_LT(o.report["wall_s"].get<double>(), 10.0);
  const int pgid = o.report["pgid"];
  // SIGKILL is delivered asynchronously; killed processes may linger as zombies until reaped.
  int alive = live_processes_in_group(pgid);
  for (int i = 0; i < 100 && alive > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    alive = live_processes_in_group(pgid);
  }
  EXPECT_EQ(alive, 0);
}

TEST(Watchdog, KillsOnMemoryAndReportsPeak) {
  // tail keeps the whole last "line" (here 2 GB without a newline) in memory.
  const auto o = watch(
      "--max-rss-mb 200 --timeout-s 60 -- sh -c 'head -c 2000000000 /dev/zero | tail -c 1000000000 "
      ">/dev/null'");
  EXPECT_EQ(o.rc, 137);
  EXPECT_EQ(o.report["reason"], "memory");
  EXPECT_GT(o.report["peak_rss_mb"].get<double>(), 200.0);
}

TEST(Watchdog, ReportsSignals) {
  const auto o = watch("-- sh -c 'kill -TERM $$'");
  EXPECT_EQ(o.report["reason"], "signaled");
  EXPECT_EQ(o.report["signal"], SIGTERM);
  EXPECT_EQ(o.rc, 128 + SIGTERM);
}

}  // namespace
}  // namespace fs
