// DeepSeek V4's MTP block (arch-dsv4.md 4) on the hf-tiny fixture with random mtp.0.* weights
// (tools/make_ds4_mtp.py: HF has no MTP module, so no reference): the head loads and drafts;
// greedy MTP decoding emits the autoregressive tokens at every depth; drafts rejected part-way
// roll the caches back in place (inside their slack) and leave the cold-prefill state of the
// committed tokens, trunk and MTP history alike.
#include <gtest/gtest.h>

#include "decode/drafter.h"
#include "decode/generator.h"
#include "decode/sampler.h"
#include "model/loader.h"
#include "qwen_fixture.h"
#include "test_backend.h"
#include "test_support.h"

namespace fs {
namespace {

class DeepseekV4Mtp : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::ScratchDir;  // NOLINT: suite-lifetime fixture
    const auto out = dir_->file("ds4-mtp");
    std::string text;
    ASSERT_EQ(test::run_command("python3 " FLASHSERVE_SOURCE_DIR "/tools/make_ds4_mtp.py --model " +
                                    test::hf_tiny("deepseek_v4") + " --out " + out,
                                &text),
              0)
        << text;
    auto m = load_model(out, test::test_load_options());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;  // NOLINT: suite-lifetime fixture
    model_ = nullptr;
    delete dir_;  // NOLINT
    dir_ = nullptr;
  }
  static Model* model_;
  static test::ScratchDir* dir_;

  DecodeState prefill(std::span<const TokenId> tokens) {
    DecodeState s = new_decode_state(*model_);
    const Status st = extend(*model_, s, tokens);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return s;
  }
  static std::vector<TokenId> tokens() {
    return test::qwen_cases(test::hf_tiny("deepseek_v4")).back().tokens;
  }
};
Model* DeepseekV4Mtp::model_ = nullptr;
test::ScratchDir* DeepseekV4Mtp::dir_ = nullptr;

TEST_F(DeepseekV4Mtp, HeadLoadsAndDrafts) {
  ASSERT_NE(model_, nullptr);
  EXPECT_TRUE(model_->info().has_mtp);
  MtpHead* head = model_->mtp();
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->hidden_width(), 2 * 64);  // hc_mult x hidden_size of the fixture
  const auto all = tokens();
  auto state = model_->new_state();
  ForwardOutput trunk;
  ASSERT_TRUE(model_->forward(*state, {all.data(), 10}, LogitsRows::kAll, trunk).ok());
  ASSERT_EQ(trunk.hidden_width, head->hidden_width());
  ASSERT_EQ(trunk.hidden.size(), 10u * 128u);
  // Rows (h_{t-1}, x_t) for t = 1..9, in one call or one row at a time: the same logits.
  auto history = head->new_history();
  ForwardOutput one;
  const std::span<const float> h(trunk.hidden.data(), 9 * 128);
  ASSERT_TRUE(head->forward(*history, h, {all.data() + 1, 9}, LogitsRows::kAll, one).ok());
  auto stepwise = head->new_history();
  std::vector<float> rows;
  for (std::size_t t = 0; t < 9; ++t) {
    ForwardOutput o;
    ASSERT_TRUE(head->forward(*stepwise, h.subspan(t * 128, 128), {all.data() + 1 + t, 1},
                              LogitsRows::kAll, o)
                    .ok());
    rows.insert(rows.end(), o.logits.begin(), o.logits.end());
  }
  EXPECT_LE(test::diff_logits(rows, one.logits, 256).max_abs, 1e-4);
  EXPECT_EQ(one.hidden.size(), 9u * 128u);
  EXPECT_FALSE(head->set_draft_vocabulary(257).ok());
  ASSERT_TRUE(head->set_draft_vocabulary(100).ok());
  ForwardOutput cut;
  auto h2 = head->new_history();
  ASSERT_TRUE(head->forward(*h2, h, {all.data() + 1, 9}, LogitsRows::kLast, cut).ok());
  EXPECT_EQ(cut.logits.size(), 100u);
  ASSERT_TRUE(head->set_draft_vocabulary(0).ok());
}

TEST_F(DeepseekV4Mtp, GreedyMtpEmitsTheAutoregressiveTokens) {
  ASSERT_NE(model_, nullptr);
  const auto all = tokens();
  for (std::size_t length : {5, 23, 61}) {
    const std::span<const TokenId> prompt(all.data(), length);
    GenerateOptions opt;
    opt.max_tokens = 20;
    DecodeState ar_state = prefill(prompt);
    const auto ar = generate(*model_, ar_state, opt);
    ASSERT_TRUE(ar.error.ok()) << ar.error.to_string();
    for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
      opt.mtp_depth = depth;
      DecodeState s = prefill(prompt);
      const auto r = generate(*model_, s, opt);
      ASSERT_TRUE(r.error.ok()) << r.error.to_string();
      EXPECT_EQ(r.tokens, ar.tokens) << "prompt " << length << " depth " << depth;
      EXPECT_TRUE(r.state_complete);
    }
  }
}

// The same under the official numerics (FP8 on the MTP block's own sliding rows too): the
// verify's multi-token forwards and the autoregressive single-token ones agree on every token.
TEST_F(DeepseekV4Mtp, GreedyMtpEmitsTheAutoregressiveTokensUnderOfficialNumerics) {
  ASSERT_NE(model_, nullptr);
  auto options = test::test_load_options();
  options.numerics = "official";
  auto loaded = load_model(dir_->file("ds4-mtp"), options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  Model& m = **loaded;
  const auto all = tokens();
  for (std::size_t length : {5, 23, 61}) {
    const std::span<const TokenId> prompt(all.data(), length);
    GenerateOptions opt;
    opt.max_tokens = 20;
    DecodeState ar_state = new_decode_state(m);
    ASSERT_TRUE(extend(m, ar_state, prompt).ok());
    const auto ar = generate(m, ar_state, opt);
    ASSERT_TRUE(ar.error.ok()) << ar.error.to_string();
    for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
      opt.mtp_depth = depth;
      DecodeState s = new_decode_state(m);
      ASSERT_TRUE(extend(m, s, prompt).ok());
      const auto r = generate(m, s, opt);
      ASSERT_TRUE(r.error.ok()) << r.error.to_string();
      EXPECT_EQ(r.tokens, ar.tokens) << "prompt " << length << " depth " << depth;
      EXPECT_TRUE(r.state_complete);
    }
  }
}

// Drafts from the model's own greedy continuation (accepted in greedy mode), wrong at one depth:
// every verify keeps some drafts and rolls the rest back.
ScriptedDrafter oracle(Model& model, int wrong_at) {
  return ScriptedDrafter(
      [&model, wrong_at](const std::vector<TokenId>& committed, TokenId primary, int depth) {
        auto state = model.new_state();
        ForwardOutput out;
        std::vector<TokenId> seq = committed;
        seq.push_back(primary);
        EXPECT_TRUE(model.forward(*state, seq, LogitsRows::kLast, out).ok());
        std::vector<TokenId> drafts;
        for (int d = 0; d < depth; ++d) {
          TokenId t = argmax(out.logits);
          if (d == wrong_at) t = (t + 1) % static_cast<TokenId>(model.info().vocab_size);
          drafts.push_back(t);
          const TokenId in[1] = {t};
          EXPECT_TRUE(model.forward(*state, in, LogitsRows::kLast, out).ok());
        }
        return drafts;
      });
}

TEST_F(DeepseekV4Mtp, PartialAcceptanceRewindsInPlaceToTheColdPrefillState) {
  ASSERT_NE(model_, nullptr);
  const auto all = tokens();
  // Past the sliding window and several CSA/HCA windows, so rollbacks cross window closes.
  const std::span<const TokenId> prompt(all.data(), 37);
  GenerateOptions opt;
  opt.max_tokens = 24;
  DecodeState ar_state = prefill(prompt);
  const auto ar = generate(*model_, ar_state, opt);
  ASSERT_TRUE(ar.error.ok()) << ar.error.to_string();
  for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
    for (const int wrong_at : {0, 1, 2}) {
      if (wrong_at >= depth) continue;
      opt.mtp_depth = depth;
      ScriptedDrafter scripted = oracle(*model_, wrong_at);
      opt.drafter = &scripted;
      DecodeState s = prefill(prompt);
      const auto r = generate(*model_, s, opt);
      ASSERT_TRUE(r.error.ok()) << r.error.to_string();
      EXPECT_EQ(r.tokens, ar.tokens) << "depth " << depth << " wrong at " << wrong_at;
      EXPECT_GT(r.stats.rollbacks, 0) << "depth " << depth;
      EXPECT_EQ(r.stats.rewinds, r.stats.rollbacks) << "depth " << depth;
      ASSERT_TRUE(r.state_complete);
      DecodeState cold = prefill(s.tokens);
      EXPECT_LE(max_difference(compare_states(*s.trunk, *cold.trunk)), 1e-4) << "depth " << depth;
      EXPECT_LE(max_difference(compare_states(*s.mtp_history, *cold.mtp_history)), 1e-4);
    }
  }
}

}  // namespace
}  // namespace fs
