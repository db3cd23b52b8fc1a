#include "bench/timing_backend.h"

namespace fs::bench {

std::map<std::string, double, std::less<>> TimingBackend::op_seconds() {
  const auto seconds = clock_->key_totals();
  std::map<std::string, double, std::less<>> out;
  for (const auto& [name, key] : op_keys_)
    if (key < seconds.size()) out[name] = seconds[key];
  return out;
}

void TimingBackend::linear(const Tensor& x, const Weight& w, Tensor& y) {
  const auto g = w.rows() == vocab_ ? OpGroup::kLmHead : OpGroup::kLinear;
  run_keyed(g, w, [&](Backend& be) { be.linear(x, w, y); });
}
void TimingBackend::linear_into_streams(const Tensor& x, const Weight& w, const StreamsWrite& out) {
  run_keyed(OpGroup::kLinear, w, [&](Backend& be) { be.linear_into_streams(x, w, out); });
}
void TimingBackend::add_bias(Tensor& y, const Weight& bias) {
  run(OpGroup::kLinear, [&](Backend& be) { be.add_bias(y, bias); });
}
void TimingBackend::rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps,
                             bool unit_offset, Tensor& y) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.rms_norm(x, w, group, eps, unit_offset, y); });
}
void TimingBackend::rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate, float eps,
                                   Activation act, Tensor& y) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.rms_norm_gated(x, w, gate, eps, act, y); });
}
void TimingBackend::layer_norm(const Tensor& x, const Weight& w, const Weight& b, float eps,
                               Tensor& y) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.layer_norm(x, w, b, eps, y); });
}
void TimingBackend::l2_norm(Tensor& x, std::int64_t group, float eps) {
  run(OpGroup::kGdn, [&](Backend& be) { be.l2_norm(x, group, eps); });
}
void TimingBackend::activate(Tensor& x, Activation act) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.activate(x, act); });
}
void TimingBackend::scale(Tensor& x, float s) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.scale(x, s); });
}
void TimingBackend::add(Tensor& x, const Tensor& y) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.add(x, y); });
}
void TimingBackend::mul(Tensor& x, const Tensor& y) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.mul(x, y); });
}
void TimingBackend::mul_activated(Tensor& x, Tensor& gate, Activation act) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.mul_activated(x, gate, act); });
}
void TimingBackend::mul_cols(Tensor& x, const Weight& v) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.mul_cols(x, v); });
}
void TimingBackend::mul_rows(Tensor& x, const Tensor& s) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.mul_rows(x, s); });
}
void TimingBackend::swiglu(const Tensor& gate, const Tensor& up, Tensor& out) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.swiglu(gate, up, out); });
}
void TimingBackend::swiglu_packed(const Tensor& gu, Tensor& out) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.swiglu_packed(gu, out); });
}
void TimingBackend::signed_sqrt(Tensor& x, float floor) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.signed_sqrt(x, floor); });
}
void TimingBackend::normalize_rows(Tensor& x) {
  run(OpGroup::kExperts, [&](Backend& be) { be.normalize_rows(x); });
}
void TimingBackend::slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width,
                               Tensor& out) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.slice_cols(x, begin, width, out); });
}
void TimingBackend::slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count,
                               Tensor& out) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.slice_rows(x, begin, count, out); });
}
void TimingBackend::split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim,
                                      Tensor& a, Tensor& b) {
  run(OpGroup::kElementwise, [&](Backend& be) { be.split_interleaved(x, heads, dim, a, b); });
}
void TimingBackend::repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.repeat_cols(x, times, out); });
}
void TimingBackend::append_rows(Tensor& cache, const Tensor& x) {
  run(OpGroup::kAttention, [&](Backend& be) { be.append_rows(cache, x); });
}
void TimingBackend::embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                              Tensor& out) {
  run(OpGroup::kEmbedding, [&](Backend& be) { be.embedding(shards, ids, out); });
}
void TimingBackend::upload_rows(std::span<const float> values, std::int64_t cols, Tensor& out) {
  run(
      OpGroup::kEmbedding, [&](Backend& be) { be.upload_rows(values, cols, out); },
      /*may_run_dry=*/false);
}
void TimingBackend::stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.stream_mean(x, streams, out); });
}
void TimingBackend::add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.add_scaled_streams(h, y, w); });
}
void TimingBackend::grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.grouped_dot(a, b, group, out); });
}
void TimingBackend::stream_mix(const Tensor& xn, const Tensor& u, const Weight& up,
                               std::int64_t streams, Tensor& out) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.stream_mix(xn, u, up, streams, out); });
}
void TimingBackend::rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim,
                         std::int64_t first, std::int64_t stride, double theta) {
  run(OpGroup::kAttention,
      [&](Backend& be) { be.rope(x, head_dim, rotary_dim, first, stride, theta); });
}
void TimingBackend::causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation,
                                  Tensor& tail, Tensor& y) {
  run(OpGroup::kGdn, [&](Backend& be) { be.causal_conv1d(x, w, dilation, tail, y); });
}
void TimingBackend::gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const Tensor& g, const Tensor& beta,
                                             std::int64_t key_heads, Tensor& state, Tensor& out) {
  run(OpGroup::kGdn,
      [&](Backend& be) { be.gated_delta_rule_chunked(q, k, v, g, beta, key_heads, state, out); });
}
void TimingBackend::gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& g, const Tensor& beta,
                                               std::int64_t key_heads, Tensor& state, Tensor& out,
                                               Tensor& states) {
  run(OpGroup::kGdn, [&](Backend& be) {
    be.gated_delta_rule_positions(q, k, v, g, beta, key_heads, state, out, states);
  });
}
void TimingBackend::gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                               const Tensor& g, const Tensor& beta,
                                               std::int64_t key_heads, Tensor& state, Tensor& out) {
  run(OpGroup::kGdn,
      [&](Backend& be) { be.gated_delta_rule_recurrent(q, k, v, g, beta, key_heads, state, out); });
}
void TimingBackend::block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           std::int64_t heads, std::int64_t kv_heads,
                                           const Tensor& picked, std::int64_t block,
                                           std::int64_t first, float scale, Tensor& out) {
  run(OpGroup::kAttention, [&](Backend& b) {
    b.block_sparse_attention(q, k, v, heads, kv_heads, picked, block, first, scale, out);
  });
}
void TimingBackend::gated_block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                 std::int64_t heads, std::int64_t kv_heads,
                                                 const Tensor& picked, std::int64_t block,
                                                 std::int64_t first, float scale, Tensor& gate,
                                                 Activation act, Tensor& out) {
  run(OpGroup::kAttention, [&](Backend& b) {
    b.gated_block_sparse_attention(q, k, v, heads, kv_heads, picked, block, first, scale, gate, act,
                                   out);
  });
}
void TimingBackend::block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks,
                               std::int64_t group, Tensor& out) {
  run(OpGroup::kAttention, [&](Backend& be) { be.block_mean(x, first_row, blocks, group, out); });
}
void TimingBackend::kpool_compress(const Tensor& keys, const Tensor& gate, const Weight& ape,
                                   std::int64_t pool, std::int64_t first_row, std::int64_t pools,
                                   Tensor& out) {
  run(OpGroup::kAttention,
      [&](Backend& be) { be.kpool_compress(keys, gate, ape, pool, first_row, pools, out); });
}
void TimingBackend::index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads,
                                 float scale, Tensor& out) {
  run(OpGroup::kAttention, [&](Backend& be) { be.index_scores(q, keys, heads, scale, out); });
}
void TimingBackend::softmax(Tensor& x) {
  run(OpGroup::kExperts, [&](Backend& be) { be.softmax(x); });
}
void TimingBackend::topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val) {
  run(OpGroup::kExperts, [&](Backend& be) { be.topk(x, k, idx, val); });
}
void TimingBackend::select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block,
                                  std::int64_t top, Tensor& picked) {
  run(OpGroup::kAttention,
      [&](Backend& be) { be.select_blocks(scores, first, block, top, picked); });
}
void TimingBackend::hyper_connection_read(const Tensor& h, const Weight& norm,
                                          const Weight& mix_down, const Weight& mix_up,
                                          const Weight& inject, std::int64_t streams,
                                          std::int64_t width, float eps, Tensor& mixed,
                                          Tensor* inject_out) {
  run(OpGroup::kNormsHc, [&](Backend& be) {
    be.hyper_connection_read(h, norm, mix_down, mix_up, inject, streams, width, eps, mixed,
                             inject_out);
  });
}
void TimingBackend::gated_delta_net_in_proj(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                            const Weight& w_b, const Weight& w_a,
                                            const Weight& dt_bias, const Weight& decay_rate,
                                            Tensor& qkv, Tensor& z, Tensor& beta, Tensor& g) {
  run(OpGroup::kLinear, [&](Backend& be) {
    be.gated_delta_net_in_proj(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, qkv, z, beta, g);
  });
}
void TimingBackend::qsa_projections(const Tensor& x, const Weight& q_w, const Weight& k_w,
                                    const Weight& v_w, const Weight& index_w, const Weight& q_bias,
                                    const Weight& k_bias, const Weight& v_bias, Tensor& qg,
                                    Tensor& k, Tensor& v, Tensor& index_qk) {
  run(OpGroup::kLinear, [&](Backend& be) {
    be.qsa_projections(x, q_w, k_w, v_w, index_w, q_bias, k_bias, v_bias, qg, k, v, index_qk);
  });
}
void TimingBackend::head_norm_rope(Tensor& a, const Weight& wa, Tensor* b, const Weight& wb,
                                   std::int64_t head_dim, float eps, std::int64_t rotary_dim,
                                   std::int64_t first, double theta) {
  // With RoPE (the attention group), as the QSA layer's norms and RoPE it replaces were split.
  run(OpGroup::kAttention, [&](Backend& be) {
    be.head_norm_rope(a, wa, b, wb, head_dim, eps, rotary_dim, first, theta);
  });
}
void TimingBackend::gated_delta_net_conv(const Tensor& qkv, const Weight& conv, Tensor& tail,
                                         std::int64_t key_dim, std::int64_t head_dim, Tensor& q,
                                         Tensor& k, Tensor& v) {
  run(OpGroup::kGdn,
      [&](Backend& be) { be.gated_delta_net_conv(qkv, conv, tail, key_dim, head_dim, q, k, v); });
}
void TimingBackend::gated_delta_net_in_proj_conv(const Tensor& x, const Weight& w_qkv,
                                                 const Weight& w_z, const Weight& w_b,
                                                 const Weight& w_a, const Weight& dt_bias,
                                                 const Weight& decay_rate, const Weight& conv,
                                                 Tensor& tail, Tensor& mixed, Tensor& z,
                                                 Tensor& beta, Tensor& g) {
  // With the products (kLinear), as gated_delta_net_in_proj: the conv is its epilogue on a GPU.
  run(OpGroup::kLinear, [&](Backend& be) {
    be.gated_delta_net_in_proj_conv(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, conv, tail, mixed,
                                    z, beta, g);
  });
}
void TimingBackend::gated_delta_net_core(const Tensor& mixed, const Tensor& z, const Tensor& beta,
                                         const Tensor& g, std::int64_t key_heads,
                                         std::int64_t head_dim, const Weight& norm, float eps,
                                         Activation act, Tensor& state, Tensor& normed) {
  run(OpGroup::kGdn, [&](Backend& be) {
    be.gated_delta_net_core(mixed, z, beta, g, key_heads, head_dim, norm, eps, act, state, normed);
  });
}
void TimingBackend::route_experts(const Tensor& x, const Weight& router, std::int64_t top_k,
                                  bool normalize, Tensor& experts, Tensor& weights) {
  run(OpGroup::kExperts,
      [&](Backend& be) { be.route_experts(x, router, top_k, normalize, experts, weights); });
}
void TimingBackend::shared_expert(const Tensor& x, const Weight& gate, const Weight& up,
                                  const Weight& down, const Weight& expert_gate, Tensor& y) {
  run(OpGroup::kLinear, [&](Backend& be) { be.shared_expert(x, gate, up, down, expert_gate, y); });
}
void TimingBackend::moe_block(const Tensor& x, const Weight& router, std::int64_t top_k,
                              bool normalize, const Weight& gate_up, const Weight& down,
                              const Weight& shared_gate, const Weight& shared_up,
                              const Weight& shared_down, const Weight& shared_expert_gate,
                              Tensor& experts, Tensor& weights, Tensor& y) {
  run(OpGroup::kExperts, [&](Backend& be) {
    be.moe_block(x, router, top_k, normalize, gate_up, down, shared_gate, shared_up, shared_down,
                 shared_expert_gate, experts, weights, y);
  });
}
void TimingBackend::moe_block_into_streams(const Tensor& x, const Weight& router,
                                           std::int64_t top_k, bool normalize,
                                           const Weight& gate_up, const Weight& down,
                                           const Weight& shared_gate, const Weight& shared_up,
                                           const Weight& shared_down,
                                           const Weight& shared_expert_gate, Tensor& experts,
                                           Tensor& weights, const StreamsWrite& out) {
  run(OpGroup::kExperts, [&](Backend& be) {
    be.moe_block_into_streams(x, router, top_k, normalize, gate_up, down, shared_gate, shared_up,
                              shared_down, shared_expert_gate, experts, weights, out);
  });
}
void TimingBackend::moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                                const Tensor& experts, const Tensor& weights, float swiglu_limit,
                                Tensor& y) {
  run(OpGroup::kExperts,
      [&](Backend& be) { be.moe_experts(x, gate_up, down, experts, weights, swiglu_limit, y); });
}
void TimingBackend::select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                                   const Tensor* token_ids, std::int64_t groups,
                                   std::int64_t top_groups, std::int64_t k, bool normalize,
                                   float scaling, Tensor& experts, Tensor& weights) {
  run(OpGroup::kExperts, [&](Backend& be) {
    be.select_experts(scores, bias, table, token_ids, groups, top_groups, k, normalize, scaling,
                      experts, weights);
  });
}
void TimingBackend::clamp(Tensor& x, float lo, float hi) {
  run(OpGroup::kLinear, [&](Backend& be) { be.clamp(x, lo, hi); });
}
void TimingBackend::mhc_weights(const Tensor& h, const Tensor& m, const Weight& base,
                                const Weight& scale, std::int64_t streams, float norm_eps,
                                float hc_eps, std::int64_t sinkhorn_iters, Tensor& pre,
                                Tensor* post, Tensor* comb) {
  run(OpGroup::kNormsHc, [&](Backend& be) {
    be.mhc_weights(h, m, base, scale, streams, norm_eps, hc_eps, sinkhorn_iters, pre, post, comb);
  });
}
void TimingBackend::weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.weighted_stream_sum(x, w, out); });
}
void TimingBackend::mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb) {
  run(OpGroup::kNormsHc, [&](Backend& be) { be.mhc_expand(h, y, post, comb); });
}

void TimingBackend::argmax_rows(const Tensor& x, Tensor& ids) {
  run(
      OpGroup::kLmHead, [&](Backend& be) { be.argmax_rows(x, ids); }, /*may_run_dry=*/false);
}
void TimingBackend::softmax_denominators(const Tensor& x, double temperature, Tensor& totals) {
  run(
      OpGroup::kLmHead, [&](Backend& be) { be.softmax_denominators(x, temperature, totals); },
      /*may_run_dry=*/false);
}
void TimingBackend::sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                                Tensor& ids) {
  run(
      OpGroup::kLmHead, [&](Backend& be) { be.sample_rows(x, temperature, u, ids); },
      /*may_run_dry=*/false);
}
void TimingBackend::token_probs(const Tensor& x, double temperature,
                                std::span<const std::int32_t> ids, Tensor& probs) {
  run(
      OpGroup::kLmHead, [&](Backend& be) { be.token_probs(x, temperature, ids, probs); },
      /*may_run_dry=*/false);
}
void TimingBackend::sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                                         std::span<const double> u, Tensor& ids) {
  run(
      OpGroup::kLmHead, [&](Backend& be) { be.sample_residual_rows(p, q, temperature, u, ids); },
      /*may_run_dry=*/false);
}
void TimingBackend::penalise_entries(Tensor& x, std::span<const EntryPenalty> entries) {
  run(
      OpGroup::kLmHead, [&](Backend& be) { be.penalise_entries(x, entries); },
      /*may_run_dry=*/false);
}

void TimingBackend::set_step_graphs(bool on) {
  inner_->set_step_graphs(on);
  take_inner_status();
}

void TimingBackend::begin_step_graph(const StepGraphKey& key) {
  if (failed()) return;
  inner_->begin_step_graph(key);
  take_inner_status();
}

void TimingBackend::launch_step_graph() {
  // The inner backend's failures were moved here by each op; after one, the recording holds a
  // partial step, which must not run.
  if (failed()) {
    inner_->discard_step_graph();
    return;
  }
  inner_->launch_step_graph();
  take_inner_status();
}

}  // namespace fs::bench
