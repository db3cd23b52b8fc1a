#include "backend/backend.h"

#include <algorithm>
#include <cmath>

namespace fs {

Tensor Backend::new_tensor(Shape shape, DType dtype) {
  Tensor t(memory(), std::move(shape), dtype);
  if (!t.ok())
    fail({ErrorCode::kOutOfRange,
          name() + " backend: out of memory allocating " + std::to_string(t.bytes()) + " bytes"});
  return t;
}

bool Backend::ensure(Tensor& t, Shape shape, DType dtype) {
  const auto want = static_cast<std::size_t>(shape_numel(shape)) * dtype_size(dtype);
  if (t.allocate(memory(), std::move(shape), dtype)) return true;
  fail({ErrorCode::kOutOfRange,
        name() + " backend: out of memory allocating " + std::to_string(want) + " bytes"});
  return false;
}

void Backend::unimplemented(const char* op) {
  fail(unsupported("the " + name() + " backend does not implement the op '" + op + "'"));
}

void Backend::set_step_graphs(bool on) {
  if (on) fail(unsupported("the " + name() + " backend records no step graphs"));
}

void Backend::begin_step_graph(const StepGraphKey&) {
  fail(unsupported("the " + name() + " backend records no step graphs"));
}

void Backend::launch_step_graph() {
  fail(unsupported("the " + name() + " backend records no step graphs"));
}

// Every op defaults to a named failure, so a backend that lacks one says which (DESIGN "On the
// GPU", rule 7) instead of computing something else.
void Backend::linear(const Tensor&, const Weight&, Tensor&) {
  unimplemented("linear");
}
void Backend::add_bias(Tensor&, const Weight&) {
  unimplemented("add_bias");
}
void Backend::rms_norm(const Tensor&, const Weight&, std::int64_t, float, bool, Tensor&) {
  unimplemented("rms_norm");
}
void Backend::rms_norm_gated(const Tensor&, const Weight&, const Tensor&, float, Activation,
                             Tensor&) {
  unimplemented("rms_norm_gated");
}
void Backend::l2_norm(Tensor&, std::int64_t, float) {
  unimplemented("l2_norm");
}
void Backend::activate(Tensor&, Activation) {
  unimplemented("activate");
}
void Backend::scale(Tensor&, float) {
  unimplemented("scale");
}
void Backend::add(Tensor&, const Tensor&) {
  unimplemented("add");
}
void Backend::mul(Tensor&, const Tensor&) {
  unimplemented("mul");
}
void Backend::mul_activated(Tensor& x, Tensor& gate, Activation act) {
  activate(gate, act);
  mul(x, gate);
}
void Backend::mul_cols(Tensor&, const Weight&) {
  unimplemented("mul_cols");
}
void Backend::mul_rows(Tensor&, const Tensor&) {
  unimplemented("mul_rows");
}
void Backend::swiglu(const Tensor&, const Tensor&, Tensor&) {
  unimplemented("swiglu");
}
void Backend::swiglu_packed(const Tensor&, Tensor&) {
  unimplemented("swiglu_packed");
}
void Backend::signed_sqrt(Tensor&, float) {
  unimplemented("signed_sqrt");
}
void Backend::normalize_rows(Tensor&) {
  unimplemented("normalize_rows");
}
void Backend::clamp(Tensor&, float, float) {
  unimplemented("clamp");
}
void Backend::slice_cols(const Tensor&, std::int64_t, std::int64_t, Tensor&) {
  unimplemented("slice_cols");
}
void Backend::slice_rows(const Tensor&, std::int64_t, std::int64_t, Tensor&) {
  unimplemented("slice_rows");
}
void Backend::split_interleaved(const Tensor&, std::int64_t, std::int64_t, Tensor&, Tensor&) {
  unimplemented("split_interleaved");
}
void Backend::repeat_cols(const Tensor&, std::int64_t, Tensor&) {
  unimplemented("repeat_cols");
}
void Backend::append_rows(Tensor&, const Tensor&) {
  unimplemented("append_rows");
}
void Backend::embedding(std::span<const Weight>, std::span<const std::int64_t>, Tensor&) {
  unimplemented("embedding");
}
void Backend::upload_rows(std::span<const float> values, std::int64_t cols, Tensor& out) {
  if (failed()) return;
  if (cols <= 0 || values.size() % static_cast<std::size_t>(cols) != 0)
    return fail(invalid_argument("upload_rows: " + std::to_string(values.size()) +
                                 " values are not rows of " + std::to_string(cols)));
  if (!ensure(out, {static_cast<std::int64_t>(values.size()) / cols, cols})) return;
  out.copy_from_host(values);
}
void Backend::stream_mean(const Tensor&, std::int64_t, Tensor&) {
  unimplemented("stream_mean");
}
void Backend::add_scaled_streams(Tensor&, const Tensor&, const Tensor&) {
  unimplemented("add_scaled_streams");
}
void Backend::mhc_weights(const Tensor&, const Tensor&, const Weight&, const Weight&, std::int64_t,
                          float, float, std::int64_t, Tensor&, Tensor*, Tensor*) {
  unimplemented("mhc_weights");
}
void Backend::weighted_stream_sum(const Tensor&, const Tensor&, Tensor&) {
  unimplemented("weighted_stream_sum");
}
void Backend::mhc_expand(Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unimplemented("mhc_expand");
}
void Backend::grouped_dot(const Tensor&, const Tensor&, std::int64_t, Tensor&) {
  unimplemented("grouped_dot");
}
void Backend::stream_mix(const Tensor& xn, const Tensor& u, const Weight& up, std::int64_t streams,
                         Tensor& out) {
  Tensor m;
  linear(u, up, m);
  activate(m, Activation::kSigmoid);
  mul(m, xn);
  stream_mean(m, streams, out);
}
void Backend::hyper_connection_read(const Tensor& h, const Weight& norm, const Weight& mix_down,
                                    const Weight& mix_up, const Weight& inject,
                                    std::int64_t streams, std::int64_t width, float eps,
                                    Tensor& mixed, Tensor* inject_out) {
  const float inv_streams = 1.0f / static_cast<float>(streams);
  Tensor xn, u;
  rms_norm(h, norm, width, eps, /*unit_offset=*/true, xn);
  linear(xn, mix_down, u);
  scale(u, inv_streams);
  activate(u, Activation::kSilu);
  stream_mix(xn, u, mix_up, streams, mixed);
  if (inject_out != nullptr) {
    linear(xn, inject, *inject_out);
    scale(*inject_out, inv_streams);
    activate(*inject_out, Activation::kSigmoid);
    scale(*inject_out, 2.0f);
  }
}
void Backend::gated_delta_net_in_proj(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                      const Weight& w_b, const Weight& w_a, const Weight& dt_bias,
                                      const Weight& decay_rate, Tensor& qkv, Tensor& z,
                                      Tensor& beta, Tensor& g) {
  linear(x, w_qkv, qkv);
  linear(x, w_z, z);
  linear(x, w_b, beta);
  linear(x, w_a, g);
  activate(beta, Activation::kSigmoid);
  add_bias(g, dt_bias);
  activate(g, Activation::kSoftplus);
  mul_cols(g, decay_rate);
}
void Backend::qsa_projections(const Tensor& x, const Weight& q_w, const Weight& k_w,
                              const Weight& v_w, const Weight& index_w, const Weight& q_bias,
                              const Weight& k_bias, const Weight& v_bias, Tensor& qg, Tensor& k,
                              Tensor& v, Tensor& index_qk) {
  linear(x, index_w, index_qk);
  linear(x, q_w, qg);
  if (!q_bias.empty()) add_bias(qg, q_bias);
  linear(x, k_w, k);
  if (!k_bias.empty()) add_bias(k, k_bias);
  linear(x, v_w, v);
  if (!v_bias.empty()) add_bias(v, v_bias);
}
void Backend::head_norm_rope(Tensor& a, const Weight& wa, Tensor* b, const Weight& wb,
                             std::int64_t head_dim, float eps, std::int64_t rotary_dim,
                             std::int64_t first, double theta) {
  rms_norm(a, wa, head_dim, eps, /*unit_offset=*/true, a);
  if (b != nullptr) rms_norm(*b, wb, head_dim, eps, /*unit_offset=*/true, *b);
  rope(a, head_dim, rotary_dim, first, 1, theta);
  if (b != nullptr) rope(*b, head_dim, rotary_dim, first, 1, theta);
}
void Backend::gated_delta_net_conv(const Tensor& qkv, const Weight& conv, Tensor& tail,
                                   std::int64_t key_dim, std::int64_t head_dim, Tensor& q,
                                   Tensor& k, Tensor& v) {
  Tensor mixed;
  causal_conv1d(qkv, conv, 1, tail, mixed);
  activate(mixed, Activation::kSilu);
  slice_cols(mixed, 0, key_dim, q);
  slice_cols(mixed, key_dim, key_dim, k);
  slice_cols(mixed, 2 * key_dim, qkv.cols() - 2 * key_dim, v);
  l2_norm(q, head_dim, 1e-6f);
  l2_norm(k, head_dim, 1e-6f);
  scale(q, 1.0f / std::sqrt(static_cast<float>(head_dim)));
}
void Backend::gated_delta_net_in_proj_conv(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                           const Weight& w_b, const Weight& w_a,
                                           const Weight& dt_bias, const Weight& decay_rate,
                                           const Weight& conv, Tensor& tail, Tensor& mixed,
                                           Tensor& z, Tensor& beta, Tensor& g) {
  Tensor qkv;
  gated_delta_net_in_proj(x, w_qkv, w_z, w_b, w_a, dt_bias, decay_rate, qkv, z, beta, g);
  causal_conv1d(qkv, conv, 1, tail, mixed);
  activate(mixed, Activation::kSilu);
}
void Backend::gated_delta_net_core(const Tensor& mixed, const Tensor& z, const Tensor& beta,
                                   const Tensor& g, std::int64_t key_heads, std::int64_t head_dim,
                                   const Weight& norm, float eps, Activation act, Tensor& state,
                                   Tensor& normed) {
  const auto S = mixed.rows(), key_dim = key_heads * head_dim, Hv = beta.cols();
  const auto value_dim = mixed.cols() - 2 * key_dim;
  Tensor q, k, v, core;
  slice_cols(mixed, 0, key_dim, q);
  slice_cols(mixed, key_dim, key_dim, k);
  slice_cols(mixed, 2 * key_dim, value_dim, v);
  l2_norm(q, head_dim, 1e-6f);
  l2_norm(k, head_dim, 1e-6f);
  scale(q, 1.0f / std::sqrt(static_cast<float>(head_dim)));
  gated_delta_rule_recurrent(q, k, v, g, beta, key_heads, state, core);
  if (failed()) return;
  // One group a value head; the gate is read element by element, so z keeps its [S, value_dim].
  core.reshape({S * Hv, value_dim / Hv});
  rms_norm_gated(core, norm, z, eps, act, normed);
  if (failed()) return;
  normed.reshape({S, value_dim});
}
void Backend::route_experts(const Tensor& x, const Weight& router, std::int64_t top_k,
                            bool normalize, Tensor& experts, Tensor& weights) {
  Tensor probs;
  linear(x, router, probs);
  softmax(probs);
  topk(probs, top_k, experts, weights);
  if (normalize) normalize_rows(weights);
}
void Backend::shared_expert(const Tensor& x, const Weight& gate, const Weight& up,
                            const Weight& down, const Weight& expert_gate, Tensor& y) {
  Tensor g, u, act, shared, scalar;
  linear(x, gate, g);
  linear(x, up, u);
  swiglu(g, u, act);
  linear(act, down, shared);
  linear(x, expert_gate, scalar);
  activate(scalar, Activation::kSigmoid);
  mul_rows(shared, scalar);
  add(y, shared);
}
void Backend::moe_block(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                        const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                        const Weight& shared_up, const Weight& shared_down,
                        const Weight& shared_expert_gate, Tensor& experts, Tensor& weights,
                        Tensor& y) {
  route_experts(x, router, top_k, normalize, experts, weights);
  moe_experts(x, gate_up, down, experts, weights, 0, y);
  shared_expert(x, shared_gate, shared_up, shared_down, shared_expert_gate, y);
}
void Backend::linear_into_streams(const Tensor& x, const Weight& w, const StreamsWrite& out) {
  Tensor y;
  linear(x, w, y);
  add_scaled_streams(out.h, y, out.inject);
}
void Backend::moe_block_into_streams(const Tensor& x, const Weight& router, std::int64_t top_k,
                                     bool normalize, const Weight& gate_up, const Weight& down,
                                     const Weight& shared_gate, const Weight& shared_up,
                                     const Weight& shared_down, const Weight& shared_expert_gate,
                                     Tensor& experts, Tensor& weights, const StreamsWrite& out) {
  Tensor y;
  moe_block(x, router, top_k, normalize, gate_up, down, shared_gate, shared_up, shared_down,
            shared_expert_gate, experts, weights, y);
  add_scaled_streams(out.h, y, out.inject);
}
void Backend::rope(Tensor&, std::int64_t, std::int64_t, std::int64_t, std::int64_t, double) {
  unimplemented("rope");
}
void Backend::causal_conv1d(const Tensor&, const Weight&, std::int64_t, Tensor&, Tensor&) {
  unimplemented("causal_conv1d");
}
void Backend::gated_delta_rule_chunked(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Tensor&, std::int64_t, Tensor&, Tensor&) {
  unimplemented("gated_delta_rule_chunked");
}
void Backend::gated_delta_rule_recurrent(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                         const Tensor&, std::int64_t, Tensor&, Tensor&) {
  unimplemented("gated_delta_rule_recurrent");
}
void Backend::gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& g, const Tensor& beta,
                                         std::int64_t key_heads, Tensor& state, Tensor& out,
                                         Tensor& states) {
  if (failed()) return;
  const auto S = k.rows();
  if (!ensure(out, v.shape()) || !ensure(states, {S, state.numel()})) return;
  Tensor qt, kt, vt, gt, bt, ot;
  for (std::int64_t t = 0; t < S; ++t) {
    slice_rows(q, t, 1, qt);
    slice_rows(k, t, 1, kt);
    slice_rows(v, t, 1, vt);
    slice_rows(g, t, 1, gt);
    slice_rows(beta, t, 1, bt);
    gated_delta_rule_recurrent(qt, kt, vt, gt, bt, key_heads, state, ot);
    if (failed()) return;
    auto& mem = *memory();
    mem.copy(static_cast<char*>(out.raw()) + static_cast<std::size_t>(t) * ot.bytes(), ot.raw(),
             ot.bytes());
    mem.copy(static_cast<char*>(states.raw()) + static_cast<std::size_t>(t) * state.bytes(),
             state.raw(), state.bytes());
  }
}
void Backend::block_sparse_attention(const Tensor&, const Tensor&, const Tensor&, std::int64_t,
                                     std::int64_t, const Tensor&, std::int64_t, std::int64_t, float,
                                     Tensor&) {
  unimplemented("block_sparse_attention");
}
void Backend::gated_block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                           std::int64_t heads, std::int64_t kv_heads,
                                           const Tensor& picked, std::int64_t block,
                                           std::int64_t first, float scale, Tensor& gate,
                                           Activation act, Tensor& out) {
  block_sparse_attention(q, k, v, heads, kv_heads, picked, block, first, scale, out);
  mul_activated(out, gate, act);
}
void Backend::layer_norm(const Tensor&, const Weight&, const Weight&, float, Tensor&) {
  unimplemented("layer_norm");
}
void Backend::kpool_compress(const Tensor&, const Tensor&, const Weight&, std::int64_t,
                             std::int64_t, std::int64_t, Tensor&) {
  unimplemented("kpool_compress");
}
void Backend::rope_interleaved(Tensor&, std::int64_t, const Weight&, std::int64_t, std::int64_t,
                               bool) {
  unimplemented("rope_interleaved");
}
void Backend::compressor_pool(const Tensor&, const Tensor&, std::int64_t, const Weight&,
                              std::int64_t, std::int64_t, bool, Tensor&) {
  unimplemented("compressor_pool");
}
void Backend::weighted_index_scores(const Tensor&, const Tensor&, const Tensor&, float, Tensor&) {
  unimplemented("weighted_index_scores");
}
void Backend::sink_attention(const Tensor&, const Tensor&, std::int64_t, std::int64_t,
                             const Tensor&, std::int64_t, const Tensor*, const Weight&,
                             std::int64_t, float, Tensor&) {
  unimplemented("sink_attention");
}
void Backend::grouped_linear(const Tensor&, const Weight&, std::int64_t, Tensor&) {
  unimplemented("grouped_linear");
}
void Backend::fp8_e4m3_simulate(Tensor&, std::int64_t, std::int64_t) {
  unimplemented("fp8_e4m3_simulate");
}
void Backend::hadamard_fp4_simulate(Tensor&, std::int64_t, std::int64_t) {
  unimplemented("hadamard_fp4_simulate");
}
void Backend::block_mean(const Tensor&, std::int64_t, std::int64_t, std::int64_t, Tensor&) {
  unimplemented("block_mean");
}
void Backend::index_scores(const Tensor&, const Tensor&, std::int64_t, float, Tensor&) {
  unimplemented("index_scores");
}
void Backend::softmax(Tensor&) {
  unimplemented("softmax");
}
void Backend::topk(const Tensor&, std::int64_t, Tensor&, Tensor&) {
  unimplemented("topk");
}
void Backend::argmax_rows(const Tensor&, Tensor&) {
  unimplemented("argmax_rows");
}
void Backend::softmax_denominators(const Tensor&, double, Tensor&) {
  unimplemented("softmax_denominators");
}
void Backend::sample_rows(const Tensor&, double, std::span<const double>, Tensor&) {
  unimplemented("sample_rows");
}
void Backend::token_probs(const Tensor&, double, std::span<const std::int32_t>, Tensor&) {
  unimplemented("token_probs");
}
void Backend::sample_residual_rows(const Tensor&, const Tensor&, double, std::span<const double>,
                                   Tensor&) {
  unimplemented("sample_residual_rows");
}
bool entries_inside(const Tensor& x, std::span<const EntryPenalty> entries) {
  if (x.shape().size() != 2) return entries.empty();
  return std::all_of(entries.begin(), entries.end(), [&](const EntryPenalty& e) {
    return e.row >= 0 && e.row < x.rows() && e.col >= 0 && e.col < x.cols();
  });
}
void Backend::penalise_entries(Tensor&, std::span<const EntryPenalty>) {
  unimplemented("penalise_entries");
}
void Backend::select_blocks(const Tensor&, std::int64_t, std::int64_t, std::int64_t, Tensor&) {
  unimplemented("select_blocks");
}
void Backend::moe_experts(const Tensor&, const Weight&, const Weight&, const Tensor&, const Tensor&,
                          float, Tensor&) {
  unimplemented("moe_experts");
}
void Backend::select_experts(const Tensor&, const Weight&, const Weight&, const Tensor*,
                             std::int64_t, std::int64_t, std::int64_t, bool, float, Tensor&,
                             Tensor&) {
  unimplemented("select_experts");
}

Expected<std::unique_ptr<Backend>> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") return make_cuda_backend();
  if (name == "auto") {
    // A GPU this build has no kernels for (an older one, or one outside FLASHSERVE_CUDA_ARCHS)
    // leaves the CPU; `--backend cuda` names the reason.
    if (cuda_available()) {
      auto cuda = make_cuda_backend();
      if (cuda.ok() || cuda.status().code() != ErrorCode::kUnsupported) return cuda;
    }
    return make_cpu_backend();
  }
  return invalid_argument("unknown backend '" + name + "' (expected cpu, cuda or auto)");
}

}  // namespace fs
