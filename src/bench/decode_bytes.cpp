#include "bench/decode_bytes.h"

#include <algorithm>

namespace fs::bench {
namespace {

constexpr double kF32 = 4;

struct Shapes {
  const QwenNextConfig& c;
  double mb;   // other matrices
  double mp;   // projections
  double mgu;  // routed experts' gate/up
  double mdn;  // routed experts' down
  double msd;  // shared expert's down
  Shapes(const QwenNextConfig& config, const MatrixBytes& m)
      : c(config),
        mb(m.others),
        mp(m.projections),
        mgu(m.experts_gate_up < 0 ? m.projections : m.experts_gate_up),
        mdn(m.experts_down < 0 ? m.projections : m.experts_down),
        msd(m.shared_down < 0 ? m.projections : m.shared_down) {}
  double H() const { return static_cast<double>(c.hidden_size); }
  double W() const { return static_cast<double>(c.stream_width()); }

  // One hyper-connection read/write pair (norm, low-rank mixer, inject).
  double hc(bool inject) const {
    const double r = static_cast<double>(c.hc_lowrank);
    return W() * kF32 + 2 * r * W() * mb +
           (inject ? static_cast<double>(c.hc_count) * W() * mb : 0);
  }
  double moe() const {
    const double E = static_cast<double>(c.num_experts),
                 k = static_cast<double>(c.num_experts_per_tok),
                 I = static_cast<double>(c.moe_intermediate_size),
                 Is = static_cast<double>(c.shared_expert_intermediate_size);
    return (E * H() + H()) * mb + k * I * H() * (2 * mgu + mdn) + Is * H() * (2 * mp + msd);
  }
  double qsa_weights() const {
    const double D = static_cast<double>(c.head_dim),
                 Hq = static_cast<double>(c.num_attention_heads),
                 Hkv = static_cast<double>(c.num_key_value_heads),
                 dI = static_cast<double>(c.indexer_head_dim),
                 nI = static_cast<double>(c.indexer_n_heads);
    return ((2 * Hq * D + 2 * Hkv * D) * H() + H() * Hq * D + (nI + 1) * dI * H()) * mp +
           (2 * D + 2 * dI) * kF32;
  }
  // KV rows the selection reads, the pooled blocks the indexer scores, and the appended rows.
  double qsa_state(std::int64_t context) const {
    const auto blk = c.indexer_compress_ratio;
    const auto T = context + 1;
    const auto complete = T / blk;
    const auto keys = std::min<std::int64_t>(complete, c.indexer_budget / blk) * blk + T % blk;
    const double kv = static_cast<double>(c.num_key_value_heads * c.head_dim) * kF32;
    const double dI = static_cast<double>(c.indexer_head_dim) * kF32;
    return static_cast<double>(keys) * 2 * kv + static_cast<double>(complete) * dI + 2 * kv + dI;
  }
  double gdn_weights() const {
    const double conv = static_cast<double>(c.gdn_conv_dim()),
                 vd = static_cast<double>(c.gdn_value_dim()),
                 Hv = static_cast<double>(c.linear_num_value_heads);
    return (conv * H() + vd * H() + 2 * Hv * H() + H() * vd) * mp +
           conv * static_cast<double>(c.linear_conv_kernel_dim) * kF32 +
           (2 * Hv + static_cast<double>(c.linear_value_head_dim)) * kF32;
  }
  double gdn_state() const {
    const double rec = static_cast<double>(c.linear_num_value_heads * c.linear_key_head_dim *
                                           c.linear_value_head_dim) *
                       kF32;
    const double tail =
        static_cast<double>((c.linear_conv_kernel_dim - 1) * c.gdn_conv_dim()) * kF32;
    return 2 * (rec + tail);
  }
  double ple_weights() const {
    const double Ep = static_cast<double>(c.ple_embed_dim);
    return (W() * Ep + H() * Ep) * mp + 3 * W() * kF32 +
           W() * static_cast<double>(c.ple_conv_kernel_size) * kF32 +
           static_cast<double>(c.ngram_heads() * c.ple_head_dim()) * 2;  // table rows, bf16
  }
  double ple_state() const {
    return 2 * static_cast<double>((c.ple_conv_kernel_size - 1) * c.ngram_size) * W() * kF32;
  }
  double head() const {  // embedding row + lm_head + final mixer
    return H() * mb + static_cast<double>(c.vocab_size) * H() * mb + hc(false);
  }
};

}  // namespace

MatrixBytes matrix_bytes(const WeightMix& mix, const QwenNextConfig& c) {
  const auto H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  MatrixBytes m;
  m.projections = mix.storage(MatrixRole::kProjection, H).bytes_per_weight();
  m.others = mix.storage(MatrixRole::kOther, H).bytes_per_weight();
  m.experts_gate_up = mix.storage(MatrixRole::kExpertGateUp, H).bytes_per_weight();
  m.experts_down = mix.storage(MatrixRole::kExpertDown, I).bytes_per_weight();
  m.shared_down = mix.storage(MatrixRole::kProjection, Is).bytes_per_weight();
  return m;
}

DecodeBytes trunk_decode_bytes(const QwenNextConfig& c, std::int64_t context, MatrixBytes mb) {
  const Shapes s(c, mb);
  DecodeBytes b;
  b.weights = s.head();
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    b.weights += 2 * s.hc(true) + s.moe();
    if (c.layer_types[static_cast<std::size_t>(i)] == QwenLayerKind::kLinearAttention) {
      b.weights += s.gdn_weights();
      b.state += s.gdn_state();
    } else {
      b.weights += s.qsa_weights();
      b.state += s.qsa_state(context);
    }
    if (c.ple_layer_index(i) >= 0) {
      b.weights += s.ple_weights();
      b.state += s.ple_state();
    }
  }
  return b;
}

DecodeBytes mtp_draft_bytes(const QwenNextConfig& c, std::int64_t context, MatrixBytes mb,
                            std::int64_t draft_vocab) {
  const Shapes s(c, mb);
  DecodeBytes b;
  const double head_rows_saved = static_cast<double>(c.vocab_size - draft_vocab) * s.H() * s.mb;
  b.weights = s.head() - head_rows_saved + 2 * s.H() * s.H() * s.mp + (s.W() + s.H()) * kF32 +
              2 * s.hc(true) + s.moe() + s.qsa_weights();
  b.state = s.qsa_state(context);
  return b;
}

}  // namespace fs::bench
