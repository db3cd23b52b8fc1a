// A decorator Backend for `flashserve bench`'s profiled pass: it forwards every op to the
// backend it wraps and, while enabled, brackets each with an OpClock (CUDA events on the GPU)
// under its op group, and counts ops. Disabled it only forwards, so the headline runs go through
// the same object at the cost of one virtual call per op. Groups: see OpGroup; `linear` on a
// weight with `vocab` rows is the lm_head.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "bench/op_clock.h"

namespace fs::bench {

class TimingBackend final : public Backend {
 public:
  TimingBackend(std::unique_ptr<Backend> inner, std::int64_t vocab)
      : inner_(std::move(inner)), clock_(make_op_clock(inner_->memory())), vocab_(vocab) {}

  void set_enabled(bool on) { enabled_ = on; }
  // Whether the inner backend can run ops dry (Backend::set_dry_ops).
  bool can_run_dry() { return inner_->set_dry_ops(false); }
  // The ops of group g run dry until cleared with nullopt, except the token picks, which the
  // decode loop reads.
  void set_dry_group(std::optional<OpGroup> g) { dry_group_ = g; }
  // The same for one op by name (a Backend method: "linear", "head_norm_rope", ...), for the
  // per-op shares of `bench --marginal-ops`.
  void set_dry_op(std::optional<std::string> op) { dry_op_ = std::move(op); }
  // While on, every op that may run dry is counted by name (a map lookup per op on the host);
  // op_counts() holds the counts since the last set_count_ops(true).
  void set_count_ops(bool on) {
    count_ops_ = on;
    if (on) op_counts_.clear();
  }
  const std::map<std::string, std::int64_t, std::less<>>& op_counts() const { return op_counts_; }
  // While on (with set_enabled), each op is also timed under its name as set_count_ops keys it
  // (a map lookup per op on the host); op_seconds() holds the seconds since the last reset.
  void set_time_ops(bool on) { time_ops_ = on; }
  std::map<std::string, double, std::less<>> op_seconds();
  // Seconds per group and ops per group since the last reset (waits for the device).
  std::array<double, kOpGroups> seconds() { return clock_->totals(); }
  const std::array<std::int64_t, kOpGroups>& calls() const { return calls_; }
  void reset() {
    clock_->reset();
    calls_ = {};
    op_keys_.clear();
  }

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
  void layer_norm(const Tensor& x, const Weight& w, const Weight& b, float eps, Tensor& y) override;
  void l2_norm(Tensor& x, std::int64_t group, float eps) override;
  void activate(Tensor& x, Activation act) override;
  void scale(Tensor& x, float s) override;
  void add(Tensor& x, const Tensor& y) override;
  void mul(Tensor& x, const Tensor& y) override;
  void mul_activated(Tensor& x, Tensor& gate, Activation act) override;
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
  // The MTP head's hidden rows in (under the embedding: both bring host values in); never dry,
  // since a dry copy would leave the head reading stale rows.
  void upload_rows(std::span<const float> values, std::int64_t cols, Tensor& out) override;
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
  void gated_block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::int64_t heads, std::int64_t kv_heads, const Tensor& picked,
                                    std::int64_t block, std::int64_t first, float scale,
                                    Tensor& gate, Activation act, Tensor& out) override;
  void block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks, std::int64_t group,
                  Tensor& out) override;
  void kpool_compress(const Tensor& keys, const Tensor& gate, const Weight& ape, std::int64_t pool,
                      std::int64_t first_row, std::int64_t pools, Tensor& out) override;
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
  // The fused decode ops: forwarded whole, so the inner backend's fused kernels are what is timed.
  void hyper_connection_read(const Tensor& h, const Weight& norm, const Weight& mix_down,
                             const Weight& mix_up, const Weight& inject, std::int64_t streams,
                             std::int64_t width, float eps, Tensor& mixed,
                             Tensor* inject_out) override;
  void gated_delta_net_in_proj(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                               const Weight& w_b, const Weight& w_a, const Weight& dt_bias,
                               const Weight& decay_rate, Tensor& qkv, Tensor& z, Tensor& beta,
                               Tensor& g) override;
  void qsa_projections(const Tensor& x, const Weight& q_w, const Weight& k_w, const Weight& v_w,
                       const Weight& index_w, const Weight& q_bias, const Weight& k_bias,
                       const Weight& v_bias, Tensor& qg, Tensor& k, Tensor& v,
                       Tensor& index_qk) override;
  void head_norm_rope(Tensor& a, const Weight& wa, Tensor* b, const Weight& wb,
                      std::int64_t head_dim, float eps, std::int64_t rotary_dim, std::int64_t first,
                      double theta) override;
  void gated_delta_net_conv(const Tensor& qkv, const Weight& conv, Tensor& tail,
                            std::int64_t key_dim, std::int64_t head_dim, Tensor& q, Tensor& k,
                            Tensor& v) override;
  void gated_delta_net_in_proj_conv(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                    const Weight& w_b, const Weight& w_a, const Weight& dt_bias,
                                    const Weight& decay_rate, const Weight& conv, Tensor& tail,
                                    Tensor& mixed, Tensor& z, Tensor& beta, Tensor& g) override;
  void gated_delta_net_core(const Tensor& mixed, const Tensor& z, const Tensor& beta,
                            const Tensor& g, std::int64_t key_heads, std::int64_t head_dim,
                            const Weight& norm, float eps, Activation act, Tensor& state,
                            Tensor& normed) override;
  void route_experts(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                     Tensor& experts, Tensor& weights) override;
  void shared_expert(const Tensor& x, const Weight& gate, const Weight& up, const Weight& down,
                     const Weight& expert_gate, Tensor& y) override;
  // The whole MoE block (routing, routed and shared experts) under the routed experts' group.
  void moe_block(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                 const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                 const Weight& shared_up, const Weight& shared_down,
                 const Weight& shared_expert_gate, Tensor& experts, Tensor& weights,
                 Tensor& y) override;
  // The sublayers' last ops with the hyper-connection write (the projection under GEMV, keyed by
  // its weight's shape as linear is; the MoE block under the routed experts).
  void linear_into_streams(const Tensor& x, const Weight& w, const StreamsWrite& out) override;
  void moe_block_into_streams(const Tensor& x, const Weight& router, std::int64_t top_k,
                              bool normalize, const Weight& gate_up, const Weight& down,
                              const Weight& shared_gate, const Weight& shared_up,
                              const Weight& shared_down, const Weight& shared_expert_gate,
                              Tensor& experts, Tensor& weights, const StreamsWrite& out) override;
  // The greedy pick on the device (counted with the lm_head it reads).
  void argmax_rows(const Tensor& x, Tensor& ids) override;
  void softmax_denominators(const Tensor& x, double temperature, Tensor& totals) override;
  void sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                   Tensor& ids) override;
  void token_probs(const Tensor& x, double temperature, std::span<const std::int32_t> ids,
                   Tensor& probs) override;
  void sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                            std::span<const double> u, Tensor& ids) override;
  void penalise_entries(Tensor& x, std::span<const EntryPenalty> entries) override;

  // Step graphs: the inner backend's, except while ops are timed (each op's clock events would
  // be recorded into the graph instead of timing it).
  bool step_graphs() const override { return !enabled_ && inner_->step_graphs(); }
  void set_step_graphs(bool on) override;
  void begin_step_graph(const StepGraphKey& key) override;
  void launch_step_graph() override;
  void discard_step_graph() override { inner_->discard_step_graph(); }
  StepGraphStats step_graph_stats() const override { return inner_->step_graph_stats(); }

 private:
  void take_inner_status() {
    if (!inner_->status().ok()) {
      fail(inner_->status());
      inner_->clear_status();
    }
  }
  // Whether op names are being read (counting, or one op dry): wrappers build details only then.
  bool keys_ops() const { return count_ops_ || time_ops_ || dry_op_.has_value(); }
  // The op's name from its wrapper's signature: "... TimingBackend::NAME(...)".
  static std::string_view op_name(const std::source_location& where) {
    std::string_view f = where.function_name();
    constexpr std::string_view kClass = "TimingBackend::";
    const auto at = f.find(kClass);
    if (at == std::string_view::npos) return f;
    f.remove_prefix(at + kClass.size());
    return f.substr(0, f.find('('));
  }
  // run, the op keyed by its weight's [rows x cols] (and whether block-scaled) for --marginal-ops
  // (the out-projections apart from the lm_head and the PLE's products).
  template <typename F>
  void run_keyed(OpGroup g, const Weight& w, F&& fn,
                 const std::source_location where = std::source_location::current()) {
    if (!keys_ops()) return run(g, std::forward<F>(fn), true, where);
    detail_ = std::to_string(w.rows()) + "x" + std::to_string(w.cols()) +
              (w.block_scaled() ? ",scaled" : "");
    run(g, std::forward<F>(fn), true, where);
    detail_.clear();
  }
  template <typename F>
  void run(OpGroup g, F&& fn, bool may_run_dry = true,
           const std::source_location where = std::source_location::current()) {
    if (failed()) return;
    bool dry = may_run_dry && dry_group_ == g;
    std::size_t key = kNoOpKey;
    if (may_run_dry && (count_ops_ || time_ops_ || dry_op_)) {
      std::string keyed;
      std::string_view name = op_name(where);
      if (!detail_.empty()) {
        keyed = std::string(name) + "[" + detail_ + "]";
        name = keyed;
      }
      if (count_ops_) {
        auto it = op_counts_.find(name);
        if (it == op_counts_.end()) it = op_counts_.emplace(std::string(name), 0).first;
        ++it->second;
      }
      dry = dry || (dry_op_ && *dry_op_ == name);
      if (time_ops_ && enabled_) {
        auto it = op_keys_.find(name);
        if (it == op_keys_.end()) it = op_keys_.emplace(std::string(name), op_keys_.size()).first;
        key = it->second;
      }
    }
    if (dry) inner_->set_dry_ops(true);
    if (enabled_) {
      ++calls_[static_cast<std::size_t>(g)];
      clock_->start();
      fn(*inner_);
      if (key != kNoOpKey) {
        clock_->stop_keyed(g, key);
      } else {
        clock_->stop(g);
      }
    } else {
      fn(*inner_);
    }
    if (dry) inner_->set_dry_ops(false);
    if (!inner_->status().ok()) {
      fail(inner_->status());
      inner_->clear_status();
    }
  }

  std::unique_ptr<Backend> inner_;
  std::unique_ptr<OpClock> clock_;
  std::int64_t vocab_;
  bool enabled_ = false;
  static constexpr std::size_t kNoOpKey = static_cast<std::size_t>(-1);
  bool time_ops_ = false;
  std::map<std::string, std::size_t, std::less<>> op_keys_;  // op name -> clock key
  std::optional<OpGroup> dry_group_;
  std::optional<std::string> dry_op_;
  bool count_ops_ = false;
  // Set by a wrapper that keys its op finer than by name (linear: by the weight's shape, so the
  // per-op shares tell the out-projections from the PLE's and the lm_head's); empty otherwise.
  std::string detail_;
  std::map<std::string, std::int64_t, std::less<>> op_counts_;
  std::array<std::int64_t, kOpGroups> calls_{};
};

}  // namespace fs::bench
