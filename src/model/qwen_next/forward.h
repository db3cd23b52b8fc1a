// The Qwen 3.8 Flash Next trunk (HF qwen4_exp, arch-qwen.md section 2) on the backend op
// interface: embeddings repeated into hc streams, then per layer
//   [ple_inject] -> hyper_connection_read -> gated_delta_net | qsa_attention -> write
//                -> hyper_connection_read -> moe -> write,
// then the final mixer and lm_head.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/model.h"
#include "model/mtp.h"
#include "model/qwen_next/config.h"
#include "model/qwen_next/state.h"
#include "model/qwen_next/weights.h"

namespace fs {

class QwenNextModel final : public Model {
 public:
  QwenNextModel(QwenNextConfig config, QwenNextWeights weights, std::unique_ptr<Backend> backend);
  ~QwenNextModel() override;

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<ModelState> new_state() const override {
    return new_qwen_next_state(config_, backend_->memory());
  }
  Status forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                 ForwardOutput& out, HiddenRows hidden = HiddenRows::kHost) override;

  const QwenNextConfig& config() const { return config_; }
  const Backend& backend() const { return *backend_; }
  // Mutable access for tests and tools that switch backend modes (step graphs on or off).
  Backend& mutable_backend() { return *backend_; }
  MtpHead* mtp() override { return mtp_.get(); }
  Backend* backend() override { return backend_.get(); }

 private:
  friend class QwenNextMtpHead;
  struct LayerCaches {
    GatedDeltaNetCache* gdn = nullptr;
    PleCache* ple = nullptr;
    QsaCache* qsa = nullptr;
  };
  // One decoder layer on the widened stream h [S, hc*H] (Q4M 1273-1310):
  // [ple_inject] -> read -> gated_delta_net | qsa_attention -> write -> read -> moe -> write.
  void decoder_layer(const QwenLayerWeights& lw, const LayerCaches& caches, Position first,
                     std::span<const TokenId> tokens, Tensor& h);

  // One function per block, named as the reference names them. `h` is [S, hc*H], `x` [S, H].
  void ple_inject(const PleWeights& w, PleCache& cache, std::span<const TokenId> tokens, Tensor& h);
  void keep_conv_inputs(const Tensor& tail, const Tensor& inputs, SpeculationWindow& window);
  // The sublayers write their output y into the streams (`out`, the hyper-connection write).
  void gated_delta_net(const GatedDeltaNetWeights& w, GatedDeltaNetCache& cache, const Tensor& x,
                       const StreamsWrite& out);
  // Queries are at positions first, first + 1, ...
  void qsa_attention(const QsaWeights& w, QsaCache& cache, Position first, const Tensor& x,
                     const StreamsWrite& out);
  // The indexer's block selection for the current queries (Q4M 693-779), picked [S, budget/c]
  // int32 in backend memory; updates the cache's raw keys and pooled blocks. `qk` is x's index
  // projection (x · index_qk_proj^T, from qsa_projections with the attention's own).
  void qsa_indexer(const QsaWeights& w, QsaCache& cache, Position first, const Tensor& qk,
                   Tensor& picked);
  QwenNextConfig config_;
  QwenNextWeights weights_;
  std::unique_ptr<Backend> backend_;
  ModelInfo info_;
  std::unique_ptr<MtpHead> mtp_;
};

}  // namespace fs
