// A tiny deterministic model for decode and session tests: a recurrent cache that cannot be
// truncated (like GatedDeltaNet), a KV-like cache that can (like attention), and an MTP head
// with its own history. Every token is processed in the same order whatever the split, so a
// warm state and a cold prefill agree bitwise and any bookkeeping error shows.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/mtp.h"

namespace fs::test {

struct ToyConfig {
  std::int64_t vocab = 12;
  std::int64_t width = 4;
  float logit_scale = 3.0f;  // larger: more peaked distributions
  std::uint32_t seed = 7;
  bool with_mtp = true;
};

class ToyModel : public Model {
 public:
  explicit ToyModel(ToyConfig config = {});
  ~ToyModel() override;

  const ModelInfo& info() const override { return info_; }
  std::unique_ptr<ModelState> new_state() const override;
  Status forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                 ForwardOutput& out, HiddenRows hidden = HiddenRows::kHost) override;
  MtpHead* mtp() override;

  // Test hooks: count forwards; make the n-th forward from now fail.
  std::int64_t forwards = 0;
  std::int64_t fail_in = -1;

  // Pieces shared with the head (public for it; not part of any interface).
  const ToyConfig& config() const { return config_; }
  float embed(TokenId t, std::int64_t i) const;
  void step(std::span<const float> h_in, TokenId t, std::span<float> h_out) const;
  void logits(std::span<const float> h, std::span<const float> context_mean,
              std::span<float> out) const;

 private:
  ToyConfig config_;
  ModelInfo info_;
  std::vector<float> embed_, a_, w_out_, u_;
  std::unique_ptr<MtpHead> head_;
};

}  // namespace fs::test
