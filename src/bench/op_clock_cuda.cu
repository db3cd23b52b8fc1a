// CUDA-event op timing: a pool of event pairs recorded on the backend's stream; when it is full
// (or totals are asked for) the stream is synchronised once and every pair's elapsed time read.
// nvcc reports every discarded [[nodiscard]] class value, assignments included (as in
// backend/cuda/cuda_backend.h); the host compiler checks the real cases.
#pragma nv_diag_suppress 2810

#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/cuda_memory.h"
#include "bench/op_clock.h"

namespace fs::bench {
namespace {

class CudaOpClock final : public OpClock {
 public:
  explicit CudaOpClock(cudaStream_t stream) : stream_(stream) {
    pairs_.resize(kPairs);
    for (auto& p : pairs_) {
      cudaEventCreate(&p.begin);
      cudaEventCreate(&p.end);
    }
  }
  ~CudaOpClock() override {
    for (auto& p : pairs_) {
      cudaEventDestroy(p.begin);
      cudaEventDestroy(p.end);
    }
  }
  CudaOpClock(const CudaOpClock&) = delete;
  CudaOpClock& operator=(const CudaOpClock&) = delete;

  void start() override {
    if (used_ == pairs_.size()) drain();
    cudaEventRecord(pairs_[used_].begin, stream_);
  }
  void stop(OpGroup g) override { stop_keyed(g, kNoKey); }
  void stop_keyed(OpGroup g, std::size_t key) override {
    auto& p = pairs_[used_++];
    p.group = g;
    p.key = key;
    cudaEventRecord(p.end, stream_);
  }
  std::array<double, kOpGroups> totals() override {
    drain();
    return totals_;
  }
  std::vector<double> key_totals() override {
    drain();
    return keys_;
  }
  void reset() override {
    drain();
    totals_ = {};
    keys_.clear();
  }

 private:
  static constexpr std::size_t kPairs = 4096;
  static constexpr std::size_t kNoKey = static_cast<std::size_t>(-1);
  struct Pair {
    cudaEvent_t begin = nullptr, end = nullptr;
    OpGroup group = OpGroup::kLinear;
    std::size_t key = kNoKey;
  };
  void drain() {
    cudaStreamSynchronize(stream_);
    for (std::size_t i = 0; i < used_; ++i) {
      float ms = 0;
      if (cudaEventElapsedTime(&ms, pairs_[i].begin, pairs_[i].end) != cudaSuccess) continue;
      totals_[static_cast<std::size_t>(pairs_[i].group)] += 1e-3 * ms;
      if (const auto k = pairs_[i].key; k != kNoKey) {
        if (keys_.size() <= k) keys_.resize(k + 1, 0.0);
        keys_[k] += 1e-3 * ms;
      }
    }
    used_ = 0;
  }

  cudaStream_t stream_;
  std::vector<Pair> pairs_;
  std::size_t used_ = 0;
  std::array<double, kOpGroups> totals_{};
  std::vector<double> keys_;
};

}  // namespace

std::unique_ptr<OpClock> make_cuda_op_clock(const std::shared_ptr<Memory>& memory) {
  auto* m = dynamic_cast<cuda::CudaMemory*>(memory.get());
  return std::make_unique<CudaOpClock>(m->stream());
}

}  // namespace fs::bench
