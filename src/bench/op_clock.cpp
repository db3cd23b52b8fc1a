#include "bench/op_clock.h"

#include <chrono>

namespace fs::bench {
namespace {

class WallClock final : public OpClock {
 public:
  void start() override { t0_ = std::chrono::steady_clock::now(); }
  void stop(OpGroup g) override {
    totals_[static_cast<std::size_t>(g)] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  void stop_keyed(OpGroup g, std::size_t key) override {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    totals_[static_cast<std::size_t>(g)] += s;
    if (keys_.size() <= key) keys_.resize(key + 1, 0.0);
    keys_[key] += s;
  }
  std::array<double, kOpGroups> totals() override { return totals_; }
  std::vector<double> key_totals() override { return keys_; }
  void reset() override {
    totals_ = {};
    keys_.clear();
  }

 private:
  std::chrono::steady_clock::time_point t0_;
  std::array<double, kOpGroups> totals_{};
  std::vector<double> keys_;
};

}  // namespace

const char* op_group_name(OpGroup g) {
  switch (g) {
    case OpGroup::kLinear:
      return "gemv_linear";
    case OpGroup::kExperts:
      return "routed_experts";
    case OpGroup::kGdn:
      return "gdn";
    case OpGroup::kAttention:
      return "attention_indexer";
    case OpGroup::kNormsHc:
      return "norms_hyper_connections";
    case OpGroup::kLmHead:
      return "lm_head";
    case OpGroup::kEmbedding:
      return "embedding_ple";
    case OpGroup::kElementwise:
      return "elementwise_layout";
    case OpGroup::kCount:
      break;
  }
  return "?";
}

std::unique_ptr<OpClock> make_op_clock(const std::shared_ptr<Memory>& memory) {
#if FLASHSERVE_HAVE_CUDA
  if (memory->device() == Device::kCuda) return make_cuda_op_clock(memory);
#else
  (void)memory;
#endif
  return std::make_unique<WallClock>();
}

}  // namespace fs::bench
