// The GLM 5.3 Flash MTP layer (arch-glm.md 5). HF has no module for it (it drops the keys
// `layers.<num_hidden_layers>.*`); this follows the GLM / DeepSeek-V3 convention, unverified
// against a released checkpoint:
//   x      = eh_proj([enorm(embed(x_t)) | hnorm(h_{t-1})])   (the embedding half first)
//   x     += dsa_attention(input_layernorm(x))   own DsaCache with its own indexer (the history)
//   x     += MoE(post_attention_layernorm(x))    one plain pre-norm block, no hyper-connections
//   logits = lm_head(shared_head.norm(x)), and x is the hidden of the next depth.
// h_{t-1} is the trunk's final hidden (the stream mean after the final norm). Row t of the
// history (t >= 1) sits at position t-1.
#pragma once

#include "model/common/mtp_head_base.h"
#include "model/glm5/weights.h"

namespace fs {

class Glm5Model;

class Glm5MtpHead final : public MtpHeadBase {
 public:
  Glm5MtpHead(Glm5Model& model, const Glm5MtpWeights& weights);

  std::unique_ptr<ModelState> new_history() const override;
  std::int64_t hidden_width() const override;
  Status forward_rows(ModelState& history, const Tensor& hidden, std::span<const TokenId> tokens,
                      LogitsRows rows, ForwardOutput& out) override;

 protected:
  Backend& head_backend() const override;

 private:
  Glm5Model& model_;
  const Glm5MtpWeights& w_;
};

}  // namespace fs
