// DeepSeek V4 (deepseek_v4) on the backend under test: logits parity with the HF reference
// (float64 logits of the hf-tiny deepseek_v4 fixture: sliding, CSA with a truncating indexer,
// HCA, hash and score-routed MoE) for one call and the golden incremental splits; any split of
// a prefill gives the logits and state of one call; the caches truncate inside their rollback
// slack, refuse past it, and reload from host copies; YaRN's frequencies are the reference's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "backend/quant_simulation.h"
#include "decode/generator.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/numerics.h"
#include "model/deepseek_v4/rope.h"
#include "model/deepseek_v4/state.h"
#include "model/family.h"
#include "model/loader.h"
#include "qwen_fixture.h"
#include "session/checkpoint.h"
#include "test_backend.h"
#include "test_support.h"

namespace fs {
namespace {

using test::diff_logits;
using test::hf_tiny;
using test::run_splits;

std::string fixture() {
  return hf_tiny("deepseek_v4");
}

std::unique_ptr<Model> tiny_model(const std::string& numerics = "hf") {
  auto options = test::test_load_options();
  options.numerics = numerics;
  auto m = load_model(fixture(), options);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

// The bound on the f32 engine against the float64 reference.
constexpr double kParityTolerance = 1e-3;
// Different splits reorder fp32 sums (the products' blocking, the pooling of a window split
// across calls is not: rows are pooled from the same projections); states and logits agree to
// rounding.
constexpr double kSplitTolerance = 1e-4;
// The official numerics against HF's reference, bounds over the measured figures (CPU, L=64 /
// 160: max |d| 2.49 / 2.72 of logits up to 3.89 / 4.43, mean |d| 0.226 / 0.245, argmax equal on
// 64% / 58% of rows; chance is 1/256). The fixture's random weights leave near-ties everywhere:
// a KV rounding moves the indexer's top-4 picks and the argmax among flat logits. With 7
// mantissa bits instead of E4M3's 3 the mean falls about tenfold, the max stays near 1-2.6
// (the picks).
constexpr double kOfficialBound = 3.5;
constexpr double kOfficialMeanBound = 0.35;
constexpr double kOfficialArgmaxAgreement = 0.5;
// Splits under the official numerics: the share of state values a rounding flip may move, and
// a bound on the mean |logits difference| (measured on the CPU: 1 of 7,360 values moved, 18 in
// the 4-call split; mean |d| 0.0017-0.0022; max |d| 0.92 in the rows after the flip).
constexpr double kOfficialSplitFlips = 5e-3;
constexpr double kOfficialSplitMeanLogits = 0.01;

// The shared hf-tiny fixture, and tests/fixtures/deepseek_v4_variant (tools/oracle/
// family_variant_oracle.py: a 16-token window, HCA ratio 8 over 280 tokens, YaRN on the compressed
// branches, 4 hyper-connection streams, 4 output groups, single-token and straddling schedules).
class DeepseekV4ParityAll : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepseekV4ParityAll, FullAndIncrementalMatchReference) {
  const auto dir = GetParam() == "shared"
                       ? fixture()
                       : std::string(FLASHSERVE_SOURCE_DIR) + "/tests/fixtures/deepseek_v4_variant";
  auto m = load_model(dir, test::test_load_options());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->info().family, Family::kDeepseekV4);
  const auto V = (*m)->info().vocab_size;
  const auto cases = test::qwen_cases(dir);
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const auto L = static_cast<std::int64_t>(c.tokens.size());
    auto full_state = (*m)->new_state();
    const auto full = run_splits(**m, *full_state, c.tokens, {L});
    const auto df = diff_logits(full, c.full, V);
    auto inc_state = (*m)->new_state();
    const auto inc = run_splits(**m, *inc_state, c.tokens, c.splits);
    const auto di = diff_logits(inc, c.inc, V);
    std::printf("[ds4 parity %s %s] L=%lld full max|d|=%.3g inc max|d|=%.3g\n",
                test::test_backend().c_str(), GetParam().c_str(), static_cast<long long>(L),
                df.max_abs, di.max_abs);
    EXPECT_LE(df.max_abs, kParityTolerance);
    EXPECT_LE(di.max_abs, kParityTolerance);
    EXPECT_EQ(df.argmax_mismatches, 0);
    EXPECT_EQ(di.argmax_mismatches, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DeepseekV4ParityAll, ::testing::Values("shared", "variant"));

// Prefill in two chunks (cut inside a CSA window, an HCA window and past the sliding window), or
// token by token, equals one call: the logits of every row and every state tensor.
TEST(DeepseekV4State, SplitPrefillGivesTheStateAndLogitsOfOneCall) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto V = m->info().vocab_size;
  const auto tokens = test::qwen_cases(fixture()).back().tokens;
  const auto L = static_cast<std::int64_t>(tokens.size());
  auto whole = m->new_state();
  const auto ref = run_splits(*m, *whole, tokens, {L});
  ASSERT_EQ(static_cast<std::int64_t>(ref.size()), L * V);
  std::vector<std::int64_t> singles(static_cast<std::size_t>(L), 1);
  for (const auto& splits : std::vector<std::vector<std::int64_t>>{
           {37, L - 37}, {1, L - 1}, {50, 1, 2, L - 53}, {L - 1, 1}, singles}) {
    auto state = m->new_state();
    const auto got = run_splits(*m, *state, tokens, splits);
    const auto d = diff_logits(got, ref, V);
    const auto states = max_difference(compare_states(*state, *whole));
    std::printf("[ds4 splits] %zu calls: logits max|d|=%.3g state max|d|=%.3g\n", splits.size(),
                d.max_abs, states);
    EXPECT_LE(d.max_abs, kSplitTolerance) << splits.size() << " calls";
    EXPECT_EQ(d.argmax_mismatches, 0);
    EXPECT_LE(states, kSplitTolerance) << splits.size() << " calls";
  }
}

// Going back k tokens (a rejected speculative suffix) leaves the state a cold prefill of the
// prefix leaves, and feeding other tokens then gives what a fresh state fed the prefix and those
// tokens gives; past the slack it is refused and nothing changes.
TEST(DeepseekV4State, TruncateInsideTheSlackEqualsThePrefix) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto V = m->info().vocab_size;
  auto tokens = test::qwen_cases(fixture()).back().tokens;
  tokens.resize(70);
  auto state = m->new_state();
  run_splits(*m, *state, tokens, {70});
  const std::int64_t kept = 70 - 13;  // back past a CSA and an HCA window close
  ASSERT_TRUE(state->truncate(kept).ok());
  EXPECT_EQ(*state->covered_tokens(), kept);
  {  // the state of the prefix, as a cold prefill of it leaves it
    std::vector<TokenId> prefix(tokens.begin(), tokens.begin() + kept);
    auto cold = m->new_state();
    run_splits(*m, *cold, prefix, {kept});
    EXPECT_LE(max_difference(compare_states(*state, *cold)), kSplitTolerance);
  }
  std::vector<TokenId> tail = {5, 17, 200, 3, 9, 11, 250, 1};
  const auto after = run_splits(*m, *state, tail, {static_cast<std::int64_t>(tail.size())});

  std::vector<TokenId> prefix(tokens.begin(), tokens.begin() + kept);
  prefix.insert(prefix.end(), tail.begin(), tail.end());
  auto fresh = m->new_state();
  const auto all = run_splits(*m, *fresh, prefix, {static_cast<std::int64_t>(prefix.size())});
  const std::vector<float> expect(all.end() - static_cast<std::ptrdiff_t>(tail.size()) * V,
                                  all.end());
  const auto d = diff_logits(after, expect, V);
  EXPECT_LE(d.max_abs, kSplitTolerance);
  EXPECT_EQ(d.argmax_mismatches, 0);

  // Past the slack: refused, the state unchanged.
  const auto covered = *state->covered_tokens();
  const auto far = covered - kDsRollbackSlack - 8;
  EXPECT_FALSE(state->truncate(far).ok());
  EXPECT_EQ(*state->covered_tokens(), covered);
}

// Host copies of every cache load into a fresh state (another backend could hold it), which
// then continues exactly as the original; a cache of another layer kind refuses them.
TEST(DeepseekV4State, CachesReloadFromHostCopies) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto V = m->info().vocab_size;
  const auto tokens = test::qwen_cases(fixture()).back().tokens;
  std::vector<TokenId> head(tokens.begin(), tokens.begin() + 90);
  std::vector<TokenId> rest(tokens.begin() + 90, tokens.begin() + 100);
  auto state = m->new_state();
  run_splits(*m, *state, head, {90});
  auto copy = m->new_state();
  for (std::size_t i = 0; i < state->cache_count(); ++i) {
    const auto host = copy_to_host(state->cache(i));
    ASSERT_TRUE(copy->cache(i).load(host.views, 90).ok()) << "cache " << i;
  }
  EXPECT_EQ(max_difference(compare_states(*copy, *state)), 0.0);
  const auto a = run_splits(*m, *state, rest, {10});
  const auto b = run_splits(*m, *copy, rest, {10});
  EXPECT_EQ(diff_logits(a, b, V).max_abs, 0.0);
  // Layer 0 is sliding, layer 1 CSA (fixture config): the CSA tensors do not fit layer 0.
  const auto csa = copy_to_host(state->cache(1));
  EXPECT_FALSE(copy->cache(0).load(csa.views, 100).ok());
}

// The generic decoder on this family: greedy generation equals the argmax of one forward over
// the generated sequence; a checkpoint of its state (the family's own magic) reloads bitwise and
// the next turn continues identically.
TEST(DeepseekV4Decode, GreedyTurnAndCheckpointRoundTrip) {
  auto m = tiny_model();
  ASSERT_NE(m, nullptr);
  const auto V = m->info().vocab_size;
  auto tokens = test::qwen_cases(fixture()).front().tokens;
  tokens.resize(30);
  DecodeState s = new_decode_state(*m);
  ASSERT_TRUE(extend(*m, s, tokens).ok());
  GenerateOptions opt;
  opt.max_tokens = 12;
  const auto turn = generate(*m, s, opt);
  ASSERT_TRUE(turn.error.ok()) << turn.error.to_string();
  ASSERT_TRUE(turn.state_complete);
  ASSERT_EQ(turn.tokens.size(), 12u);
  auto seq = tokens;
  seq.insert(seq.end(), turn.tokens.begin(), turn.tokens.end());
  auto fresh = m->new_state();
  const auto logits = run_splits(*m, *fresh, seq, {static_cast<std::int64_t>(seq.size())});
  for (std::size_t i = 0; i < turn.tokens.size(); ++i) {
    const auto row = tokens.size() - 1 + i;
    const float* p = logits.data() + row * static_cast<std::size_t>(V);
    EXPECT_EQ(std::max_element(p, p + V) - p, turn.tokens[i]) << "token " << i;
  }

  test::ScratchDir dir;
  const auto fingerprint = model_fingerprint(fixture());
  ASSERT_TRUE(fingerprint.ok()) << fingerprint.status().to_string();
  const CheckpointIdentity id{Family::kDeepseekV4, *fingerprint, 0, kEnginePolicyVersion};
  EXPECT_NE(checkpoint_magic(Family::kDeepseekV4), checkpoint_magic(Family::kQwenNext));
  ASSERT_TRUE(save_checkpoint(dir.file("ds4.fsck"), s, id).ok());
  auto loaded = load_checkpoint(dir.file("ds4.fsck"), *m, id);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(loaded->state.tokens, s.tokens);
  EXPECT_EQ(max_difference(compare_states(*loaded->state.trunk, *s.trunk)), 0.0);
  // The file carries the family's own magic, and a Qwen identity is refused.
  const auto bytes = test::read_bytes(dir.file("ds4.fsck"));
  const auto magic = checkpoint_magic(Family::kDeepseekV4);
  ASSERT_GE(bytes.size(), magic.size());
  EXPECT_TRUE(std::equal(magic.begin(), magic.end(), bytes.begin()));
  CheckpointIdentity qwen = id;
  qwen.family = Family::kQwenNext;
  EXPECT_FALSE(load_checkpoint(dir.file("ds4.fsck"), *m, qwen).ok());
  const auto a = generate(*m, s, opt);
  const auto b = generate(*m, loaded->state, opt);
  EXPECT_EQ(a.tokens, b.tokens);
}

std::string join(const std::vector<TokenId>& v) {
  std::string s;
  for (const auto t : v) {
    if (!s.empty()) s.push_back(',');
    s.append(std::to_string(t));
  }
  return s;
}

// The command line on a deepseek_v4 folder (it has no tokenizer: token ids in, ids out):
// `logits` over the golden splits matches the reference; `generate` runs a greedy turn.
TEST(DeepseekV4Cli, LogitsAndGenerateOnTheFixture) {
  test::ScratchDir dir;
  const auto c = test::qwen_cases(fixture()).front();
  const auto out = dir.file("l.f32");
  std::string splits;
  for (const auto n : c.splits) {
    if (!splits.empty()) splits += ',';
    splits += std::to_string(n);
  }
  std::string text;
  ASSERT_EQ(
      test::run_command(test::flashserve_binary() + " logits --backend " + test::test_backend() +
                            " --dtype f32 --model " + fixture() + " --tokens " + join(c.tokens) +
                            " --splits " + splits + " --out " + out,
                        &text),
      0)
      << text;
  const auto d = diff_logits(test::read_f32(out), c.inc, 256);
  EXPECT_LE(d.max_abs, kParityTolerance);
  EXPECT_EQ(d.argmax_mismatches, 0);
  std::vector<TokenId> prompt(c.tokens.begin(), c.tokens.begin() + 20);
  ASSERT_EQ(test::run_command(test::flashserve_binary() + " generate --backend " +
                                  test::test_backend() + " --model " + fixture() + " --tokens " +
                                  join(prompt) + " --max-tokens 6 --temperature 0 --json",
                              &text),
            0)
      << text;
  EXPECT_NE(text.find("\"tokens\""), std::string::npos) << text;
}

// --- the official graph's numerics (--numerics official, model/deepseek_v4/numerics.h) ---

// Against the float64 HF reference the official numerics differ (FP8 KV rows, FP4 indexer with
// its own top-k picks) by a measured, bounded amount, and the argmax mostly agrees.
TEST(DeepseekV4OfficialNumerics, DiffersFromTheReferenceByABoundedAmount) {
  auto m = tiny_model("official");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->info().numerics, Numerics::kOfficial);
  const auto V = m->info().vocab_size;
  for (const auto& c : test::qwen_cases(fixture())) {
    const auto L = static_cast<std::int64_t>(c.tokens.size());
    auto state = m->new_state();
    const auto got = run_splits(*m, *state, c.tokens, {L});
    const auto d = diff_logits(got, c.full, V);
    double sum = 0, ref_max = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      sum += std::fabs(got[i] - c.full[i]);
      ref_max = std::max(ref_max, static_cast<double>(std::fabs(c.full[i])));
    }
    const double agree = 1.0 - static_cast<double>(d.argmax_mismatches) / static_cast<double>(L);
    std::printf(
        "[ds4 official %s] L=%lld max|d|=%.3g mean|d|=%.3g (max|ref|=%.3g) argmax agrees on "
        "%lld/%lld rows (%.1f%%)\n",
        test::test_backend().c_str(), static_cast<long long>(L), d.max_abs,
        sum / static_cast<double>(got.size()), ref_max,
        static_cast<long long>(L - d.argmax_mismatches), static_cast<long long>(L), 100 * agree);
    EXPECT_GT(d.max_abs, kParityTolerance) << "the switch changed nothing";
    EXPECT_LE(d.max_abs, kOfficialBound);
    EXPECT_LE(sum / static_cast<double>(got.size()), kOfficialMeanBound);
    EXPECT_GE(agree, kOfficialArgmaxAgreement);
  }
}

// The cached rows carry the simulation: the raw and compressed KV rows' non-RoPE dims are on
// their block's E4M3 grid (and the RoPE dims are not all), the indexer's rows on their block's
// E2M1 grid (in the Hadamard domain); under HF's numerics they are not.
TEST(DeepseekV4OfficialNumerics, CachedRowsAreOnTheFormatsGrids) {
  const auto on_grid = [](const std::vector<float>& v, std::int64_t width, std::int64_t cols,
                          bool fp4) {
    for (std::size_t r = 0; r * static_cast<std::size_t>(width) < v.size(); ++r) {
      const float* p = v.data() + r * static_cast<std::size_t>(width);
      float amax = 0;
      for (std::int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(p[c]));
      const int k = fp4 ? quant_sim::fp4_block_exponent(amax) : quant_sim::fp8_block_exponent(amax);
      for (std::int64_t c = 0; c < cols; ++c) {
        const float q = fp4 ? quant_sim::fp4_simulate(p[c], k) : quant_sim::fp8_simulate(p[c], k);
        if (q != p[c]) return false;
      }
    }
    return true;
  };
  const auto tokens = test::qwen_cases(fixture()).back().tokens;
  for (const std::string numerics : {"official", "hf"}) {
    auto m = tiny_model(numerics);
    ASSERT_NE(m, nullptr);
    const auto& c = dynamic_cast<DeepseekV4Model&>(*m).config();
    const auto D = c.head_dim, nope = D - c.rope_head_dim(), di = c.index_head_dim;
    ASSERT_EQ(nope, 24);  // the fixture: one FP8 block of 24 ...
    ASSERT_EQ(di, 16);    // ... and one Hadamard group and FP4 block of 16
    auto state = m->new_state();
    run_splits(*m, *state, tokens, {static_cast<std::int64_t>(tokens.size())});
    bool raw = true, rope = true, comp = true, index = true;
    for (std::size_t i = 0; i < state->cache_count(); ++i) {
      const auto& cache = dynamic_cast<const DsAttentionCache&>(state->cache(i));
      const auto rows = cache.raw.to_host_vector();
      ASSERT_FALSE(rows.empty());
      raw = raw && on_grid(rows, D, nope, false);
      rope = rope && on_grid(rows, D, D, false);
      if (cache.compressor)
        comp = comp && on_grid(cache.compressor->rows.to_host_vector(), D, nope, false);
      if (cache.indexer)
        index = index && on_grid(cache.indexer->rows.to_host_vector(), di, di, true);
    }
    const bool official = numerics == "official";
    EXPECT_EQ(raw, official) << numerics;
    EXPECT_EQ(comp, official) << numerics;
    EXPECT_EQ(index, official) << numerics;
    EXPECT_FALSE(rope) << numerics << ": the RoPE dims are left alone";
  }
}

// Split-prefill under the official numerics. Splits reorder fp32 sums (1e-5 above); where such
// a last-bit difference meets a rounding boundary of a KV row's FP8 block, the stored value moves
// by one quantum and the rows that read it follow, so the split states are equal except for rare
// flips, and the argmax agrees on every row. (The indexer's FP4 alone keeps the 1e-5 agreement
// on the fixture; making every op batch-invariant would make the official numerics split-exact.)
TEST(DeepseekV4OfficialNumerics, SplitPrefillAgreesExceptForRareRoundingFlips) {
  auto m = tiny_model("official");
  ASSERT_NE(m, nullptr);
  const auto V = m->info().vocab_size;
  const auto tokens = test::qwen_cases(fixture()).back().tokens;
  const auto L = static_cast<std::int64_t>(tokens.size());
  auto whole = m->new_state();
  const auto ref = run_splits(*m, *whole, tokens, {L});
  const auto ref_tensors = whole->tensors();
  std::vector<std::int64_t> singles(static_cast<std::size_t>(L), 1);
  for (const auto& splits : std::vector<std::vector<std::int64_t>>{
           {37, L - 37}, {1, L - 1}, {50, 1, 2, L - 53}, {L - 1, 1}, singles}) {
    auto state = m->new_state();
    const auto got = run_splits(*m, *state, tokens, splits);
    const auto d = diff_logits(got, ref, V);
    const auto tensors = state->tensors();
    ASSERT_EQ(tensors.size(), ref_tensors.size());
    std::int64_t values = 0, flipped = 0;
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const auto a = tensors[t].tensor->to_host_vector();
      const auto b = ref_tensors[t].tensor->to_host_vector();
      ASSERT_EQ(a.size(), b.size()) << tensors[t].name;
      values += static_cast<std::int64_t>(a.size());
      for (std::size_t i = 0; i < a.size(); ++i)
        flipped += std::fabs(a[i] - b[i]) > kSplitTolerance ? 1 : 0;
    }
    double mean = 0;
    for (std::size_t i = 0; i < got.size(); ++i) mean += std::fabs(got[i] - ref[i]);
    mean /= static_cast<double>(got.size());
    const auto states = max_difference(compare_states(*state, *whole));
    std::printf(
        "[ds4 official splits] %zu calls: logits max|d|=%.3g mean|d|=%.3g, state max|d|=%.3g, "
        "%lld of %lld state values past %.0e\n",
        splits.size(), d.max_abs, mean, states, static_cast<long long>(flipped),
        static_cast<long long>(values), kSplitTolerance);
    EXPECT_EQ(d.argmax_mismatches, 0) << splits.size() << " calls";
    EXPECT_LE(static_cast<double>(flipped), kOfficialSplitFlips * static_cast<double>(values))
        << splits.size() << " calls";
    EXPECT_LE(mean, kOfficialSplitMeanLogits) << splits.size() << " calls";
  }
}

// A state is keyed by its numerics: the two fingerprints differ (HF's is the plain model
// fingerprint), and a checkpoint saved under one is refused under the other.
TEST(DeepseekV4OfficialNumerics, StatesAreKeyedByTheirNumerics) {
  auto hf = tiny_model("hf");
  auto official = tiny_model("official");
  ASSERT_NE(hf, nullptr);
  ASSERT_NE(official, nullptr);
  const auto plain = model_fingerprint(fixture());
  const auto a = state_fingerprint(fixture(), hf->info());
  const auto b = state_fingerprint(fixture(), official->info());
  ASSERT_TRUE(plain.ok() && a.ok() && b.ok());
  EXPECT_EQ(*a, *plain);
  EXPECT_NE(*a, *b);
  auto tokens = test::qwen_cases(fixture()).front().tokens;
  tokens.resize(20);
  test::ScratchDir dir;
  const CheckpointIdentity hf_id{Family::kDeepseekV4, *a, 0, kEnginePolicyVersion};
  const CheckpointIdentity official_id{Family::kDeepseekV4, *b, 0, kEnginePolicyVersion};
  for (auto* m : {hf.get(), official.get()}) {
    DecodeState s = new_decode_state(*m);
    ASSERT_TRUE(extend(*m, s, tokens).ok());
    const bool is_official = m->info().numerics == Numerics::kOfficial;
    const auto path = dir.file(is_official ? "official.fsck" : "hf.fsck");
    ASSERT_TRUE(save_checkpoint(path, s, is_official ? official_id : hf_id).ok());
    std::string reason;
    EXPECT_TRUE(load_checkpoint(path, *m, is_official ? official_id : hf_id).ok());
    EXPECT_FALSE(load_checkpoint(path, *m, is_official ? hf_id : official_id, &reason).ok());
    EXPECT_EQ(reason, "fingerprint");
  }
}

TEST(DeepseekV4OfficialNumerics, OnlyDeepseekV4HasIt) {
  auto options = test::test_load_options();
  options.numerics = "official";
  const auto qwen = load_model(hf_tiny("qwen4_exp"), options);
  ASSERT_FALSE(qwen.ok());
  EXPECT_NE(qwen.status().message().find("numerics"), std::string::npos)
      << qwen.status().to_string();
  options.numerics = "fp8";
  EXPECT_FALSE(load_model(fixture(), options).ok());
  // A config whose indexer head is no power of two (nor a multiple of 128) is refused.
  DeepseekV4Config c;
  c.head_dim = 32;
  c.partial_rotary_factor = 0.25;
  c.index_head_dim = 24;
  EXPECT_FALSE(check_official_numerics(c).ok());
  c.index_head_dim = 256;
  EXPECT_TRUE(check_official_numerics(c).ok());
  c.index_head_dim = 192;
  EXPECT_FALSE(check_official_numerics(c).ok());
}

// `--numerics official` on the command line: the logits differ from the reference as above.
TEST(DeepseekV4OfficialNumerics, CommandLineSwitch) {
  test::ScratchDir dir;
  const auto c = test::qwen_cases(fixture()).front();
  std::string text;
  for (const std::string numerics : {"hf", "official"}) {
    const auto out = dir.file(numerics + ".f32");
    ASSERT_EQ(
        test::run_command(test::flashserve_binary() + " logits --backend " + test::test_backend() +
                              " --dtype f32 --numerics " + numerics + " --model " + fixture() +
                              " --tokens " + join(c.tokens) + " --out " + out,
                          &text),
        0)
        << text;
    const auto d = diff_logits(test::read_f32(out), c.full, 256);
    if (numerics == "hf") {
      EXPECT_LE(d.max_abs, kParityTolerance);
    } else {
      EXPECT_GT(d.max_abs, kParityTolerance);
      EXPECT_LE(d.max_abs, kOfficialBound);
    }
  }
  EXPECT_NE(test::run_command(test::flashserve_binary() + " logits --numerics bogus --model " +
                                  fixture() + " --tokens 1,2,3",
                              &text),
            0);
}

// The compress rope of the released Flash config (theta 160000, YaRN factor 16 over 65536,
// beta 32/1, 64 rotary dims): the frequency ratios HF gives (arch-dsv4.md 2.5).
TEST(DeepseekV4Rope, YarnGivesTheReferenceRatios) {
  DsRope r;
  r.yarn = true;
  r.theta = 160000;
  r.factor = 16;
  r.original_max_position_embeddings = 65536;
  const auto f = rope_inv_freq(r, 64);
  ASSERT_EQ(f.size(), 32u);
  for (std::size_t j = 0; j < f.size(); ++j) {
    const double plain = 1.0 / std::pow(160000.0, 2.0 * static_cast<double>(j) / 64.0);
    const double ratio = f[j] / plain;
    const double expect = j <= 15 ? 1.0 : j >= 25 ? 1.0 / 16 : 1.0 - (j - 15) * 0.09375;
    EXPECT_NEAR(ratio, expect, 1e-6) << "j " << j;
  }
  DsRope plain;
  plain.theta = 10000;
  EXPECT_FLOAT_EQ(rope_inv_freq(plain, 8)[1], static_cast<float>(1.0 / std::pow(10000.0, 0.25)));
}

// The ropes as config.json gives them: the nested {"main", "compress"} form, and the legacy flat
// rope_scaling that becomes the compress rope at compress_rope_theta (HF __post_init__).
TEST(DeepseekV4Rope, ConfigGivesBothRopes) {
  auto config = nlohmann::json::parse(test::read_bytes(fixture() + "/config.json"));
  const auto parse = [](const nlohmann::json& j) {
    auto d = describe_model_config(j.dump(), "config.json");
    EXPECT_TRUE(d.ok()) << d.status().to_string();
    return d.ok() ? std::get<DeepseekV4Config>(d->config) : DeepseekV4Config{};
  };
  auto c = parse(config);
  EXPECT_FALSE(c.main_rope.yarn);
  EXPECT_FALSE(c.compress_rope.yarn);
  EXPECT_EQ(c.main_rope.theta, 10000.0);
  EXPECT_EQ(c.compress_rope.theta, 160000.0);
  config["rope_parameters"]["compress"] = {
      {"rope_type", "yarn"}, {"rope_theta", 160000.0},
      {"factor", 16.0},      {"original_max_position_embeddings", 65536},
      {"beta_fast", 32.0},   {"beta_slow", 1.0}};
  c = parse(config);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_EQ(c.compress_rope.factor, 16.0);
  EXPECT_EQ(c.compress_rope.original_max_position_embeddings, 65536.0);
  EXPECT_FALSE(c.main_rope.yarn);
  config.erase("rope_parameters");
  config["rope_scaling"] = {{"type", "yarn"},
                            {"factor", 4.0},
                            {"original_max_position_embeddings", 64},
                            {"rope_theta", 5.0}};
  c = parse(config);
  EXPECT_TRUE(c.compress_rope.yarn);
  EXPECT_EQ(c.compress_rope.theta, 160000.0);  // compress_rope_theta, not the flat dict's
  EXPECT_EQ(c.main_rope.theta, 10000.0);
  config["rope_scaling"] = {{"type", "yarn"},
                            {"factor", 4.0},
                            {"attention_factor", 1.2},
                            {"original_max_position_embeddings", 64}};
  EXPECT_FALSE(describe_model_config(config.dump(), "config.json").ok());
}

}  // namespace
}  // namespace fs
