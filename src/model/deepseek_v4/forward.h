// The DeepSeek V4 trunk (HF deepseek_v4, arch-dsv4.md section 2) on the backend op interface:
// the embedding copied into hc_mult streams, then per layer
//   mhc_read -> input_layernorm -> attention (sliding | CSA | HCA) -> mhc_write
//   mhc_read -> post_attention_layernorm -> clamped MoE (hash or score routed) -> mhc_write,
// then the hyper head, the final norm and lm_head.
#pragma once

#include <memory>
#include <span>

#include "backend/backend.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/state.h"
#include "model/deepseek_v4/weights.h"
#include "model/model.h"
#include "model/mtp.h"

namespace fs {

class DeepseekV4Model final : public Model {
 public:
  // `numerics` kOfficial adds the official graph's quantisation simulations (numerics.h); the
  // config must pass check_official_numerics.
  DeepseekV4Model(DeepseekV4Config config, DeepseekV4Weights weights,
                  std::unique_ptr<Backend> backend, Numerics numerics = Numerics::kHf);
  ~DeepseekV4Model() override;

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<ModelState> new_state() const override {
    return new_deepseek_v4_state(config_, backend_->memory());
  }
  Status forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                 ForwardOutput& out, HiddenRows hidden = HiddenRows::kHost) override;

  const DeepseekV4Config& config() const { return config_; }
  const Backend& backend() const { return *backend_; }
  MtpHead* mtp() override { return mtp_.get(); }
  Backend* backend() override { return backend_.get(); }

 private:
  friend class DeepseekV4MtpHead;
  // One decoder layer on the streams h [S, hc*H] (HF DeepseekV4DecoderLayer).
  void decoder_layer(const DsLayerWeights& lw, DsAttentionCache& cache, Position first,
                     const Tensor& token_ids, Tensor& h);
  // One function per block, named as the reference names them. x [S, H] is the normed sublayer
  // input; queries are at positions first, first + 1, ...
  void attention(const DsLayerWeights& lw, DsAttentionCache& cache, Position first, const Tensor& x,
                 Tensor& y);
  // Appends this call's projections to the frontier and the rows of the windows it closes
  // (pooled, kv_norm, rotated at the window's first position; under the official numerics
  // FP8'd as KV rows, or Hadamard + FP4'd as the indexer's) to `state.rows`.
  enum class CompressedRows { kKv, kIndexer };
  void compressor(const DsCompressorWeights& w, DsCompressorState& state, Position first,
                  const Tensor& x, CompressedRows kind);
  // The lightning indexer's picks [S, index_topk] int32 (-1: none) among the visible rows.
  void indexer(const DsIndexerWeights& w, DsCompressorState& state, Position first, const Tensor& x,
               const Tensor& q_latent, Tensor& picked);
  const Weight& inv_freq(DsAttentionKind kind) const;

  DeepseekV4Config config_;
  DeepseekV4Weights weights_;
  std::unique_ptr<Backend> backend_;
  ModelInfo info_;
  bool official_numerics_ = false;
  std::unique_ptr<MtpHead> mtp_;
};

}  // namespace fs
