// The Qwen 3.8 Flash Next MTP head (docs/MTP.md). The reference has none for this family; this is
// flashserve's definition, the one tools/train_tiny.py trains and MTPLX's reconstruction from the
// released tensor shapes describes (mtplx.md 3.2):
//   n      = grouped (1+w) RMSNorm of the trunk's widened stream h_{t-1}        [hc*H]
//   x_s    = fc_hidden(n_s) + fc_embedding(RMSNorm(embed(x_t)))   for each stream s
//   x      = one QSA + MoE decoder layer with both hyper-connections, own QsaCache (the history)
//   logits = lm_head(mixer(x)), and x (pre-mixer) is the hidden of the next depth.
// Row t of the history (t >= 1) sits at position t-1.
#pragma once

#include "model/common/mtp_head_base.h"
#include "model/qwen_next/weights.h"

namespace fs {

class QwenNextModel;

class QwenNextMtpHead final : public MtpHeadBase {
 public:
  QwenNextMtpHead(QwenNextModel& model, const QwenMtpWeights& weights);

  std::unique_ptr<ModelState> new_history() const override;
  std::int64_t hidden_width() const override;
  Status forward_rows(ModelState& history, const Tensor& hidden, std::span<const TokenId> tokens,
                      LogitsRows rows, ForwardOutput& out) override;

 protected:
  Backend& head_backend() const override;

 private:
  QwenNextModel& model_;
  const QwenMtpWeights& w_;
};

}  // namespace fs
