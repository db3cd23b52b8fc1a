#include "bench/synthetic_weights.h"

#include <cmath>

#include "bench/fill.h"
#include "model/qwen_next/config.h"

namespace fs::bench {
namespace {

float fan_in_scale(std::int64_t fan_in) {
  return 1.0f / std::sqrt(static_cast<float>(fan_in));
}

// The weights one layer of `kind` has, built through `m` (matrix) and `v` (vector) makers.
struct Maker {
  const QwenNextConfig& c;
  SyntheticWeightStore& s;
  const WeightMix& mix;

  Weight as(MatrixRole role, Shape shape) {
    const auto in = shape.back();
    return s.matrix(std::move(shape), mix.storage(role, in), fan_in_scale(in));
  }
  // Matrices the quantised checkpoints keep as they are, and the projections they quantise.
  Weight mat(Shape shape) { return as(MatrixRole::kOther, std::move(shape)); }
  Weight proj(Shape shape) { return as(MatrixRole::kProjection, std::move(shape)); }
  Weight unit_norm(std::int64_t n) { return s.vector({n}, 0.05f, 0.0f); }  // (1+w), w ~ 0

  HyperConnectionWeights hc(bool inject) {
    const auto W = c.stream_width(), r = c.hc_lowrank;
    HyperConnectionWeights w;
    w.norm = unit_norm(W);
    w.mix_down = mat({r, W});
    w.mix_up = mat({W, r});
    if (inject) w.inject = mat({c.hc_count, W});
    w.streams = c.hc_count;
    w.width = c.hidden_size;
    w.eps = static_cast<float>(c.rms_norm_eps);
    return w;
  }

  MoeWeights moe() {
    const auto H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size,
               Is = c.shared_expert_intermediate_size;
    MoeWeights m;
    m.router = mat({E, H});
    m.gate_up = as(MatrixRole::kExpertGateUp, {E, 2 * I, H});
    m.down = as(MatrixRole::kExpertDown, {E, H, I});
    m.shared_gate_proj = proj({Is, H});
    m.shared_up_proj = proj({Is, H});
    m.shared_down_proj = proj({H, Is});
    m.shared_expert_gate = mat({1, H});
    m.experts = E;
    m.top_k = c.num_experts_per_tok;
    m.norm_topk_prob = c.norm_topk_prob;
    return m;
  }

  GatedDeltaNetWeights gdn() {
    const auto H = c.hidden_size, Hv = c.linear_num_value_heads;
    GatedDeltaNetWeights g;
    g.in_proj_qkv = proj({c.gdn_conv_dim(), H});
    g.in_proj_z = proj({c.gdn_value_dim(), H});
    g.in_proj_b = proj({Hv, H});
    g.in_proj_a = proj({Hv, H});
    g.out_proj = proj({H, c.gdn_value_dim()});
    g.conv1d = s.vector({c.gdn_conv_dim(), c.linear_conv_kernel_dim},
                        fan_in_scale(c.linear_conv_kernel_dim), 0.0f);
    g.dt_bias = s.vector({Hv}, 0.5f, 0.0f);
    g.decay_rate = s.vector({Hv}, 0.75f, -1.25f);  // -exp(A_log) in [-2, -0.5]
    g.norm = s.vector({c.linear_value_head_dim}, 0.05f, 1.0f);
    return g;
  }

  QsaWeights qsa() {
    const auto H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads,
               Hkv = c.num_key_value_heads, dI = c.indexer_head_dim;
    QsaWeights q;
    q.q_proj = proj({2 * Hq * D, H});
    q.k_proj = proj({Hkv * D, H});
    q.v_proj = proj({Hkv * D, H});
    q.o_proj = proj({H, Hq * D});
    q.index_qk_proj = proj({(c.indexer_n_heads + 1) * dI, H});
    q.q_norm = unit_norm(D);
    q.k_norm = unit_norm(D);
    q.index_q_norm = unit_norm(dI);
    q.index_k_norm = unit_norm(dI);
    return q;
  }

  PleWeights ple(std::int64_t ple_index) {
    const auto W = c.stream_width(), Ep = c.ple_embed_dim;
    PleWeights p;
    p.table_shards.push_back(s.host_table({ple_table_rows(c, ple_index), c.ple_head_dim()}, 1.0f));
    p.hash.ngram_size = c.ngram_size;
    p.hash.heads_per_ngram = c.heads_per_ngram;
    p.hash.eos = c.eos_token_ids.empty() ? 0 : c.eos_token_ids.front();
    p.hash.multipliers = ngram_layer_multipliers(c.vocab_size, c.ngram_size, ple_index, c.seed);
    p.hash.head_sizes = ple_head_vocab_sizes(c, ple_index);
    std::int64_t at = 0;
    for (const auto size : p.hash.head_sizes) {
      p.hash.head_offsets.push_back(at);
      at += size;
    }
    p.key_proj = proj({W, Ep});
    p.value_proj = proj({c.hidden_size, Ep});
    p.norm_key = unit_norm(W);
    p.norm_query = unit_norm(W);
    p.norm_conv = unit_norm(W);
    p.conv1d = s.vector({W, c.ple_conv_kernel_size}, fan_in_scale(c.ple_conv_kernel_size), 0.0f);
    return p;
  }

  QwenLayerWeights layer(QwenLayerKind kind, std::int64_t index) {
    QwenLayerWeights lw;
    lw.kind = kind;
    lw.attn_hc = hc(true);
    lw.mlp_hc = hc(true);
    if (kind == QwenLayerKind::kLinearAttention) {
      lw.gdn = gdn();
    } else {
      lw.qsa = qsa();
    }
    if (index >= 0) {
      if (const auto pi = c.ple_layer_index(index); pi >= 0) lw.ple = ple(pi);
    }
    lw.moe = moe();
    return lw;
  }
};

}  // namespace

Weight SyntheticWeightStore::keep(Tensor t, float scale, float offset) {
  auto owned = std::make_unique<Tensor>(std::move(t));
  if (status_.ok()) {
    if (auto s = fill_uniform(*owned, seed_ * 1000003u + buffers_.size(), scale, offset); !s.ok())
      status_ = s;
  }
  (owned->device() == Device::kHost ? host_bytes_ : device_bytes_) += owned->bytes();
  Weight w{owned->dtype(), owned->shape(), static_cast<const std::uint8_t*>(owned->raw()),
           owned->device()};
  buffers_.push_back(std::move(owned));
  return w;
}

Weight SyntheticWeightStore::matrix(Shape shape, const MatrixStorage& storage, float scale) {
  if (storage.packed) return packed(std::move(shape), *storage.packed, scale);
  return matrix(std::move(shape), storage.dtype, scale);
}

Weight SyntheticWeightStore::packed(Shape shape, quant::QuantType q, float scale) {
  // The bytes as a U8 tensor of whole blocks (the Weight counts weights); FP4's E8M0 scales
  // per 32 inputs beside them.
  Weight w;
  w.dtype = DType::kU8;
  w.shape = shape;
  w.packed = q;
  w.device = device_->device();
  const auto bytes = static_cast<std::int64_t>(w.bytes());
  auto fill = [&](Tensor t, quant::QuantType as) {
    auto owned = std::make_unique<Tensor>(std::move(t));
    if (status_.ok()) {
      if (auto st = fill_packed(*owned, as, seed_ * 1000003u + buffers_.size(), scale); !st.ok())
        status_ = st;
    }
    (owned->device() == Device::kHost ? host_bytes_ : device_bytes_) += owned->bytes();
    const auto* data = static_cast<const std::uint8_t*>(owned->raw());
    buffers_.push_back(std::move(owned));
    return data;
  };
  w.data = fill(Tensor(device_, {bytes}, DType::kU8), q);
  if (q == quant::QuantType::kF4E2M1x2) {
    w.scales = {nullptr, quant::ScaleFormat::kE8M0, 1, 32};
    const auto scale_bytes =
        w.matrices() * static_cast<std::int64_t>(w.scales.grid_bytes(w.matrix_rows(), w.cols()));
    w.scales.data = fill(Tensor(device_, {scale_bytes}, DType::kU8), quant::QuantType::kF8E8M0);
  }
  if (status_.ok()) {
    if (auto st = w.check_storage(); !st.ok()) status_ = st;
  }
  return w;
}

Weight SyntheticWeightStore::matrix(Shape shape, DType dtype, float scale) {
  if (dtype != DType::kF8E4M3) return keep(Tensor(device_, std::move(shape), dtype), scale, 0.0f);
  // FP8 in the releases' layout: e4m3 codes uniform over [-448, 448] (rounded, saturated) and
  // per-128x128-block scales in [0.75, 1.25) * scale / 448, so weights stay within ~1.25 scale.
  Shape grid = shape;
  grid[grid.size() - 2] = (grid[grid.size() - 2] + 127) / 128;
  grid.back() = (grid.back() + 127) / 128;
  Weight w = keep(Tensor(device_, std::move(shape), DType::kF8E4M3), 448.0f, 0.0f);
  const Weight scales =
      keep(Tensor(device_, std::move(grid), DType::kF32), 0.25f * scale / 448, scale / 448);
  w.scales.data = scales.data;
  return w;
}

Weight SyntheticWeightStore::vector(Shape shape, float scale, float offset) {
  return keep(Tensor(device_, std::move(shape), DType::kF32), scale, offset);
}

Weight SyntheticWeightStore::host_table(Shape shape, float scale) {
  return keep(Tensor(host_memory(), std::move(shape), DType::kBF16), scale, 0.0f);
}

Expected<QwenNextWeights> synthetic_qwen_next_weights(const QwenNextConfig& c,
                                                      SyntheticWeightStore& store,
                                                      const WeightMix& mix) {
  Maker m{c, store, mix};
  const DType matrix_dtype = mix.storage(MatrixRole::kOther, c.hidden_size).dtype;
  QwenNextWeights w;
  // Embedding rows of unit scale (the model's first stream); lm_head as any matrix.
  w.embed_tokens = store.matrix({c.vocab_size, c.hidden_size}, matrix_dtype, 1.0f);
  w.lm_head = m.mat({c.vocab_size, c.hidden_size});
  w.final_mixer = m.hc(false);
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
    w.layers.push_back(m.layer(c.layer_types[static_cast<std::size_t>(i)], i));
  QwenMtpWeights mtp;
  mtp.hidden_norm = m.unit_norm(c.stream_width());
  mtp.embed_norm = m.unit_norm(c.hidden_size);
  mtp.fc_hidden = m.proj({c.hidden_size, c.hidden_size});
  mtp.fc_embedding = m.proj({c.hidden_size, c.hidden_size});
  mtp.layer = m.layer(QwenLayerKind::kSparseAttention, -1);
  mtp.mixer = m.hc(false);
  w.mtp = std::move(mtp);
  w.dtype = matrix_dtype;
  if (!store.status().ok()) return store.status();
  return w;
}

WeightBudget weight_budget(const QwenNextConfig& c, const MatrixBytes& m) {
  const double H = static_cast<double>(c.hidden_size), W = static_cast<double>(c.stream_width()),
               r = static_cast<double>(c.hc_lowrank), E = static_cast<double>(c.num_experts),
               I = static_cast<double>(c.moe_intermediate_size),
               Is = static_cast<double>(c.shared_expert_intermediate_size),
               hc = static_cast<double>(c.hc_count), D = static_cast<double>(c.head_dim),
               Hq = static_cast<double>(c.num_attention_heads),
               Hkv = static_cast<double>(c.num_key_value_heads),
               dI = static_cast<double>(c.indexer_head_dim),
               nI = static_cast<double>(c.indexer_n_heads);
  const double mo = m.others, mp = m.projections,
               mgu = m.experts_gate_up < 0 ? mp : m.experts_gate_up,
               mdn = m.experts_down < 0 ? mp : m.experts_down,
               msd = m.shared_down < 0 ? mp : m.shared_down;
  const double hc_read = mo * (2 * r * W + W);  // mix_down, mix_up (+ norm, f32 below)
  const double per_layer_common = 2 * (hc_read + mo * hc * W) + mo * (E * H + H) +
                                  E * I * H * (2 * mgu + mdn) + Is * H * (2 * mp + msd);
  const double gdn = mp * (static_cast<double>(c.gdn_conv_dim() + c.gdn_value_dim()) * H +
                           2 * static_cast<double>(c.linear_num_value_heads) * H +
                           H * static_cast<double>(c.gdn_value_dim()));
  const double qsa = mp * ((2 * Hq * D + 2 * Hkv * D) * H + H * Hq * D + (nI + 1) * dI * H);
  auto bytes = [](double v) { return static_cast<std::size_t>(v); };
  WeightBudget b;
  b.linear_layer = bytes(per_layer_common + gdn);
  b.qsa_layer = bytes(per_layer_common + qsa);
  b.mtp = bytes(per_layer_common + qsa + mp * 2 * H * H);
  b.fixed = bytes(mo * 2 * static_cast<double>(c.vocab_size) * H + hc_read);
  return b;
}

}  // namespace fs::bench
