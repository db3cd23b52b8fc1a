// The chain trace's host side (chain_trace.h): the translation units' setters, the device
// buffer, the launch log.
// nvcc reports every discarded [[nodiscard]] class value (as in cuda_backend.h).
#pragma nv_diag_suppress 2810

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

std::vector<ChainTraceSetter>& setters() {
  static std::vector<ChainTraceSetter> s;  // filled by static initialisers, before main
  return s;
}

struct TraceState {
  std::mutex mutex;
  ChainTraceRecord* records = nullptr;
  unsigned long long* count = nullptr;
  std::size_t capacity = 0;
  std::atomic<bool> log_on{false};
  struct Logged {
    const void* kernel;
    std::uint32_t blocks, threads;
  };
  std::vector<Logged> launches;  // named when asked for (a bench logs ~10^5 launches)
};
TraceState& state() {
  static TraceState s;
  return s;
}

Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok_status();
  return internal_error(std::string("chain trace: ") + what + ": " + cudaGetErrorString(e));
}

Status set_all(const ChainTraceSink& sink) {
  for (const auto set : setters())
    if (auto st = cuda_status(set(sink), "cudaMemcpyToSymbol"); !st.ok()) return st;
  return Status::ok_status();
}

void free_buffers(TraceState& s) {
  cudaFree(s.records);
  cudaFree(s.count);
  s.records = nullptr;
  s.count = nullptr;
  s.capacity = 0;
}

std::string demangled(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(
      abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

}  // namespace

bool register_chain_trace_setter(ChainTraceSetter set) {
  setters().push_back(set);
  return true;
}

bool chain_trace_built() {
  return kChainTrace;
}

Status chain_trace_begin(std::size_t capacity) {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (!kChainTrace)
    return failed_precondition(
        "chain trace: the CUDA kernels were built without it (configure with "
        "-DFLASHSERVE_CHAIN_TRACE=ON)");
  if (s.records != nullptr) return failed_precondition("chain trace: a trace is already on");
  if (capacity == 0) return invalid_argument("chain trace: capacity 0");
  if (auto st =
          cuda_status(cudaMalloc(&s.records, capacity * sizeof(ChainTraceRecord)), "cudaMalloc");
      !st.ok())
    return st;
  if (auto st = cuda_status(cudaMalloc(&s.count, sizeof(unsigned long long)), "cudaMalloc");
      !st.ok()) {
    free_buffers(s);
    return st;
  }
  s.capacity = capacity;
  if (auto st = cuda_status(cudaMemset(s.count, 0, sizeof(unsigned long long)), "cudaMemset");
      !st.ok()) {
    free_buffers(s);
    return st;
  }
  ChainTraceSink sink;
  sink.records = s.records;
  sink.count = s.count;
  sink.capacity = capacity;
  if (auto st = set_all(sink); !st.ok()) {
    (void)set_all(ChainTraceSink{});
    free_buffers(s);
    return st;
  }
  return Status::ok_status();
}

Expected<ChainTrace> chain_trace_end() {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  if (s.records == nullptr) return failed_precondition("chain trace: no trace is on");
  ChainTrace out;
  auto st = cuda_status(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  if (st.ok()) st = set_all(ChainTraceSink{});
  if (st.ok())
    st = cuda_status(cudaMemcpy(&out.waits, s.count, sizeof out.waits, cudaMemcpyDeviceToHost),
                     "cudaMemcpy");
  if (st.ok()) {
    out.records.resize(std::min<std::uint64_t>(out.waits, s.capacity));
    st = cuda_status(
        cudaMemcpy(out.records.data(), s.records, out.records.size() * sizeof(ChainTraceRecord),
                   cudaMemcpyDeviceToHost),
        "cudaMemcpy");
  }
  free_buffers(s);
  if (!st.ok()) return st;
  return out;
}

void set_chain_launch_log(bool on) {
  state().log_on.store(on, std::memory_order_relaxed);
}
bool chain_launch_logging() {
  return state().log_on.load(std::memory_order_relaxed);
}
void log_chain_launch(const void* kernel, std::uint32_t blocks, std::uint32_t threads) {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  s.launches.push_back({kernel, blocks, threads});
}
std::size_t chain_launch_count() {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  return s.launches.size();
}
std::vector<ChainLaunch> chain_launches(std::size_t from) {
  auto& s = state();
  const std::lock_guard<std::mutex> lock(s.mutex);
  std::map<const void*, std::string> names;
  std::vector<ChainLaunch> out;
  out.reserve(s.launches.size() - std::min(from, s.launches.size()));
  for (std::size_t i = from; i < s.launches.size(); ++i) {
    const auto& l = s.launches[i];
    auto it = names.find(l.kernel);
    if (it == names.end()) {
      const char* name = nullptr;
      it = names
               .emplace(l.kernel, cudaFuncGetName(&name, l.kernel) == cudaSuccess && name != nullptr
                                      ? demangled(name)
                                      : std::string("?"))
               .first;
    }
    out.push_back({it->second, l.blocks, l.threads});
  }
  return out;
}

}  // namespace fs::cuda
