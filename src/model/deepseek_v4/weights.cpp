#include "model/deepseek_v4/weights.h"

#include "backend/backend.h"
#include "model/deepseek_v4/official_experts.h"
#include "model/deepseek_v4/official_names.h"
#include "model/deepseek_v4/rope.h"
#include "model/deepseek_v4/schema.h"
#include "model/gguf_inspect.h"
#include "model/gguf_tensors.h"
#include "model/schema_builder.h"
#include "model/weight_source.h"
#include "model/weight_upload.h"
#include "util/progress.h"

namespace fs {
namespace {

MhcWeights mhc_weights(const DeepseekV4Config& c, const WeightSource& r, const std::string& p) {
  MhcWeights w;
  w.fn = r.widened(p + "fn");  // fp32, as the reference keeps it (HF _keep_in_fp32_modules)
  w.base = r.vec(p + "base");
  w.scale = r.vec(p + "scale");
  w.streams = c.hc_mult;
  w.width = c.hidden_size;
  w.norm_eps = static_cast<float>(c.rms_norm_eps);
  w.hc_eps = static_cast<float>(c.hc_eps);
  w.sinkhorn_iters = c.hc_sinkhorn_iters;
  return w;
}

DsCompressorWeights compressor_weights(const WeightSource& r, const std::string& p,
                                       std::int64_t ratio, bool overlap) {
  DsCompressorWeights w;
  w.kv_proj = r.weight(p + "kv_proj.weight");
  w.gate_proj = r.weight(p + "gate_proj.weight");
  w.position_bias = r.widened(p + "position_bias");
  w.kv_norm = r.vec(p + "kv_norm.weight");
  w.ratio = ratio;
  w.overlap = overlap;
  return w;
}

DsAttentionWeights attention_weights(const DeepseekV4Config& c, const WeightSource& r,
                                     const std::string& a, DsAttentionKind kind) {
  DsAttentionWeights w;
  w.q_a_proj = r.weight(a + "q_a_proj.weight");
  w.q_a_norm = r.vec(a + "q_a_norm.weight");
  w.q_b_proj = r.weight(a + "q_b_proj.weight");
  w.kv_proj = r.weight(a + "kv_proj.weight");
  w.kv_norm = r.vec(a + "kv_norm.weight");
  w.o_a_proj = r.weight(a + "o_a_proj.weight");
  w.o_b_proj = r.weight(a + "o_b_proj.weight");
  w.sinks = r.vec(a + "sinks");
  if (kind == DsAttentionKind::kSliding) return w;
  const auto ratio = c.compress_rate(kind);
  const bool csa = kind == DsAttentionKind::kCompressedSparse;
  w.compressor = compressor_weights(r, a + "compressor.", ratio, csa);
  if (csa) {
    const auto ip = a + "compressor.indexer.";
    DsIndexerWeights idx;
    idx.compressor = compressor_weights(r, ip, ratio, true);
    idx.q_b_proj = r.weight(ip + "q_b_proj.weight");
    idx.weights_proj = r.weight(ip + "scorer.weights_proj.weight");
    w.indexer = std::move(idx);
  }
  return w;
}

RouterScore router_score(const std::string& f) {
  return f == "softmax"   ? RouterScore::kSoftmax
         : f == "sigmoid" ? RouterScore::kSigmoid
                          : RouterScore::kSqrtSoftplus;
}

MhcHeadWeights hyper_head(const DeepseekV4Config& c, const WeightSource& r, const std::string& p) {
  MhcHeadWeights w;
  w.fn = r.widened(p + "hc_head.hc_fn");
  w.base = r.vec(p + "hc_head.hc_base");
  w.scale = r.vec(p + "hc_head.hc_scale");
  w.streams = c.hc_mult;
  w.width = c.hidden_size;
  w.norm_eps = static_cast<float>(c.rms_norm_eps);
  w.hc_eps = static_cast<float>(c.hc_eps);
  return w;
}

// Where a layer's owned buffers go (the hash tables narrowed to int32), and the checkpoint an
// official folder's experts are checked in (null for a GGUF file).
struct LayerArenas {
  const Checkpoint* checkpoint;
  std::vector<std::unique_ptr<std::vector<std::int32_t>>>& ints;
  bool official = false;
};

// The specs without the stacked experts, which the official release stores per expert.
std::vector<TensorSpec> without_stacked_experts(std::vector<TensorSpec> specs) {
  std::erase_if(specs, [](const TensorSpec& s) {
    return s.name.ends_with("mlp.experts.gate_up_proj") ||
           s.name.ends_with("mlp.experts.down_proj");
  });
  return specs;
}

// grouped_linear reads o_a_proj per output group of o_lora_rank rows, and a group that starts
// inside an FP8 block of 128 rows has no scale grid of its own: refused here, naming the tensor,
// rather than at the first forward.
Status check_grouped_fp8(const DeepseekV4Config& c, const Checkpoint& ck, const TensorNaming& n,
                         const std::vector<TensorSpec>& specs) {
  if (c.o_lora_rank % 128 == 0) return {};
  for (const auto& spec : specs) {
    if (!spec.name.ends_with("self_attn.o_a_proj.weight")) continue;
    if (ck.view(n.stored(spec.name))->dtype == DType::kF8E4M3)
      return unsupported("tensor " + n.describe(spec.name) + " is F8_E4M3, but its " +
                         std::to_string(c.o_groups) + " output groups of " +
                         std::to_string(c.o_lora_rank) +
                         " rows start inside its 128-row scale blocks (grouped_linear reads "
                         "whole blocks)");
  }
  return {};
}

// One decoder layer under prefix L; the hash table (int64 in the checkpoint) is narrowed to
// int32.
Expected<DsLayerWeights> layer_weights(const DeepseekV4Config& c, const WeightSource& r,
                                       const std::string& L, DsAttentionKind kind, DsMlpKind mlp,
                                       const LayerArenas& arenas) {
  auto& ints = arenas.ints;
  DsLayerWeights lw;
  lw.kind = kind;
  lw.attn_hc = mhc_weights(c, r, L + "attn_hc.");
  lw.ffn_hc = mhc_weights(c, r, L + "ffn_hc.");
  lw.input_layernorm = r.vec(L + "input_layernorm.weight");
  lw.post_attention_layernorm = r.vec(L + "post_attention_layernorm.weight");
  lw.attn = attention_weights(c, r, L + "self_attn.", kind);

  const auto m = L + "mlp.";
  auto& moe = lw.moe;
  auto& router = moe.router;
  router.gate = r.weight(m + "gate.weight");
  router.score = router_score(c.scoring_func);
  router.experts = c.n_routed_experts;
  router.top_k = c.num_experts_per_tok;
  router.normalize = true;  // HF normalises the selected weights always (HF 1034, 1067)
  router.routed_scaling = static_cast<float>(c.routed_scaling_factor);
  if (mlp == DsMlpKind::kHashMoe) {
    // tid2eid [V, k] int64 -> int32; every id must name an expert.
    const auto ids = r.ints(m + "gate.tid2eid");
    auto table = std::make_unique<std::vector<std::int32_t>>(ids.size());
    for (std::size_t j = 0; j < ids.size(); ++j) {
      if (ids[j] < 0 || ids[j] >= c.n_routed_experts)
        return corrupt("tensor " + m + "gate.tid2eid holds expert " + std::to_string(ids[j]) +
                       " outside [0, " + std::to_string(c.n_routed_experts) + ")");
      (*table)[j] = static_cast<std::int32_t>(ids[j]);
    }
    router.token_experts = {DType::kI32,
                            {c.vocab_size, c.num_experts_per_tok},
                            reinterpret_cast<const std::uint8_t*>(table->data())};
    ints.push_back(std::move(table));
  } else {
    router.selection_bias = r.vec(m + "gate.e_score_correction_bias");
  }
  if (arenas.official) {
    if (auto st = check_official_experts(*arenas.checkpoint, L, c.n_routed_experts,
                                         c.moe_intermediate_size, c.hidden_size);
        !st.ok())
      return st;
    lw.official_experts =
        DsOfficialExperts{L, c.n_routed_experts, c.moe_intermediate_size, c.hidden_size};
  } else {
    moe.gate_up = r.weight(m + "experts.gate_up_proj");
    moe.down = r.weight(m + "experts.down_proj");
  }
  moe.shared.gate = r.weight(m + "shared_experts.gate_proj.weight");
  moe.shared.up = r.weight(m + "shared_experts.up_proj.weight");
  moe.shared.down = r.weight(m + "shared_experts.down_proj.weight");
  moe.shared.swiglu_limit = static_cast<float>(c.swiglu_limit);
  moe.swiglu_limit = static_cast<float>(c.swiglu_limit);
  return lw;
}

// The MTP block when the checkpoint carries one (validated like the trunk).
Expected<std::optional<DsMtpWeights>> mtp_weights(const DeepseekV4Config& c, const WeightSource& r,
                                                  const LayerArenas& arenas) {
  auto specs = deepseek_v4_mtp_tensors(c);
  if (arenas.official) specs = without_stacked_experts(std::move(specs));
  std::size_t present = 0;
  for (const auto& spec : specs) present += r.contains(spec.name);
  if (present == 0) return std::optional<DsMtpWeights>{};
  if (auto st = r.check(specs, FloatWeights::kWithFp8); !st.ok())
    return st.with_context("MTP block");
  if (arenas.checkpoint)
    if (auto st = check_grouped_fp8(c, *arenas.checkpoint, r.naming(), specs); !st.ok())
      return st.with_context("MTP block");
  const std::string p = kDeepseekV4MtpPrefix;
  DsMtpWeights w;
  w.enorm = r.vec(p + "enorm.weight");
  w.hnorm = r.vec(p + "hnorm.weight");
  w.e_proj = r.weight(p + "e_proj.weight");
  w.h_proj = r.weight(p + "h_proj.weight");
  auto layer = layer_weights(c, r, p, DsAttentionKind::kSliding, DsMlpKind::kMoe, arenas);
  if (!layer.ok()) return layer.status();
  w.layer = std::move(layer).value();
  w.hc_head = hyper_head(c, r, p);
  w.norm = r.vec(p + "norm.weight");
  return std::optional<DsMtpWeights>(std::move(w));
}

}  // namespace

Expected<DeepseekV4Weights> load_deepseek_v4_weights(const DeepseekV4Config& c,
                                                     const std::string& dir) {
  DeepseekV4Weights w;
  // A GGUF file (ds4's names) or a safetensors folder.
  if (is_gguf_file(dir)) {
    auto g = GgufTensors::open(dir);
    if (!g.ok()) return g.status();
    w.gguf = std::move(g).value();
  } else {
    auto ck = Checkpoint::open(dir);
    if (!ck.ok()) return ck.status();
    w.checkpoint = std::make_unique<Checkpoint>(std::move(ck).value());
  }
  // A safetensors folder in the official release's names (official_names.h) maps them and keeps
  // its experts per expert.
  TensorNaming naming;
  auto specs = deepseek_v4_tensors(c);
  w.official_names = w.checkpoint && deepseek_v4_official_names(*w.checkpoint);
  if (w.official_names) {
    naming.rename = deepseek_v4_official_name;
    naming.dot_scale = true;
    specs = without_stacked_experts(std::move(specs));
  }
  const WeightSource r = w.gguf ? WeightSource(*w.gguf, w.host_vectors)
                                : WeightSource(*w.checkpoint, w.host_vectors, naming);
  if (auto st = r.check(specs, FloatWeights::kWithFp8); !st.ok()) return st.with_context(dir);
  if (w.checkpoint)
    if (auto st = check_grouped_fp8(c, *w.checkpoint, naming, specs); !st.ok())
      return st.with_context(dir);
  const LayerArenas arenas{w.checkpoint.get(), w.host_ints, w.official_names};
  w.embed_tokens = r.weight("embed_tokens.weight");
  w.dtype = w.embed_tokens.dtype;
  w.lm_head = c.tie_word_embeddings ? w.embed_tokens : r.weight("lm_head.weight");
  w.norm = r.vec("norm.weight");
  w.hc_head = hyper_head(c, r, "");
  w.unit_head = r.own(std::vector<float>(static_cast<std::size_t>(c.head_dim), 1.0f), {c.head_dim});
  const auto half = c.rope_head_dim() / 2;
  w.main_inv_freq = r.own(rope_inv_freq(c.main_rope, c.rope_head_dim()), {half});
  w.compress_inv_freq = r.own(rope_inv_freq(c.compress_rope, c.rope_head_dim()), {half});

  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    auto lw = layer_weights(c, r, layer_prefix(i), c.layer_types[u], c.mlp_layer_types[u], arenas);
    if (!lw.ok()) return lw.status().with_context(dir);
    w.layers.push_back(std::move(lw).value());
  }
  auto mtp = mtp_weights(c, r, arenas);
  if (!mtp.ok()) return mtp.status().with_context(dir);
  w.mtp = std::move(mtp).value();
  return w;
}

Status upload_deepseek_v4_weights(DeepseekV4Weights& w, Backend& be, DType matrix_dtype) {
  std::vector<WeightUpload> plan;
  auto upload = [&](Weight& x) { plan.push_back({&x, matrix_dtype}); };
  // The hyper-connection parameters and the position biases are fp32 in the reference.
  auto upload_f32 = [&](Weight& x) { plan.push_back({&x, DType::kF32}); };
  auto upload_mhc = [&](MhcWeights& m) {
    upload_f32(m.fn), upload_f32(m.base), upload_f32(m.scale);
  };
  auto upload_head = [&](MhcHeadWeights& m) {
    upload_f32(m.fn), upload_f32(m.base), upload_f32(m.scale);
  };
  auto upload_compressor = [&](DsCompressorWeights& c) {
    upload(c.kv_proj), upload(c.gate_proj), upload_f32(c.position_bias), upload(c.kv_norm);
  };
  // A GGUF load's fused gate_up tensors (deferred, GgufTensors): on a device each is assembled,
  // uploaded and freed in turn after the plan; the CPU computes on the assembled buffers.
  const bool device = be.device_memory().has_value();
  std::vector<std::pair<Weight*, std::string>> deferred;
  std::uint64_t deferred_bytes = 0;
  auto upload_experts = [&](Weight& x, const std::string& name) {
    if (!w.gguf || !w.gguf->fused(name)) return upload(x);
    if (!device) {
      x = w.gguf->assemble(name);
      return upload(x);
    }
    deferred.emplace_back(&x, name);
    deferred_bytes += device_bytes(x, matrix_dtype);
  };
  // An official folder's experts: stacked now for a host backend (it computes on the stacked
  // buffers, which the weights keep); on a device after the plan, a layer at a time.
  std::vector<DsLayerWeights*> deferred_official;
  auto upload_official = [&](DsLayerWeights& lw) {
    const auto& o = *lw.official_experts;
    if (device) {
      deferred_official.push_back(&lw);
      deferred_bytes += o.stacked_bytes();
      return;
    }
    const auto stacked = stack_official_experts(*w.checkpoint, o.layer_prefix, o.experts,
                                                o.intermediate, o.hidden, w.host_bytes);
    lw.moe.gate_up = stacked.gate_up;
    lw.moe.down = stacked.down;
    upload(lw.moe.gate_up), upload(lw.moe.down);
  };
  auto upload_layer = [&](DsLayerWeights& lw, const std::string& prefix) {
    upload_mhc(lw.attn_hc);
    upload_mhc(lw.ffn_hc);
    upload(lw.input_layernorm), upload(lw.post_attention_layernorm);
    auto& a = lw.attn;
    for (auto* x : {&a.q_a_proj, &a.q_a_norm, &a.q_b_proj, &a.kv_proj, &a.kv_norm, &a.o_a_proj,
                    &a.o_b_proj, &a.sinks})
      upload(*x);
    if (a.compressor) upload_compressor(*a.compressor);
    if (a.indexer) {
      upload_compressor(a.indexer->compressor);
      upload(a.indexer->q_b_proj), upload(a.indexer->weights_proj);
    }
    auto& m = lw.moe;
    upload(m.router.gate), upload(m.router.selection_bias), upload(m.router.token_experts);
    if (lw.official_experts) {
      upload_official(lw);
    } else {
      upload_experts(m.gate_up, prefix + "mlp.experts.gate_up_proj");
      upload(m.down);
    }
    upload(m.shared.gate), upload(m.shared.up), upload(m.shared.down);
  };
  // A tied lm_head is the embedding's bytes: upload_weights copies them once for both. A packed
  // (GGUF block type) embedding stays in the host mapping, where `embedding` gathers and
  // dequantises the rows of a step (device embeddings are F32/BF16); its lm_head is uploaded.
  const bool host_embedding = w.embed_tokens.is_packed() && be.device_memory().has_value();
  if (!host_embedding) upload(w.embed_tokens);
  upload(w.lm_head);
  upload(w.norm);
  upload_head(w.hc_head);
  upload(w.unit_head), upload(w.main_inv_freq), upload(w.compress_inv_freq);
  for (std::size_t i = 0; i < w.layers.size(); ++i)
    upload_layer(w.layers[i], layer_prefix(static_cast<std::int64_t>(i)));
  if (w.mtp) {
    auto& m = *w.mtp;
    upload(m.enorm), upload(m.hnorm), upload(m.e_proj), upload(m.h_proj), upload(m.norm);
    upload_layer(m.layer, kDeepseekV4MtpPrefix);
    upload_head(m.hc_head);
  }
  if (Status s = upload_weights(be, plan, "the deepseek_v4 weights", deferred_bytes); !s.ok())
    return s;
  ProgressMeter meter("loading the routed experts", deferred_bytes,
                      deferred.empty() && deferred_official.empty() ? nullptr : stderr);
  for (auto& [x, name] : deferred) {
    auto up = be.upload(w.gguf->assemble(name), matrix_dtype);
    w.gguf->release(name);
    if (!up.ok()) {
      meter.finish(false);
      return up.status().with_context(name);
    }
    meter.add(device_bytes(*up, matrix_dtype));
    *x = *up;
  }
  for (DsLayerWeights* lw : deferred_official) {
    const auto& o = *lw->official_experts;
    std::vector<std::unique_ptr<std::vector<std::uint8_t>>> layer;  // freed after the upload
    const auto stacked = stack_official_experts(*w.checkpoint, o.layer_prefix, o.experts,
                                                o.intermediate, o.hidden, layer);
    auto gate_up = be.upload(stacked.gate_up, matrix_dtype);
    if (!gate_up.ok()) {
      meter.finish(false);
      return gate_up.status().with_context(o.layer_prefix + "mlp.experts (gate_up)");
    }
    auto down = be.upload(stacked.down, matrix_dtype);
    if (!down.ok()) {
      meter.finish(false);
      return down.status().with_context(o.layer_prefix + "mlp.experts (down)");
    }
    meter.add(o.stacked_bytes());
    lw->moe.gate_up = *gate_up;
    lw->moe.down = *down;
  }
  if (!deferred.empty() || !deferred_official.empty()) meter.finish();
  w.dtype = w.embed_tokens.dtype;
  return {};
}

}  // namespace fs
