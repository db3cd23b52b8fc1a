#include "model/qwen_next/weights.h"

#include "model/weight_upload.h"

#include <cmath>
#include <map>
#include <set>

#include "backend/backend.h"
#include "model/qwen_next/schema.h"
#include "model/schema_builder.h"
#include "model/weight_source.h"

namespace fs {
namespace {

using Source = WeightSource;

HyperConnectionWeights hc_weights(const QwenNextConfig& c, const Source& s, const std::string& p,
                                  bool inject) {
  HyperConnectionWeights w;
  w.norm = s.vec(p + "hc_norm.weight");
  w.mix_down = s.weight(p + "input_mix_weight_down.weight");
  w.mix_up = s.weight(p + "input_mix_weight_up.weight");
  if (inject) w.inject = s.weight(p + "block_inject_weight.weight");
  w.streams = c.hc_count;
  w.width = c.hidden_size;
  w.eps = static_cast<float>(c.rms_norm_eps);
  return w;
}

Expected<PleWeights> ple_weights(const QwenNextConfig& c, const Source& s, const std::string& p,
                                 std::int64_t ple_index) {
  PleWeights w;
  if (c.split_ngram_parts <= 1) {
    w.table_shards.push_back(s.weight(p + "ple_embedding.ngram_embedding.weight"));
  } else {
    for (std::int64_t i = 0; i < c.split_ngram_parts; ++i)
      w.table_shards.push_back(
          s.weight(p + "ple_embedding.ngram_embedding.shard_" + std::to_string(i) + ".weight"));
  }
  auto& h = w.hash;
  h.ngram_size = c.ngram_size;
  h.heads_per_ngram = c.heads_per_ngram;
  h.eos = c.eos_token_ids.empty() ? 0 : c.eos_token_ids.front();
  h.head_sizes = ple_head_vocab_sizes(c, ple_index);
  std::int64_t off = 0;
  for (const auto size : h.head_sizes) {
    h.head_offsets.push_back(off);
    off += size;
  }
  h.multipliers = ngram_layer_multipliers(c.vocab_size, c.ngram_size, ple_index, c.seed);
  // The stored buffers are a pure function of the config: a mismatch means another hashing.
  const std::pair<const char*, const std::vector<std::int64_t>*> buffers[] = {
      {"ple_embedding.layer_multipliers", &h.multipliers},
      {"ple_embedding.ngram_heads_vocab_sizes", &h.head_sizes},
      {"ple_embedding.ngram_heads_offsets", &h.head_offsets}};
  for (const auto& [name, expected] : buffers) {
    if (s.ints(p + name) != *expected)
      return corrupt("tensor " + p + name + " differs from the values the config implies");
  }
  w.key_proj = s.weight(p + "key_proj.weight");
  w.value_proj = s.weight(p + "value_proj.weight");
  w.norm_key = s.vec(p + "norm_key.weight");
  w.norm_query = s.vec(p + "norm_query.weight");
  w.norm_conv = s.vec(p + "norm_conv.weight");
  w.conv1d = s.conv(p + "conv1d.weight");
  return w;
}

QsaWeights qsa_weights(const QwenNextConfig& c, const Source& s, const std::string& a) {
  QsaWeights q;
  q.q_proj = s.weight(a + "q_proj.weight");
  q.k_proj = s.weight(a + "k_proj.weight");
  q.v_proj = s.weight(a + "v_proj.weight");
  q.o_proj = s.weight(a + "o_proj.weight");
  if (c.attention_bias) {
    q.q_bias = s.vec(a + "q_proj.bias");
    q.k_bias = s.vec(a + "k_proj.bias");
    q.v_bias = s.vec(a + "v_proj.bias");
    q.o_bias = s.vec(a + "o_proj.bias");
  }
  q.q_norm = s.vec(a + "q_norm.weight");
  q.k_norm = s.vec(a + "k_norm.weight");
  q.index_qk_proj = s.weight(a + "indexer.index_qk_proj.weight");
  q.index_q_norm = s.vec(a + "indexer.q_layernorm.weight");
  q.index_k_norm = s.vec(a + "indexer.k_layernorm.weight");
  return q;
}

MoeWeights moe_weights(const QwenNextConfig& c, const Source& s, const std::string& m) {
  MoeWeights moe;
  moe.router = s.weight(m + "gate.weight");
  moe.gate_up = s.weight(m + "experts.gate_up_proj");
  moe.down = s.weight(m + "experts.down_proj");
  moe.shared_gate_proj = s.weight(m + "shared_expert.gate_proj.weight");
  moe.shared_up_proj = s.weight(m + "shared_expert.up_proj.weight");
  moe.shared_down_proj = s.weight(m + "shared_expert.down_proj.weight");
  moe.shared_expert_gate = s.weight(m + "shared_expert_gate.weight");
  moe.experts = c.num_experts;
  moe.top_k = c.num_experts_per_tok;
  moe.norm_topk_prob = c.norm_topk_prob;
  return moe;
}

// The MTP head (docs/MTP.md), when the checkpoint carries one; its tensors are validated like
// the trunk's.
Expected<std::optional<QwenMtpWeights>> mtp_weights(const QwenNextConfig& c, const Checkpoint& ck,
                                                    const Source& s) {
  const auto specs = qwen_next_mtp_tensors(c);
  std::size_t present = 0;
  for (const auto& spec : specs) present += ck.contains(spec.name);
  if (present == 0) return std::optional<QwenMtpWeights>{};
  if (auto st = check_specs(specs, ck, FloatWeights::kWithFp8); !st.ok())
    return st.with_context("MTP head");
  QwenMtpWeights w;
  w.hidden_norm = s.vec("mtp.hidden_norm.weight");
  w.embed_norm = s.vec("mtp.embed_norm.weight");
  w.fc_hidden = s.weight("mtp.fc_hidden.weight");
  w.fc_embedding = s.weight("mtp.fc_embedding.weight");
  w.layer.kind = QwenLayerKind::kSparseAttention;
  w.layer.attn_hc = hc_weights(c, s, "mtp.layers.0.attn_hyper_connection.", true);
  w.layer.mlp_hc = hc_weights(c, s, "mtp.layers.0.mlp_hyper_connection.", true);
  w.layer.qsa = qsa_weights(c, s, "mtp.layers.0.self_attn.");
  w.layer.moe = moe_weights(c, s, "mtp.layers.0.mlp.");
  w.mixer = hc_weights(c, s, "mtp.hyper_connection_mixer.", false);
  return std::optional<QwenMtpWeights>(std::move(w));
}

}  // namespace

Expected<QwenNextWeights> load_qwen_next_weights(const QwenNextConfig& c, const std::string& dir) {
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  QwenNextWeights w;
  w.checkpoint = std::make_unique<Checkpoint>(std::move(ck).value());
  if (auto st = check_specs(qwen_next_tensors(c), *w.checkpoint, FloatWeights::kWithFp8); !st.ok())
    return st.with_context(dir);
  const Source s(*w.checkpoint, w.host_vectors);
  w.embed_tokens = s.weight("embed_tokens.weight");
  w.dtype = w.embed_tokens.dtype;
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : s.weight("lm_head.weight");
  w.final_mixer = hc_weights(c, s, "hyper_connection_mixer.", /*inject=*/false);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto L = layer_prefix(i);
    QwenLayerWeights lw;
    lw.kind = c.layer_types[static_cast<std::size_t>(i)];
    lw.attn_hc = hc_weights(c, s, L + "attn_hyper_connection.", true);
    lw.mlp_hc = hc_weights(c, s, L + "mlp_hyper_connection.", true);
    if (lw.kind == QwenLayerKind::kLinearAttention) {
      const auto a = L + "linear_attn.";
      GatedDeltaNetWeights g;
      g.in_proj_qkv = s.weight(a + "in_proj_qkv.weight");
      g.in_proj_z = s.weight(a + "in_proj_z.weight");
      g.in_proj_b = s.weight(a + "in_proj_b.weight");
      g.in_proj_a = s.weight(a + "in_proj_a.weight");
      g.out_proj = s.weight(a + "out_proj.weight");
      g.conv1d = s.conv(a + "conv1d.weight");
      g.dt_bias = s.vec(a + "dt_bias");
      auto decay = s.values(a + "A_log");
      for (auto& v : decay) v = -std::exp(v);
      const auto heads = static_cast<std::int64_t>(decay.size());
      g.decay_rate = s.own(std::move(decay), {heads});
      g.norm = s.vec(a + "norm.weight");
      lw.gdn = std::move(g);
    } else {
      lw.qsa = qsa_weights(c, s, L + "self_attn.");
    }
    if (const auto pi = c.ple_layer_index(i); pi >= 0) {
      auto p = ple_weights(c, s, L + "ple.", pi);
      if (!p.ok()) return p.status().with_context(dir);
      lw.ple = std::move(p).value();
    }
    lw.moe = moe_weights(c, s, L + "mlp.");
    w.layers.push_back(std::move(lw));
  }
  auto mtp = mtp_weights(c, *w.checkpoint, s);
  if (!mtp.ok()) return mtp.status().with_context(dir);
  w.mtp = std::move(mtp).value();
  return w;
}

namespace {

// Every weight the backend computes with, each once (a tied lm_head is the embedding itself).
template <typename F>
void for_each_layer_weight(QwenLayerWeights& lw, F&& f) {
  for (auto* hc : {&lw.attn_hc, &lw.mlp_hc}) {
    f(hc->norm), f(hc->mix_down), f(hc->mix_up), f(hc->inject);
  }
  if (lw.gdn) {
    auto& g = *lw.gdn;
    for (auto* x : {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a, &g.out_proj,
                    &g.conv1d, &g.dt_bias, &g.decay_rate, &g.norm})
      f(*x);
  }
  if (lw.qsa) {
    auto& q = *lw.qsa;
    for (auto* x :
         {&q.q_proj, &q.k_proj, &q.v_proj, &q.o_proj, &q.index_qk_proj, &q.q_bias, &q.k_bias,
          &q.v_bias, &q.o_bias, &q.q_norm, &q.k_norm, &q.index_q_norm, &q.index_k_norm})
      f(*x);
  }
  if (lw.ple) {
    // The n-gram table stays in the host mapping: only the touched rows are ever read.
    auto& p = *lw.ple;
    for (auto* x :
         {&p.key_proj, &p.value_proj, &p.norm_key, &p.norm_query, &p.norm_conv, &p.conv1d})
      f(*x);
  }
  auto& m = lw.moe;
  for (auto* x : {&m.router, &m.gate_up, &m.down, &m.shared_gate_proj, &m.shared_up_proj,
                  &m.shared_down_proj, &m.shared_expert_gate})
    f(*x);
}

}  // namespace

Status upload_qwen_next_weights(QwenNextWeights& w, Backend& be, DType matrix_dtype) {
  // Depthwise conv kernels [C, K] are filters, not matrices: they stay f32, as the CPU uses them.
  std::set<const Weight*> filters;
  for (auto& lw : w.layers) {
    if (lw.gdn) filters.insert(&lw.gdn->conv1d);
    if (lw.ple) filters.insert(&lw.ple->conv1d);
  }
  std::vector<WeightUpload> plan;
  auto upload = [&](Weight& x) {
    plan.push_back({&x, filters.contains(&x) ? DType::kF32 : matrix_dtype});
  };
  auto upload_hc = [&](HyperConnectionWeights& hc) {
    upload(hc.norm), upload(hc.mix_down), upload(hc.mix_up), upload(hc.inject);
  };
  // A tied lm_head is the embedding's bytes: upload_weights copies them once and hands both
  // the same device copy.
  upload(w.embed_tokens);
  upload(w.lm_head);
  upload_hc(w.final_mixer);
  for (auto& lw : w.layers) for_each_layer_weight(lw, upload);
  if (w.mtp) {
    auto& m = *w.mtp;
    for (auto* x : {&m.hidden_norm, &m.embed_norm, &m.fc_hidden, &m.fc_embedding}) upload(*x);
    for_each_layer_weight(m.layer, upload);
    upload_hc(m.mixer);
  }
  if (Status s = upload_weights(be, plan, "the qwen4_exp weights"); !s.ok()) return s;
  w.dtype = w.embed_tokens.dtype;
  return {};
}

}  // namespace fs
