// Qwen 3.8 Flash Next state: any split of a sequence into calls gives the state and logits of
// one call; caches serialise, clone, truncate and count tokens as the LayerCache contract says;
// the PLE n-gram ids match the hand-computed vector of arch-qwen.md section 7.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "model/common/ngram_hash.h"
#include "model/loader.h"
#include "model/qwen_next/config.h"
#include "model/qwen_next/forward.h"
#include "model/qwen_next/state.h"
#include "qwen_fixture.h"
#include "test_backend.h"
#include "test_support.h"

namespace fs {
namespace {

using test::diff_logits;
using test::hf_tiny;
using test::run_splits;

std::unique_ptr<Model> tiny_model() {
  auto m = load_model(hf_tiny("qwen4_exp"), test::test_load_options());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::vector<TokenId> long_tokens() {
  return test::qwen_cases().back().tokens;
}

// Chunked and recurrent GDN forms, and different chunkings, differ only in fp32 rounding. The
// recurrent caches (GDN state and conv tail, PLE tail) stay within 1e-6 of the one-call state.
// The attention caches of layer 3 hold keys after a per-head RMSNorm of 16 values times (1 + w),
// which amplifies the ~1e-6 differences of its input about 30x: measured up to 3.7e-5 on keys of
// magnitude 3.6 (relative 1e-5, the oracle's own incremental-vs-full noise is 1.2e-5 on logits).
constexpr double kRecurrentStateTolerance = 1e-5;
constexpr double kAttentionStateTolerance = 1e-4;
constexpr double kLogitsTolerance = 1e-4;

double tolerance_for(const std::string& tensor_name) {
  return tensor_name.find(".qsa.") != std::string::npos ? kAttentionStateTolerance
                                                        : kRecurrentStateTolerance;
}

class QwenSplits : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenSplits, SplitsGiveTheStateAndLogitsOfOneCall) {
  const auto dir = GetParam() == "shared" ? hf_tiny("qwen4_exp") : test::qwen_variant_fixture();
  auto model = load_model(dir, test::test_load_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto& m = *model;
  const auto tokens = test::qwen_cases(dir).back().tokens;
  const auto L = static_cast<std::int64_t>(tokens.size());
  auto whole = m->new_state();
  const auto ref = run_splits(*m, *whole, tokens, {L});
  std::vector<std::int64_t> singles(static_cast<std::size_t>(L), 1);
  // Odd sizes across the 64-token GDN chunks and the 4-token indexer blocks; the last call takes
  // the rest.
  std::vector<std::vector<std::int64_t>> plans = {
      singles, {1, 2, 3, 58, 1, 1, 5}, {63, 2, 3}, {4, 4, 61, 3}};
  for (std::size_t i = 1; i < plans.size(); ++i) {
    std::int64_t used = 0;
    for (const auto n : plans[i]) used += n;
    plans[i].push_back(L - used);
  }
  for (const auto& plan : plans) {
    auto state = m->new_state();
    const auto got = run_splits(*m, *state, tokens, plan);
    const auto d = diff_logits(got, ref, m->info().vocab_size);
    const auto diffs = compare_states(*state, *whole);
    const double sd = max_difference(diffs);
    std::printf("[split %s] %zu calls: state max|d|=%.3g logits max|d|=%.3g\n", GetParam().c_str(),
                plan.size(), sd, d.max_abs);
    double recurrent = 0, attention = 0;
    for (const auto& t : diffs) {
      EXPECT_LE(t.max_abs, tolerance_for(t.name)) << t.name;
      (tolerance_for(t.name) == kRecurrentStateTolerance ? recurrent : attention) = std::max(
          tolerance_for(t.name) == kRecurrentStateTolerance ? recurrent : attention, t.max_abs);
    }
    std::printf("  recurrent caches max|d|=%.3g attention caches max|d|=%.3g\n", recurrent,
                attention);
    EXPECT_LE(d.max_abs, kLogitsTolerance);
    EXPECT_EQ(d.argmax_mismatches, 0);
    for (const auto& t : diffs) EXPECT_FALSE(t.shape_mismatch) << t.name;
    EXPECT_EQ(*state->covered_tokens(), L);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QwenSplits, ::testing::Values("shared", "variant"));

// keep_positions (an MTP verify): a forward whose recurrent caches kept their positions truncates
// in place to any length inside it and gives the state, and the next logits, of a forward of only
// that prefix; outside the window, after a later forward, or on a clone, the recurrent caches
// refuse as before.
class QwenWindows : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenWindows, KeptPositionsTruncateToThePrefixState) {
  const auto dir = GetParam() == "shared" ? hf_tiny("qwen4_exp") : test::qwen_variant_fixture();
  auto model = load_model(dir, test::test_load_options());
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  auto& m = *model;
  const auto tokens = test::qwen_cases(dir).back().tokens;
  const auto span_of = [&](std::int64_t from, std::int64_t to) {
    return std::vector<TokenId>(tokens.begin() + from, tokens.begin() + to);
  };
  const std::int64_t P = 21, S = 4;  // the verify crosses an indexer block boundary (block 4)
  const auto keep_all = [](ModelState& s, std::int64_t n) {
    int recurrent = 0;
    for (std::size_t i = 0; i < s.cache_count(); ++i) recurrent += s.cache(i).keep_positions(n);
    return recurrent;
  };
  const TokenId next[1] = {tokens[40]};
  for (std::int64_t keep = 1; keep < S; ++keep) {
    auto s = m->new_state();
    run_splits(*m, *s, span_of(0, P), {P});
    EXPECT_GT(keep_all(*s, S), 0);
    run_splits(*m, *s, span_of(P, P + S), {S});
    ASSERT_TRUE(s->truncate(P + keep).ok()) << "keep " << keep;
    EXPECT_EQ(*s->covered_tokens(), P + keep);
    auto ref = m->new_state();
    run_splits(*m, *ref, span_of(0, P + keep), {P, keep});
    for (const auto& t : compare_states(*s, *ref)) {
      EXPECT_FALSE(t.shape_mismatch) << t.name;
      EXPECT_LE(t.max_abs, tolerance_for(t.name)) << t.name << " keep " << keep;
    }
    ForwardOutput a, b;
    ASSERT_TRUE(m->forward(*s, next, LogitsRows::kLast, a).ok());
    ASSERT_TRUE(m->forward(*ref, next, LogitsRows::kLast, b).ok());
    const auto d = diff_logits(a.logits, b.logits, m->info().vocab_size);
    EXPECT_LE(d.max_abs, kLogitsTolerance) << "keep " << keep;
    EXPECT_EQ(d.argmax_mismatches, 0);
  }
  auto s = m->new_state();
  run_splits(*m, *s, span_of(0, P), {P});
  keep_all(*s, S);
  run_splits(*m, *s, span_of(P, P + S), {S});
  auto copy = s->clone();
  EXPECT_EQ(copy->truncate(P + 1).code(), ErrorCode::kFailedPrecondition);  // a clone keeps none
  EXPECT_EQ(s->truncate(P).code(), ErrorCode::kFailedPrecondition);  // before the window's token 0
  EXPECT_EQ(*s->covered_tokens(), P + S);
  run_splits(*m, *s, span_of(P + S, P + S + 1), {1});  // a forward without a request
  EXPECT_EQ(s->truncate(P + S - 1).code(), ErrorCode::kFailedPrecondition);
  // A request larger than the forward keeps it; a smaller one does not.
  keep_all(*s, 1);
  run_splits(*m, *s, span_of(P + S + 1, P + S + 3), {2});
  EXPECT_EQ(s->truncate(P + S + 2).code(), ErrorCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, QwenWindows, ::testing::Values("shared", "variant"));

TEST(QwenState, TensorsLoadRoundTrip) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto tokens = long_tokens();
  auto a = m->new_state();
  run_splits(*m, *a, tokens, {37});
  auto b = m->new_state();
  for (std::size_t i = 0; i < a->cache_count(); ++i) {
    const auto ts = copy_to_host(a->cache(i));
    ASSERT_TRUE(b->cache(i).load(ts.views, a->cache(i).covered_tokens()).ok())
        << a->cache(i).kind();
  }
  EXPECT_EQ(*b->covered_tokens(), 37);
  EXPECT_EQ(max_difference(compare_states(*a, *b)), 0.0);
  EXPECT_EQ(a->bytes(), b->bytes());
  // Continuing from the loaded state is exactly continuing from the original.
  const std::vector<TokenId> rest(tokens.begin() + 37, tokens.end());
  const auto rest_size = static_cast<std::int64_t>(rest.size());
  EXPECT_EQ(run_splits(*m, *a, rest, {rest_size}), run_splits(*m, *b, rest, {rest_size}));
}

TEST(QwenState, LoadRejectsWrongShapesAndNames) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto s = m->new_state();
  auto& gdn = s->cache(0);
  ASSERT_EQ(gdn.kind(), "gdn");
  std::vector<float> data(3, 0.0f);
  const std::vector<StateTensorView> bad = {{"recurrent", {3}, data}, {"conv_tail", {3}, data}};
  EXPECT_FALSE(gdn.load(bad, 1).ok());
  EXPECT_FALSE(gdn.load({}, 0).ok());
  // A QSA cache of 5 tokens cannot take tensors of 4.
  auto a = m->new_state();
  const auto tokens = long_tokens();
  run_splits(*m, *a, tokens, {4});
  auto& qsa = a->cache(a->cache_count() - 1);
  ASSERT_EQ(qsa.kind(), "qsa");
  const auto ts = copy_to_host(qsa);
  EXPECT_FALSE(s->cache(s->cache_count() - 1).load(ts.views, 5).ok());
  EXPECT_TRUE(s->cache(s->cache_count() - 1).load(ts.views, 4).ok());
}

TEST(QwenState, CloneIsIndependent) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto tokens = long_tokens();
  auto a = m->new_state();
  run_splits(*m, *a, tokens, {20});
  auto snapshot = a->clone();
  auto b = a->clone();
  run_splits(*m, *b, {tokens.begin() + 20, tokens.begin() + 30}, {10});
  EXPECT_EQ(*b->covered_tokens(), 30);
  EXPECT_EQ(*a->covered_tokens(), 20);
  EXPECT_EQ(max_difference(compare_states(*a, *snapshot)), 0.0);
  EXPECT_GT(max_difference(compare_states(*a, *b)), 0.0);  // shapes differ for qsa: mismatch
}

TEST(QwenState, TruncateSemantics) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto tokens = long_tokens();
  auto a = m->new_state();
  run_splits(*m, *a, tokens, {22});
  auto b = m->new_state();
  run_splits(*m, *b, tokens, {18});
  for (std::size_t i = 0; i < a->cache_count(); ++i) {
    auto& c = a->cache(i);
    EXPECT_TRUE(c.truncate(22).ok()) << c.kind();  // to its own length: always fine
    const auto s = c.truncate(18);
    if (c.kind() == "qsa") {
      ASSERT_TRUE(s.ok());
      EXPECT_EQ(c.covered_tokens(), 18);
      // An attention cache truncated to 18 is the cache of the 18-token prefix (blocks included).
      std::vector<std::unique_ptr<LayerCache>> one, other;
      one.push_back(c.clone());
      other.push_back(b->cache(i).clone());
      // (Rows were computed in a call of 22 vs 18 tokens: equal up to fp32 rounding.)
      EXPECT_LE(
          max_difference(compare_states(ModelState(std::move(one)), ModelState(std::move(other)))),
          kAttentionStateTolerance);
      EXPECT_FALSE(c.truncate(19).ok());
    } else {
      EXPECT_EQ(s.code(), ErrorCode::kFailedPrecondition) << c.kind();
      EXPECT_EQ(c.covered_tokens(), 22);
    }
  }
  // The recurrent caches now disagree with the truncated ones: covered_tokens() says so.
  EXPECT_FALSE(a->covered_tokens().ok());
  // ModelState::truncate refuses as a whole and changes nothing.
  auto whole = m->new_state();
  run_splits(*m, *whole, tokens, {22});
  auto before = whole->clone();
  EXPECT_EQ(whole->truncate(18).code(), ErrorCode::kFailedPrecondition);
  EXPECT_EQ(*whole->covered_tokens(), 22);
  EXPECT_EQ(max_difference(compare_states(*whole, *before)), 0.0);
  EXPECT_TRUE(whole->truncate(22).ok());
  auto fresh = m->new_state();
  EXPECT_EQ(*fresh->covered_tokens(), 0);
  EXPECT_TRUE(fresh->truncate(0).ok());
  EXPECT_FALSE(fresh->truncate(1).ok());
}

// A memory with nothing left: every allocation fails.
class ExhaustedMemory final : public Memory {
 public:
  Device device() const override { return Device::kHost; }
  void* allocate(std::size_t) override { return nullptr; }
  void release(void*, std::size_t) override {}
  void to_host(void*, const void*, std::size_t) override {}
  void from_host(void*, const void*, std::size_t) override {}
  void copy(void*, const void*, std::size_t) override {}
  void zero(void*, std::size_t) override {}
};

// A state whose memory ran out while it was built is refused by the forward, naming the tensor,
// instead of handing a kernel a buffer that is not there.
TEST(QwenState, ForwardRefusesAStateWhoseAllocationFailed) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto s = m->new_state();
  ASSERT_TRUE(s->check_allocated().ok());
  const auto& config = dynamic_cast<const QwenNextModel&>(*m).config();
  s->replace_cache(
      0, std::make_unique<GatedDeltaNetCache>(config, std::make_shared<ExhaustedMemory>()));
  const std::vector<TokenId> ok = {1, 2};
  ForwardOutput out;
  const Status st = m->forward(*s, ok, LogitsRows::kAll, out);
  EXPECT_EQ(st.code(), ErrorCode::kOutOfRange);
  EXPECT_NE(st.message().find("0.gdn.recurrent"), std::string::npos) << st.to_string();
}

TEST(QwenState, ForwardRejectsBadTokensAndForeignStates) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  auto s = m->new_state();
  ForwardOutput out;
  const std::vector<TokenId> bad = {1, 256};
  EXPECT_EQ(m->forward(*s, bad, LogitsRows::kAll, out).code(), ErrorCode::kInvalidArgument);
  ModelState empty;
  const std::vector<TokenId> ok = {1, 2};
  EXPECT_FALSE(m->forward(empty, ok, LogitsRows::kAll, out).ok());
  // The state of another model (the variant has more layers and PLE caches) is refused untouched.
  auto variant = load_model(test::qwen_variant_fixture(), test::test_load_options());
  ASSERT_TRUE(variant.ok());
  auto foreign = (*variant)->new_state();
  auto before = foreign->clone();
  EXPECT_FALSE(m->forward(*foreign, ok, LogitsRows::kAll, out).ok());
  EXPECT_EQ(max_difference(compare_states(*foreign, *before)), 0.0);
  // kLast returns the last row of kAll.
  auto s1 = m->new_state();
  auto s2 = m->new_state();
  ForwardOutput all, last;
  ASSERT_TRUE(m->forward(*s1, ok, LogitsRows::kAll, all).ok());
  ASSERT_TRUE(m->forward(*s2, ok, LogitsRows::kLast, last).ok());
  ASSERT_EQ(last.rows, 1);
  const std::vector<float> tail(all.logits.begin() + 256, all.logits.end());
  EXPECT_LE(diff_logits(last.logits, tail, 256).max_abs, 1e-6);
}

// arch-qwen.md section 7: tokens [5,7,1,9,11,13], eos 1, fresh context.
TEST(QwenNgram, IdsMatchHandComputedVector) {
  auto desc = describe_model(hf_tiny("qwen4_exp"));
  ASSERT_TRUE(desc.ok());
  const auto& c = std::get<QwenNextConfig>(desc->config);
  NgramHashTable t;
  t.ngram_size = c.ngram_size;
  t.heads_per_ngram = c.heads_per_ngram;
  t.eos = 1;
  t.head_sizes = ple_head_vocab_sizes(c, 0);
  std::int64_t off = 0;
  for (const auto s : t.head_sizes) {
    t.head_offsets.push_back(off);
    off += s;
  }
  t.multipliers = ngram_layer_multipliers(c.vocab_size, c.ngram_size, 0, c.seed);
  EXPECT_EQ(t.head_sizes, (std::vector<std::int64_t>{101, 103, 107, 109}));
  EXPECT_EQ(t.multipliers,
            (std::vector<std::int64_t>{4295158889762567, 35454616657218897, 19285316470915801}));
  const std::vector<TokenId> tokens = {5, 7, 1, 9, 11, 13};
  const std::vector<std::int64_t> expected = {33, 147, 239, 394, 97, 130, 269, 386,
                                              97, 124, 271, 410, 58, 122, 285, 405,
                                              38, 187, 221, 334, 68, 173, 263, 320};
  std::vector<std::int64_t> ctx(2, 1), ids;
  ngram_ids(t, ctx, tokens, ids);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(ctx, (std::vector<std::int64_t>{11, 13}));
  // The same ids when fed as calls of 3, 1 and 2 tokens.
  std::vector<std::int64_t> ctx2(2, 1), all, part;
  std::size_t at = 0;
  for (const std::size_t n : {3, 1, 2}) {
    ngram_ids(t, ctx2, std::span(tokens).subspan(at, n), part);
    all.insert(all.end(), part.begin(), part.end());
    at += n;
  }
  EXPECT_EQ(all, expected);
}

}  // namespace
}  // namespace fs
