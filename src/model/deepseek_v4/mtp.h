// The DeepSeek V4 MTP block as an MTP head (arch-dsv4.md 4; HF has none, ds4's structure):
//   x_s    = e_proj(enorm(embed(x_t))) + h_proj(hnorm(h_{t-1, s}))   for each hc stream s
//   x      = one decoder layer (sliding attention on the main rope, score-routed MoE), with its
//            own sliding cache (the history)
//   logits = lm_head(norm(hc_head(x))) with the trunk's lm_head; x is the hidden of the next depth.
// The head pairs h_{t-1} with the token x_t (the generator's contract, the DeepSeek-V3 training
// alignment; ds4 pairs h_p with x_p instead, digest 4). Row t of the history (t >= 1) sits at
// position t-1: attention only sees relative positions, so the offset changes nothing.
#pragma once

#include "model/common/mtp_head_base.h"
#include "model/deepseek_v4/weights.h"

namespace fs {

class DeepseekV4Model;

class DeepseekV4MtpHead final : public MtpHeadBase {
 public:
  DeepseekV4MtpHead(DeepseekV4Model& model, const DsMtpWeights& weights);

  std::unique_ptr<ModelState> new_history() const override;
  std::int64_t hidden_width() const override;
  Status forward_rows(ModelState& history, const Tensor& hidden, std::span<const TokenId> tokens,
                      LogitsRows rows, ForwardOutput& out) override;

 protected:
  Backend& head_backend() const override;

 private:
  DeepseekV4Model& model_;
  const DsMtpWeights& w_;
};

}  // namespace fs
