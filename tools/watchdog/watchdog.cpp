// flashserve-watchdog: runs a command under a wall-clock limit and a resident-memory limit.
//
//   flashserve-watchdog [--timeout-s S] [--max-rss-mb M] [--poll-ms P] [--report FILE] -- CMD
//   ARGS...
//
// The command runs in a process group of its own. Every poll sums the resident set of every
// process in that group (so a test that forks is measured whole); on a breach the whole group is
// killed. One JSON line goes to stderr (or --report FILE):
//   {"reason": "exited"|"signaled"|"timeout"|"memory", "exit_code", "signal", "wall_s",
//    "peak_rss_mb", "pgid"}
// Exit status: the command's own, 128+signal when it was killed by a signal, 124 on timeout,
// 137 on the memory limit, 125 when the watchdog itself could not run it.
#include <dirent.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

volatile sig_atomic_t g_forward_signal = 0;

void on_signal(int sig) {
  g_forward_signal = sig;
}

// Resident bytes of every process whose process group is `pgid`, read from /proc/PID/stat.
long long group_rss_bytes(pid_t pgid) {
  static const long page = sysconf(_SC_PAGESIZE);
  long long total = 0;
  DIR* proc = opendir("/proc");
  if (!proc) return 0;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    // The command name (field 2) may hold spaces; fields after the last ')' are fixed.
    const auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 2));
    std::string state;
    long long ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    if (pgrp != pgid) continue;
    std::string skip;
    for (int field = 6; field < 24; ++field) rest >> skip;  // fields 6..23
    long long rss_pages = 0;
    rest >> rss_pages;
    total += rss_pages * page;
  }
  closedir(proc);
  return total;
}

void usage() {
  std::fprintf(stderr,
               "usage: flashserve-watchdog [--timeout-s S] [--max-rss-mb M] [--poll-ms P] "
               "[--report FILE] -- CMD [ARGS...]\n");
}

}  // namespace

int main(int argc, char** argv) {
  double timeout_s = 0;  // 0: no limit
  double max_rss_mb = 0;
  int poll_ms = 50;
  std::string report_path;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(125);
      }
      return argv[++i];
    };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "--timeout-s") {
      timeout_s = std::atof(next());
    } else if (a == "--max-rss-mb") {
      max_rss_mb = std::atof(next());
    } else if (a == "--poll-ms") {
      poll_ms = std::max(1, std::atoi(next()));
    } else if (a == "--report") {
      report_path = next();
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "flashserve-watchdog: unknown option '%s'\n", a.c_str());
      usage();
      return 125;
    }
  }
  if (i >= argc) {
    usage();
    return 125;
  }

  const auto start = std::chrono::steady_clock::now();
  const pid_t child = fork();
  if (child < 0) {
    std::perror("flashserve-watchdog: fork");
    return 125;
  }
  if (child == 0) {
    setpgid(0, 0);
    execvp(argv[i], &argv[i]);
    std::fprintf(stderr, "flashserve-watchdog: cannot run '%s': %s\n", argv[i],
                 std::strerror(errno));
    _exit(127);
  }
  setpgid(child, child);  // also in the parent, so the group exists before the first poll
  const pid_t pgid = child;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::string reason;
  int status = 0;
  long long peak = 0;
  for (;;) {
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) break;
    peak = std::max(peak, group_rss_bytes(pgid));
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (g_forward_signal != 0) {
      kill(-pgid, g_forward_signal);
      g_forward_signal = 0;
    }
    if (timeout_s > 0 && elapsed > timeout_s) {
      reason = "timeout";
    } else if (max_rss_mb > 0 && static_cast<double>(peak) > max_rss_mb * 1024 * 1024) {
      reason = "memory";
    }
    if (!reason.empty()) {
      kill(-pgid, SIGKILL);
      waitpid(child, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  // Descendants that outlived the command go with it.
  kill(-pgid, SIGKILL);

  struct rusage ru {};
  getrusage(RUSAGE_CHILDREN, &ru);
  peak = std::max(peak, static_cast<long long>(ru.ru_maxrss) * 1024);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int exit_code = 0;
  int signal_no = 0;
  if (reason.empty()) {
    if (WIFEXITED(status)) {
      reason = "exited";
      exit_code = WEXITSTATUS(status);
    } else {
      reason = "signaled";
      signal_no = WTERMSIG(status);
      exit_code = 128 + signal_no;
    }
  } else {
    exit_code = reason == "timeout" ? 124 : 137;
    signal_no = SIGKILL;
  }
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"reason\": \"%s\", \"exit_code\": %d, \"signal\": %d, \"wall_s\": %.3f, "
                "\"peak_rss_mb\": %.1f, \"pgid\": %d}\n",
                reason.c_str(), exit_code, signal_no, wall,
                static_cast<double>(peak) / (1024.0 * 1024.0), static_cast<int>(pgid));
  if (report_path.empty()) {
    std::fputs(line, stderr);
  } else if (FILE* f = std::fopen(report_path.c_str(), "w")) {
    std::fputs(line, f);
    std::fclose(f);
  }
  return exit_code;
}
