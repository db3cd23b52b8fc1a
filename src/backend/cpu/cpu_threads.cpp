// The CPU backend's thread pool: hardware_concurrency - 1 workers that live as long as the
// process, plus the calling thread. Starting threads per op cost more than small ops do, and
// a pool that sleeps between ops leaves the cores to OpenBLAS and to other processes.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace fs {
namespace {

// Set on the pool's workers and on a caller while its job runs, so that a parallel-for inside a
// job runs inline instead of waiting for itself.
thread_local bool t_in_pool = false;

class ThreadPool {
 public:
  ThreadPool() {
    const auto hw = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned i = 1; i < hw; ++i) workers_.emplace_back([this] { work(); });
  }
  ~ThreadPool() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }

  std::int64_t threads() const { return static_cast<std::int64_t>(workers_.size()) + 1; }

  // fn(i) for every i in [0, n), on the workers and the caller; returns when all are done.
  // Indices are claimed one at a time, and the caller waits only for workers that claimed one:
  // on a busy machine a worker that is not scheduled in time simply leaves its share to the
  // caller. A caller that finds the pool busy (another thread's op) runs its job inline.
  void run(std::int64_t n, const std::function<void(std::int64_t)>& fn) {
    auto inline_run = [&] {
      for (std::int64_t i = 0; i < n; ++i) fn(i);
    };
    if (t_in_pool) return inline_run();
    std::unique_lock busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return inline_run();
    {
      const std::lock_guard lock(mutex_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      ++generation_;
    }
    wake_.notify_all();
    t_in_pool = true;
    drain();
    t_in_pool = false;
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void drain() {
    for (auto i = next_.fetch_add(1); i < n_; i = next_.fetch_add(1)) (*fn_)(i);
  }

  void work() {
    t_in_pool = true;
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (next_.load() >= n_) continue;  // the caller has claimed everything already
        ++active_;
      }
      drain();
      {
        const std::lock_guard lock(mutex_);
        if (--active_ == 0) done_.notify_one();
      }
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one job at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
  int active_ = 0;  // workers inside the current job
  std::uint64_t generation_ = 0;
  bool stop_ = false;
};

// Below ~1 Mflop (some 20 us on one core) waking a worker costs more than it saves.
constexpr double kMinParallelWork = 1e6;

ThreadPool& pool() {
  static ThreadPool p;
  return p;
}

}  // namespace

std::int64_t cpu_threads() {
  return pool().threads();
}

void cpu_parallel_for(std::int64_t n, double work, const std::function<void(std::int64_t)>& fn) {
  if (n <= 1 || work < kMinParallelWork || pool().threads() == 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool().run(n, fn);
}

void cpu_parallel_ranges(std::int64_t n, double work,
                         const std::function<void(std::int64_t, std::int64_t)>& fn,
                         std::int64_t per_thread) {
  const auto parts = std::min(n, work < kMinParallelWork ? 1 : per_thread * cpu_threads());
  if (parts <= 1) {
    if (n > 0) fn(0, n);
    return;
  }
  cpu_parallel_for(parts, work, [&](std::int64_t p) { fn(n * p / parts, n * (p + 1) / parts); });
}

}  // namespace fs
