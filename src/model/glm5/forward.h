// The GLM 5.3 Flash trunk (HF glm5_next text model, arch-glm.md section 2) on the backend op
// interface: the embedding copied into hc_mult streams, then per layer (M:1283-1332)
//   mhc_read -> input_layernorm -> kimi_delta_attention | dsa_attention -> mhc_write
//   mhc_read -> post_attention_layernorm -> dense MLP | MoE -> mhc_write,
// then the mean over the streams, the final RMSNorm and lm_head. No RoPE anywhere (NoPE).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/glm5/config.h"
#include "model/glm5/state.h"
#include "model/glm5/weights.h"
#include "model/model.h"
#include "model/mtp.h"

namespace fs {

class Glm5Model final : public Model {
 public:
  Glm5Model(Glm5Config config, Glm5Weights weights, std::unique_ptr<Backend> backend);
  ~Glm5Model() override;

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<ModelState> new_state() const override {
    return new_glm5_state(config_, backend_->memory());
  }
  Status forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                 ForwardOutput& out, HiddenRows hidden = HiddenRows::kHost) override;

  const Glm5Config& config() const { return config_; }
  MtpHead* mtp() override { return mtp_.get(); }
  Backend* backend() override { return backend_.get(); }

 private:
  friend class Glm5MtpHead;
  struct LayerCaches {
    KdaCache* kda = nullptr;
    DsaCache* dsa = nullptr;
  };
  // One decoder layer on the streams h [S, hc*H]. `picked` carries a full DSA layer's pool
  // selection to the shared-indexer layer after it (M:1479-1491).
  void decoder_layer(const Glm5LayerWeights& lw, const LayerCaches& caches, Position first,
                     Tensor& h, Tensor& picked);

  // One function per block, named as the reference names them; x is [S, H].
  // Glm5NextTextLinearAttention (M:637-736).
  void kimi_delta_attention(const KdaWeights& w, KdaCache& cache, const Tensor& x, Tensor& y);
  // Glm5NextTextForgetGate (M:306-336): the per-channel log decay g [S, Q].
  void forget_gate(const KdaWeights& w, const Tensor& x, Tensor& g);
  // Glm5NextTextAttention (M:1158-1219); queries at positions first, first + 1, ... `picked`
  // [S, index_topk / kpool] int32 is this layer's selection (full) or the previous layer's
  // (shared).
  void dsa_attention(const DsaWeights& w, DsaCache& cache, Position first, const Tensor& x,
                     Tensor& picked, Tensor& y);
  // Glm5NextTextIndexer (M:797-880): appends this call's indexer rows, compresses the pools they
  // complete, and picks each query's best visible pools (the attention adds the unfinished tail
  // pool, M:977-1027).
  void dsa_indexer(const DsaIndexerWeights& w, DsaCache& cache, Position first, const Tensor& x,
                   const Tensor& q_resid, Tensor& picked);

  Glm5Config config_;
  Glm5Weights weights_;
  std::unique_ptr<Backend> backend_;
  ModelInfo info_;
  std::unique_ptr<MtpHead> mtp_;
};

}  // namespace fs
