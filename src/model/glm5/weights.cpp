#include "model/glm5/weights.h"

#include <cmath>

#include "backend/backend.h"
#include "model/glm5/schema.h"
#include "model/schema_builder.h"
#include "model/weight_source.h"
#include "model/weight_upload.h"

namespace fs {
namespace {

MhcWeights mhc_weights(const Glm5Config& c, const WeightSource& s, const std::string& p) {
  MhcWeights w;
  w.fn = s.weight(p + "fn");
  w.base = s.vec(p + "base");
  w.scale = s.vec(p + "scale");
  w.streams = c.hc_mult;
  w.width = c.hidden_size;
  // The unweighted RMSNorm over the H*D streams uses rms_norm_eps, not hc_eps (M:211-217, 258).
  w.norm_eps = static_cast<float>(c.rms_norm_eps);
  w.hc_eps = static_cast<float>(c.hc_eps);
  w.sinkhorn_iters = c.hc_sinkhorn_iters;
  return w;
}

KdaWeights kda_weights(const Glm5Config& c, const WeightSource& s, const std::string& a) {
  KdaWeights k;
  k.q_proj = s.weight(a + "q_proj.weight");
  k.k_proj = s.weight(a + "k_proj.weight");
  k.v_proj = s.weight(a + "v_proj.weight");
  // conv1d.weight [3Q, 1, K]: channels q, then k, then v (M:645-652).
  const auto Q = c.kda_dim(), K = c.linear_conv_kernel_dim;
  const auto conv = s.values(a + "conv1d.weight");
  auto part = [&](std::int64_t i) {
    const auto at = conv.begin() + i * Q * K;
    return s.own(std::vector<float>(at, at + Q * K), {Q, K});
  };
  k.conv_q = part(0);
  k.conv_k = part(1);
  k.conv_v = part(2);
  k.f_a_proj = s.weight(a + "forget_gate.f_a_proj.weight");
  k.f_b_proj = s.weight(a + "forget_gate.f_b_proj.weight");
  k.dt_bias = s.vec(a + "forget_gate.dt_bias");
  // A = exp(A_log) per head, fp32 (M:325-326), repeated over the head's key channels.
  const auto a_log = s.values(a + "forget_gate.A_log");
  const bool safe_gate = !std::isnan(c.linear_lower_bound);
  std::vector<float> rate(static_cast<std::size_t>(Q));
  for (std::int64_t i = 0; i < Q; ++i) {
    const float A = std::exp(a_log[static_cast<std::size_t>(i / c.linear_head_dim)]);
    rate[static_cast<std::size_t>(i)] = safe_gate ? A : -A;
  }
  k.decay_rate = s.own(std::move(rate), {Q});
  k.b_proj = s.weight(a + "b_proj.weight");
  k.g_a_proj = s.weight(a + "g_a_proj.weight");
  k.g_b_proj = s.weight(a + "g_b_proj.weight");
  k.o_norm = s.vec(a + "o_norm.weight");
  k.o_proj = s.weight(a + "o_proj.weight");
  return k;
}

DsaWeights dsa_weights(const Glm5Config& c, const WeightSource& s, const std::string& a,
                       bool full_indexer) {
  DsaWeights d;
  d.q_a_proj = s.weight(a + "q_a_proj.weight");
  d.q_a_layernorm = s.vec(a + "q_a_layernorm.weight");
  d.q_b_proj = s.weight(a + "q_b_proj.weight");
  d.kv_a_proj_with_mqa = s.weight(a + "kv_a_proj_with_mqa.weight");
  d.kv_a_layernorm = s.vec(a + "kv_a_layernorm.weight");
  d.kv_b_proj = s.weight(a + "kv_b_proj.weight");
  d.o_proj = s.weight(a + "o_proj.weight");
  if (c.attention_bias) {
    d.q_a_bias = s.vec(a + "q_a_proj.bias");
    d.kv_a_bias = s.vec(a + "kv_a_proj_with_mqa.bias");
    d.o_bias = s.vec(a + "o_proj.bias");
  }
  if (full_indexer) {
    const auto ip = a + "indexer.";
    DsaIndexerWeights i;
    i.wq_b = s.weight(ip + "wq_b.weight");
    i.wk = s.weight(ip + "wk.weight");
    i.k_norm = s.vec(ip + "k_norm.weight");
    i.k_norm_bias = s.vec(ip + "k_norm.bias");
    i.weights_proj = s.weight(ip + "weights_proj.weight");
    i.compress_ape = s.vec(ip + "index_kpool_compress_ape");
    i.compress_gate = s.weight(ip + "index_kpool_compress_gate");
    d.indexer = std::move(i);
  }
  return d;
}

SwigluMlpWeights mlp_weights(const Glm5Config& c, const WeightSource& s, const std::string& m) {
  SwigluMlpWeights w;
  w.gate = s.weight(m + "gate_proj.weight");
  w.up = s.weight(m + "up_proj.weight");
  w.down = s.weight(m + "down_proj.weight");
  w.swiglu_limit = static_cast<float>(c.swiglu_limit);
  return w;
}

ClampedMoeWeights moe_weights(const Glm5Config& c, const WeightSource& s, const std::string& m) {
  ClampedMoeWeights w;
  auto& r = w.router;
  r.gate = s.weight(m + "gate.weight");
  r.selection_bias = s.vec(m + "gate.e_score_correction_bias");
  r.score = RouterScore::kSigmoid;
  r.experts = c.n_routed_experts;
  r.top_k = c.num_experts_per_tok;
  r.groups = c.n_group;
  r.top_groups = c.topk_group;
  r.normalize = c.norm_topk_prob;
  r.routed_scaling = static_cast<float>(c.routed_scaling_factor);
  w.gate_up = s.weight(m + "experts.gate_up_proj");
  w.down = s.weight(m + "experts.down_proj");
  w.shared = mlp_weights(c, s, m + "shared_experts.");
  w.swiglu_limit = static_cast<float>(c.swiglu_limit);
  return w;
}

// The MTP layer when the checkpoint carries one; validated like the trunk.
Expected<std::optional<Glm5MtpWeights>> mtp_weights(const Glm5Config& c, const Checkpoint& ck,
                                                    const WeightSource& s) {
  const auto specs = glm5_mtp_tensors(c);
  std::size_t present = 0;
  for (const auto& spec : specs) present += ck.contains(spec.name);
  if (present == 0) return std::optional<Glm5MtpWeights>{};
  if (auto st = check_specs(specs, ck); !st.ok()) return st.with_context("MTP layer");
  const auto L = layer_prefix(c.num_hidden_layers);
  const auto D = c.hidden_size;
  Glm5MtpWeights w;
  w.enorm = s.vec(L + "enorm.weight");
  w.hnorm = s.vec(L + "hnorm.weight");
  // [D, 2D]: columns [0, D) multiply the normed embedding, [D, 2D) the normed hidden.
  const auto eh = s.values(L + "eh_proj.weight");
  std::vector<float> embed_half(static_cast<std::size_t>(D * D)), hidden_half(embed_half.size());
  for (std::int64_t r = 0; r < D; ++r) {
    const auto row = eh.begin() + r * 2 * D;
    std::copy(row, row + D, embed_half.begin() + r * D);
    std::copy(row + D, row + 2 * D, hidden_half.begin() + r * D);
  }
  w.eh_embed = s.own(std::move(embed_half), {D, D});
  w.eh_hidden = s.own(std::move(hidden_half), {D, D});
  w.input_layernorm = s.vec(L + "input_layernorm.weight");
  w.post_attention_layernorm = s.vec(L + "post_attention_layernorm.weight");
  w.attn = dsa_weights(c, s, L + "self_attn.", /*full_indexer=*/true);
  w.moe = moe_weights(c, s, L + "mlp.");
  w.shared_head_norm = s.vec(L + "shared_head.norm.weight");
  return std::optional<Glm5MtpWeights>(std::move(w));
}

// What the forward composes from the backend's ops supports; the rest of the config space is
// refused by name rather than computed differently.
Status check_supported(const Glm5Config& c) {
  if (c.qk_nope_head_dim != c.v_head_dim)
    return unsupported("glm5_next: qk_nope_head_dim " + std::to_string(c.qk_nope_head_dim) +
                       " != v_head_dim " + std::to_string(c.v_head_dim) +
                       " (the attention reads K and V of one width)");
  if (!c.index_kpool_always_select_tail)
    return unsupported("glm5_next: index_kpool_always_select_tail = false");
  if (c.n_routed_experts % c.n_group != 0)
    return unsupported("glm5_next: n_routed_experts must be a multiple of n_group");
  return {};
}

}  // namespace

Expected<Glm5Weights> load_glm5_weights(const Glm5Config& c, const std::string& dir) {
  if (Status st = check_supported(c); !st.ok()) return st;
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  Glm5Weights w;
  w.checkpoint = std::make_unique<Checkpoint>(std::move(ck).value());
  if (auto st = check_specs(glm5_tensors(c), *w.checkpoint); !st.ok()) return st.with_context(dir);
  const WeightSource s(*w.checkpoint, w.host_vectors);
  w.embed_tokens = s.weight("embed_tokens.weight");
  w.dtype = w.embed_tokens.dtype;
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : s.weight("lm_head.weight");
  w.norm = s.vec("norm.weight");
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const auto L = layer_prefix(i);
    Glm5LayerWeights lw;
    lw.kind = c.layer_types[u];
    lw.mlp_kind = c.mlp_layer_types[u];
    lw.attn_hc = mhc_weights(c, s, L + "attn_hc.");
    lw.ffn_hc = mhc_weights(c, s, L + "ffn_hc.");
    lw.input_layernorm = s.vec(L + "input_layernorm.weight");
    lw.post_attention_layernorm = s.vec(L + "post_attention_layernorm.weight");
    if (lw.kind == GlmAttentionKind::kLinearAttention) {
      lw.kda = kda_weights(c, s, L + "self_attn.");
    } else {
      lw.dsa = dsa_weights(c, s, L + "self_attn.", c.indexer_types[u] == GlmIndexerKind::kFull);
    }
    if (lw.mlp_kind == GlmMlpKind::kDense) {
      lw.mlp = mlp_weights(c, s, L + "mlp.");
    } else {
      lw.moe = moe_weights(c, s, L + "mlp.");
    }
    w.layers.push_back(std::move(lw));
  }
  auto mtp = mtp_weights(c, *w.checkpoint, s);
  if (!mtp.ok()) return mtp.status().with_context(dir);
  w.mtp = std::move(mtp).value();
  return w;
}

namespace {

// Every weight the backend computes with, each once, with whether it must stay f32.
template <typename F>
void for_each_dsa_weight(DsaWeights& d, F&& f) {
  for (auto* x : {&d.q_a_proj, &d.q_a_bias, &d.q_a_layernorm, &d.q_b_proj, &d.kv_a_proj_with_mqa,
                  &d.kv_a_bias, &d.kv_a_layernorm, &d.kv_b_proj, &d.o_proj, &d.o_bias})
    f(*x, false);
  if (d.indexer) {
    auto& i = *d.indexer;
    for (auto* x : {&i.wq_b, &i.wk, &i.k_norm, &i.k_norm_bias, &i.weights_proj, &i.compress_ape,
                    &i.compress_gate})
      f(*x, false);
  }
}

template <typename F>
void for_each_moe_weight(ClampedMoeWeights& m, F&& f) {
  for (auto* x : {&m.router.gate, &m.router.selection_bias, &m.gate_up, &m.down, &m.shared.gate,
                  &m.shared.up, &m.shared.down})
    f(*x, false);
}

template <typename F>
void for_each_layer_weight(Glm5LayerWeights& lw, F&& f) {
  for (auto* hc : {&lw.attn_hc, &lw.ffn_hc}) f(hc->fn, true), f(hc->base, true), f(hc->scale, true);
  f(lw.input_layernorm, false), f(lw.post_attention_layernorm, false);
  if (lw.kda) {
    auto& k = *lw.kda;
    for (auto* x : {&k.conv_q, &k.conv_k, &k.conv_v}) f(*x, true);
    for (auto* x : {&k.q_proj, &k.k_proj, &k.v_proj, &k.f_a_proj, &k.f_b_proj, &k.dt_bias,
                    &k.decay_rate, &k.b_proj, &k.g_a_proj, &k.g_b_proj, &k.o_norm, &k.o_proj})
      f(*x, false);
  }
  if (lw.dsa) for_each_dsa_weight(*lw.dsa, f);
  if (lw.mlp_kind == GlmMlpKind::kDense) {
    for (auto* x : {&lw.mlp.gate, &lw.mlp.up, &lw.mlp.down}) f(*x, false);
  } else {
    for_each_moe_weight(lw.moe, f);
  }
}

}  // namespace

Status upload_glm5_weights(Glm5Weights& w, Backend& be, DType matrix_dtype) {
  std::vector<WeightUpload> plan;
  auto upload = [&](Weight& x, bool keep_f32) {
    plan.push_back({&x, keep_f32 ? DType::kF32 : matrix_dtype});
  };
  // A tied lm_head is the embedding's bytes: upload_weights copies them once and hands both the
  // same device copy.
  upload(w.embed_tokens, false);
  upload(w.lm_head, false);
  upload(w.norm, false);
  for (auto& lw : w.layers) for_each_layer_weight(lw, upload);
  if (w.mtp) {
    auto& m = *w.mtp;
    for (auto* x : {&m.enorm, &m.hnorm, &m.eh_embed, &m.eh_hidden, &m.input_layernorm,
                    &m.post_attention_layernorm, &m.shared_head_norm})
      upload(*x, false);
    for_each_dsa_weight(m.attn, upload);
    for_each_moe_weight(m.moe, upload);
  }
  if (Status s = upload_weights(be, plan, "the glm5_next weights"); !s.ok()) return s;
  w.dtype = w.embed_tokens.dtype;
  return {};
}

}  // namespace fs
