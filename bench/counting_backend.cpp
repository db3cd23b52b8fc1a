#include "counting_backend.h"

#include <ctime>
#include <vector>

namespace fs::bench {
namespace {

double d(std::int64_t v) {
  return static_cast<double>(v);
}

}  // namespace

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double CountingBackend::total_flops() const {
  double f = 0;
  for (const auto& [name, s] : ops_) f += s.flops;
  return f;
}

void CountingBackend::linear(const Tensor& x, const Weight& w, Tensor& y) {
  add_shape(x.rows(), w.rows(), w.cols());
  const double flops = 2 * d(x.rows()) * d(w.rows()) * d(w.cols());
  const auto before = ops_["linear"];
  run("linear", flops, [&](Backend& b) { b.linear(x, w, y); });
  const auto& after = ops_["linear"];
  auto& s = linear_by_weight_[{w.rows(), w.cols()}];
  s.flops += flops;
  s.seconds += after.seconds - before.seconds;
  s.cpu_seconds += after.cpu_seconds - before.cpu_seconds;
  ++s.calls;
}
void CountingBackend::add_bias(Tensor& y, const Weight& bias) {
  run("add_bias", 0, [&](Backend& b) { b.add_bias(y, bias); });
}
void CountingBackend::rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps,
                               bool unit_offset, Tensor& y) {
  run("rms_norm", 0, [&](Backend& b) { b.rms_norm(x, w, group, eps, unit_offset, y); });
}
void CountingBackend::rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate,
                                     float eps, Activation act, Tensor& y) {
  run("rms_norm_gated", 0, [&](Backend& b) { b.rms_norm_gated(x, w, gate, eps, act, y); });
}
void CountingBackend::l2_norm(Tensor& x, std::int64_t group, float eps) {
  run("l2_norm", 0, [&](Backend& b) { b.l2_norm(x, group, eps); });
}
void CountingBackend::activate(Tensor& x, Activation act) {
  run("activate", 0, [&](Backend& b) { b.activate(x, act); });
}
void CountingBackend::scale(Tensor& x, float s) {
  run("scale", 0, [&](Backend& b) { b.scale(x, s); });
}
void CountingBackend::add(Tensor& x, const Tensor& y) {
  run("add", 0, [&](Backend& b) { b.add(x, y); });
}
void CountingBackend::mul(Tensor& x, const Tensor& y) {
  run("mul", 0, [&](Backend& b) { b.mul(x, y); });
}
void CountingBackend::mul_cols(Tensor& x, const Weight& v) {
  run("mul_cols", 0, [&](Backend& b) { b.mul_cols(x, v); });
}
void CountingBackend::mul_rows(Tensor& x, const Tensor& s) {
  run("mul_rows", 0, [&](Backend& b) { b.mul_rows(x, s); });
}
void CountingBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  run("swiglu", 0, [&](Backend& b) { b.swiglu(gate, up, out); });
}
void CountingBackend::swiglu_packed(const Tensor& gu, Tensor& out) {
  run("swiglu_packed", 0, [&](Backend& b) { b.swiglu_packed(gu, out); });
}
void CountingBackend::signed_sqrt(Tensor& x, float floor) {
  run("signed_sqrt", 0, [&](Backend& b) { b.signed_sqrt(x, floor); });
}
void CountingBackend::normalize_rows(Tensor& x) {
  run("normalize_rows", 0, [&](Backend& b) { b.normalize_rows(x); });
}
void CountingBackend::slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width,
                                 Tensor& out) {
  run("slice_cols", 0, [&](Backend& b) { b.slice_cols(x, begin, width, out); });
}
void CountingBackend::slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count,
                                 Tensor& out) {
  run("slice_rows", 0, [&](Backend& b) { b.slice_rows(x, begin, count, out); });
}
void CountingBackend::split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim,
                                        Tensor& a, Tensor& bo) {
  run("split_interleaved", 0, [&](Backend& b) { b.split_interleaved(x, heads, dim, a, bo); });
}
void CountingBackend::repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) {
  run("repeat_cols", 0, [&](Backend& b) { b.repeat_cols(x, times, out); });
}
void CountingBackend::append_rows(Tensor& cache, const Tensor& x) {
  run("append_rows", 0, [&](Backend& b) { b.append_rows(cache, x); });
}
void CountingBackend::embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                                Tensor& out) {
  run("embedding", 0, [&](Backend& b) { b.embedding(shards, ids, out); });
}
void CountingBackend::stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) {
  run("stream_mean", 0, [&](Backend& b) { b.stream_mean(x, streams, out); });
}
void CountingBackend::add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) {
  run("add_scaled_streams", 0, [&](Backend& b) { b.add_scaled_streams(h, y, w); });
}
void CountingBackend::grouped_dot(const Tensor& a, const Tensor& bt, std::int64_t group,
                                  Tensor& out) {
  run("grouped_dot", 0, [&](Backend& b) { b.grouped_dot(a, bt, group, out); });
}
void CountingBackend::stream_mix(const Tensor& xn, const Tensor& u, const Weight& up,
                                 std::int64_t streams, Tensor& out) {
  // Its product u · up^T; the rest is elementwise.
  add_shape(u.rows(), up.rows(), up.cols());
  run("stream_mix", 2 * d(u.rows()) * d(up.rows()) * d(up.cols()),
      [&](Backend& b) { b.stream_mix(xn, u, up, streams, out); });
}
void CountingBackend::rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim,
                           std::int64_t first, std::int64_t stride, double theta) {
  run("rope", 0, [&](Backend& b) { b.rope(x, head_dim, rotary_dim, first, stride, theta); });
}
void CountingBackend::causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation,
                                    Tensor& tail, Tensor& y) {
  run("causal_conv1d", 2 * d(x.numel()) * d(w.cols()),
      [&](Backend& b) { b.causal_conv1d(x, w, dilation, tail, y); });
}

namespace {

// The token-by-token recurrence per value head and token: decay (dk*dv), S^T k, the rank-1
// update and S^T q (2*dk*dv each).
double delta_rule_flops(const Tensor& k, const Tensor& v, const Tensor& g, std::int64_t key_heads) {
  const auto Hv = g.cols(), dk = k.cols() / key_heads, dv = v.cols() / Hv;
  return 7 * d(k.rows()) * d(Hv) * d(dk) * d(dv);
}

}  // namespace

void CountingBackend::gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& g, const Tensor& beta,
                                               std::int64_t key_heads, Tensor& state, Tensor& out) {
  run("gated_delta_rule", delta_rule_flops(k, v, g, key_heads),
      [&](Backend& b) { b.gated_delta_rule_chunked(q, k, v, g, beta, key_heads, state, out); });
}
void CountingBackend::gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& g, const Tensor& beta,
                                                 std::int64_t key_heads, Tensor& state, Tensor& out,
                                                 Tensor& states) {
  run("gated_delta_rule", delta_rule_flops(k, v, g, key_heads), [&](Backend& b) {
    b.gated_delta_rule_positions(q, k, v, g, beta, key_heads, state, out, states);
  });
}
void CountingBackend::gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 const Tensor& g, const Tensor& beta,
                                                 std::int64_t key_heads, Tensor& state,
                                                 Tensor& out) {
  run("gated_delta_rule", delta_rule_flops(k, v, g, key_heads),
      [&](Backend& b) { b.gated_delta_rule_recurrent(q, k, v, g, beta, key_heads, state, out); });
}

void CountingBackend::block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             std::int64_t heads, std::int64_t kv_heads,
                                             const Tensor& picked, std::int64_t block,
                                             std::int64_t first, float scale, Tensor& out) {
  // Keys read per query: its picked blocks and its tail; scores and the weighted sum are
  // 2*D each per key and head.
  const auto S = q.rows(), top = picked.cols(), D = q.cols() / heads;
  const auto* pk = picked.data_as<std::int32_t>();
  double keys = 0;
  for (std::int64_t s = 0; s < S; ++s) {
    for (std::int64_t j = 0; j < top; ++j) keys += pk[s * top + j] >= 0 ? d(block) : 0;
    keys += d((first + s) - (first + s + 1) / block * block + 1);
  }
  run("block_sparse_attention", 4 * keys * d(heads) * d(D), [&](Backend& b) {
    b.block_sparse_attention(q, k, v, heads, kv_heads, picked, block, first, scale, out);
  });
}
void CountingBackend::block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                                 std::int64_t group, Tensor& out) {
  run("block_mean", 0, [&](Backend& b) { b.block_mean(x, first_row, blocks, group, out); });
}
void CountingBackend::index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads,
                                   float scale, Tensor& out) {
  const auto B = keys.shape().empty() ? 0 : keys.rows();
  run("index_scores", 2 * d(q.rows()) * d(B) * d(q.cols()),
      [&](Backend& b) { b.index_scores(q, keys, heads, scale, out); });
}
void CountingBackend::softmax(Tensor& x) {
  run("softmax", 0, [&](Backend& b) { b.softmax(x); });
}
void CountingBackend::topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val) {
  run("topk", 0, [&](Backend& b) { b.topk(x, k, idx, val); });
}
void CountingBackend::select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block,
                                    std::int64_t top, Tensor& picked) {
  run("select_blocks", 0, [&](Backend& b) { b.select_blocks(scores, first, block, top, picked); });
}
void CountingBackend::moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                                  const Tensor& experts, const Tensor& weights, float swiglu_limit,
                                  Tensor& y) {
  // Rows routed to each expert: two products per expert at those rows.
  const auto E = gate_up.shape.at(0), H = x.cols(), I = down.shape.at(2);
  std::vector<std::int64_t> rows(static_cast<std::size_t>(E), 0);
  const auto* ids = experts.data_as<std::int32_t>();
  for (std::int64_t i = 0; i < experts.numel(); ++i)
    if (ids[i] >= 0 && ids[i] < E) ++rows[static_cast<std::size_t>(ids[i])];
  double flops = 0;
  for (const auto n : rows) {
    add_shape(n, 2 * I, H);
    add_shape(n, H, I);
    flops += 2 * d(n) * (2 * d(I) * d(H) + d(H) * d(I));
  }
  run("moe_experts", flops,
      [&](Backend& b) { b.moe_experts(x, gate_up, down, experts, weights, swiglu_limit, y); });
}
void CountingBackend::select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                                     const Tensor* token_ids, std::int64_t groups,
                                     std::int64_t top_groups, std::int64_t k, bool normalize,
                                     float scaling, Tensor& experts, Tensor& weights) {
  run("select_experts", 0, [&](Backend& b) {
    b.select_experts(scores, bias, table, token_ids, groups, top_groups, k, normalize, scaling,
                     experts, weights);
  });
}
void CountingBackend::clamp(Tensor& x, float lo, float hi) {
  run("clamp", 0, [&](Backend& b) { b.clamp(x, lo, hi); });
}
void CountingBackend::mhc_weights(const Tensor& h, const Tensor& m, const Weight& base,
                                  const Weight& scale, std::int64_t streams, float norm_eps,
                                  float hc_eps, std::int64_t sinkhorn_iters, Tensor& pre,
                                  Tensor* post, Tensor* comb) {
  run("mhc_weights", 0, [&](Backend& b) {
    b.mhc_weights(h, m, base, scale, streams, norm_eps, hc_eps, sinkhorn_iters, pre, post, comb);
  });
}
void CountingBackend::weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) {
  run("weighted_stream_sum", 0, [&](Backend& b) { b.weighted_stream_sum(x, w, out); });
}
void CountingBackend::mhc_expand(Tensor& h, const Tensor& y, const Tensor& post,
                                 const Tensor& comb) {
  run("mhc_expand", 0, [&](Backend& b) { b.mhc_expand(h, y, post, comb); });
}

}  // namespace fs::bench
