// A backend that forwards every op to another one and, per op, counts the model's floating-point
// work and the wall time spent in it; it also records the product shapes (M, N, K) the model
// asks for, so a benchmark can measure sgemm at exactly those shapes. Only for host backends
// (the index tensors it reads to count attention and expert work must be host memory).
//
// FLOPs are the model's, not an implementation's: 2*M*N*K per product, the token-by-token
// recurrence for the delta rule (whichever form computes it), the keys each query really reads
// in attention, the visible blocks in the indexer scores. Elementwise ops count 0 FLOPs (their
// time is still reported).
//
// The fused decode ops (backend.h) are deliberately not overridden: their default bodies run here,
// so each op of the sequence is forwarded, counted and timed on its own (with its product shapes),
// and the inner host backend computes exactly what the fused op would.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "backend/backend.h"

namespace fs::bench {

struct OpStats {
  double flops = 0;
  double seconds = 0;      // wall clock
  double cpu_seconds = 0;  // the process's CPU time (all threads) meanwhile
  std::int64_t calls = 0;
};

// CPU time of the whole process (all threads), in seconds.
double process_cpu_seconds();

class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // Per op name; reset() clears them (shapes too).
  const std::map<std::string, OpStats>& ops() const { return ops_; }
  // (M, N, K) of every product -> how many FLOPs were done at that shape.
  const std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, double>& gemm_shapes()
      const {
    return shapes_;
  }
  // `linear` per weight shape (out, in).
  const std::map<std::pair<std::int64_t, std::int64_t>, OpStats>& linear_by_weight() const {
    return linear_by_weight_;
  }
  void reset() {
    ops_.clear();
    shapes_.clear();
    linear_by_weight_.clear();
  }
  double total_flops() const;

  std::string name() const override { return inner_->name(); }
  const std::shared_ptr<Memory>& memory() const override { return inner_->memory(); }
  Expected<Weight> upload(const Weight& w, DType matrix_dtype) override {
    return inner_->upload(w, matrix_dtype);
  }
  void synchronize() override { inner_->synchronize(); }

  void linear(const Tensor& x, const Weight& w, Tensor& y) override;
  void add_bias(Tensor& y, const Weight& bias) override;
  void rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps, bool unit_offset,
                Tensor& y) override;
  void rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate, float eps,
                      Activation act, Tensor& y) override;
  void l2_norm(Tensor& x, std::int64_t group, float eps) override;
  void activate(Tensor& x, Activation act) override;
  void scale(Tensor& x, float s) override;
  void add(Tensor& x, const Tensor& y) override;
  void mul(Tensor& x, const Tensor& y) override;
  void mul_cols(Tensor& x, const Weight& v) override;
  void mul_rows(Tensor& x, const Tensor& s) override;
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void swiglu_packed(const Tensor& gu, Tensor& out) override;
  void signed_sqrt(Tensor& x, float floor) override;
  void normalize_rows(Tensor& x) override;
  void slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out) override;
  void slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count, Tensor& out) override;
  void split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim, Tensor& a,
                         Tensor& b) override;
  void repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) override;
  void append_rows(Tensor& cache, const Tensor& x) override;
  void embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                 Tensor& out) override;
  void stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) override;
  void add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) override;
  void grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) override;
  void stream_mix(const Tensor& xn, const Tensor& u, const Weight& up, std::int64_t streams,
                  Tensor& out) override;
  void rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim, std::int64_t first,
            std::int64_t stride, double theta) override;
  void causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation, Tensor& tail,
                     Tensor& y) override;
  void gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, std::int64_t key_heads, Tensor& state,
                                Tensor& out) override;
  void gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                  Tensor& state, Tensor& out, Tensor& states) override;
  void gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                  Tensor& state, Tensor& out) override;
  void block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                              std::int64_t kv_heads, const Tensor& picked, std::int64_t block,
                              std::int64_t first, float scale, Tensor& out) override;
  void block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks, std::int64_t group,
                  Tensor& out) override;
  void index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                    Tensor& out) override;
  void softmax(Tensor& x) override;
  void topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val) override;
  void select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block, std::int64_t top,
                     Tensor& picked) override;
  void moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                   const Tensor& experts, const Tensor& weights, float swiglu_limit,
                   Tensor& y) override;
  void select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                      const Tensor* token_ids, std::int64_t groups, std::int64_t top_groups,
                      std::int64_t k, bool normalize, float scaling, Tensor& experts,
                      Tensor& weights) override;
  void clamp(Tensor& x, float lo, float hi) override;
  void mhc_weights(const Tensor& h, const Tensor& m, const Weight& base, const Weight& scale,
                   std::int64_t streams, float norm_eps, float hc_eps, std::int64_t sinkhorn_iters,
                   Tensor& pre, Tensor* post, Tensor* comb) override;
  void weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) override;
  void mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb) override;

 private:
  // Runs fn on the inner backend, timing it under `op` with `flops`, and takes over its failure.
  template <typename F>
  void run(const char* op, double flops, F&& fn) {
    if (failed()) return;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    fn(*inner_);
    auto& s = ops_[op];
    s.cpu_seconds += process_cpu_seconds() - c0;
    s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.flops += flops;
    ++s.calls;
    if (!inner_->status().ok()) {
      fail(inner_->status());
      inner_->clear_status();
    }
  }
  void add_shape(std::int64_t m, std::int64_t n, std::int64_t k) {
    if (m > 0) shapes_[{m, n, k}] += 2.0 * static_cast<double>(m * n * k);
  }

  std::unique_ptr<Backend> inner_;
  std::map<std::string, OpStats> ops_;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, double> shapes_;
  std::map<std::pair<std::int64_t, std::int64_t>, OpStats> linear_by_weight_;
};

}  // namespace fs::bench
