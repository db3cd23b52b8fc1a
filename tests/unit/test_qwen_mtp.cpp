// The embedded model's MTP head against the training framework, and MTP decoding on a real
// Qwen 3.8 Flash Next model: greedy MTP emits the autoregressive tokens, every exit leaves the
// cold-prefill state, and drafts are accepted at useful rates on held-out code.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>

#include "decode/generator.h"
#include "decode/stop_tokens.h"
#include "model/loader.h"
#include "mtp_harness.h"
#include "session/live_session.h"
#include "test_backend.h"
#include "test_support.h"
#include "tokenizer/metadata.h"

namespace fs {
namespace {

const std::string kModel = EMBEDDED_MODEL_DIR;

std::vector<TokenId> parity_tokens() {
  return test::read_json_ids(kModel + "/parity/tokens.json");
}

std::vector<float> read_f32(const std::string& path) {
  const auto bytes = test::read_bytes(path);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

class EmbeddedModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = load_model(kModel, test::test_load_options());
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::move(m).value().release();
  }
  static void TearDownTestSuite() {
    delete model_;  // NOLINT: suite-lifetime fixture
    model_ = nullptr;
  }
  static Model* model_;

  DecodeState prefill(std::span<const TokenId> tokens) {
    DecodeState s = new_decode_state(*model_);
    const Status st = extend(*model_, s, tokens);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return s;
  }

  // One turn from a fresh prefill of `prompt` with the picks on the host, then the same turn with
  // them on the backend (opt's on_commit watches that one).
  struct BothPaths {
    GenerateResult host, device;
    DecodeState host_state, device_state;
  };
  BothPaths generate_on_both(std::span<const TokenId> prompt, GenerateOptions opt) {
    BothPaths r;
    const auto on_commit = std::move(opt.on_commit);
    opt.on_commit = nullptr;
    opt.pick_on = PickOn::kHost;
    r.host_state = prefill(prompt);
    r.host = generate(*model_, r.host_state, opt);
    EXPECT_TRUE(r.host.error.ok()) << r.host.error.to_string();
    opt.pick_on = PickOn::kBackend;
    EXPECT_TRUE(picks_on_backend(*model_, opt));
    opt.on_commit = on_commit;
    r.device_state = prefill(prompt);
    r.device = generate(*model_, r.device_state, opt);
    EXPECT_TRUE(r.device.error.ok()) << r.device.error.to_string();
    // The same tokens, acceptance and state whichever side picked.
    EXPECT_EQ(r.device.tokens, r.host.tokens);
    EXPECT_EQ(r.device.stats.accepted, r.host.stats.accepted);
    EXPECT_EQ(r.device.stats.rollbacks, r.host.stats.rollbacks);
    EXPECT_TRUE(r.device.state_complete);
    EXPECT_EQ(r.device_state.tokens, r.host_state.tokens);
    EXPECT_EQ(r.device_state.next_logits, r.host_state.next_logits);
    return r;
  }
};
Model* EmbeddedModel::model_ = nullptr;

TEST_F(EmbeddedModel, HasAnMtpHead) {
  EXPECT_TRUE(model_->info().has_mtp);
  ASSERT_NE(model_->mtp(), nullptr);
}

// `run` and `serve` stop on one set (decode/stop_tokens.h): the tokenizer's end-of-turn and eos
// ids and the model config's eos ids. `run` used to take the tokenizer's only, so a model whose
// config names another eos id ran past it on the command line and stopped in the server.
TEST_F(EmbeddedModel, RunAndServeStopOnTheSameTokens) {
  auto bundle = load_tokenizer_dir(kModel);
  ASSERT_TRUE(bundle.ok()) << bundle.status().to_string();
  ModelInfo info = model_->info();
  info.eos_token_ids.push_back(7);  // an id only the model config names
  const auto ids = turn_stop_tokens(*bundle, info);
  const auto has = [&](TokenId t) { return std::find(ids.begin(), ids.end(), t) != ids.end(); };
  for (const TokenId t : stop_token_ids(bundle->metadata, bundle->tokenizer)) EXPECT_TRUE(has(t));
  for (const TokenId t : info.eos_token_ids) EXPECT_TRUE(has(t)) << t;
  EXPECT_EQ(std::set<TokenId>(ids.begin(), ids.end()).size(), ids.size()) << "no repeats";
  // And both front ends take their stop tokens from it.
  for (const char* file : {"src/cli/run_command.cpp", "src/server/engine.cpp"}) {
    const auto bytes = test::read_bytes(std::string(FLASHSERVE_SOURCE_DIR) + "/" + file);
    EXPECT_NE(std::string(bytes.begin(), bytes.end()).find("turn_stop_tokens("), std::string::npos)
        << file;
  }
}

TEST_F(EmbeddedModel, TrunkAndMtpLogitsMatchTheTrainingFramework) {
  const auto tokens = parity_tokens();
  const auto V = static_cast<std::size_t>(model_->info().vocab_size);
  const auto ref_trunk = read_f32(kModel + "/parity/trunk_logits.f32");
  const auto ref_mtp = read_f32(kModel + "/parity/mtp_logits.f32");
  ASSERT_EQ(ref_trunk.size(), tokens.size() * V);
  ASSERT_EQ(ref_mtp.size(), (tokens.size() - 1) * V);

  auto state = model_->new_state();
  ForwardOutput trunk;
  ASSERT_TRUE(model_->forward(*state, tokens, LogitsRows::kAll, trunk).ok());
  // Rows t = 1..n-1 of the head: (h_{t-1}, x_t).
  auto history = model_->mtp()->new_history();
  ForwardOutput head;
  const auto w = static_cast<std::size_t>(trunk.hidden_width);
  ASSERT_TRUE(model_->mtp()
                  ->forward(*history, std::span(trunk.hidden).first((tokens.size() - 1) * w),
                            std::span(tokens).subspan(1), LogitsRows::kAll, head)
                  .ok());
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& want,
                     const char* what) {
    ASSERT_EQ(got.size(), want.size());
    double max_abs = 0;
    std::size_t same_argmax = 0, rows = want.size() / V;
    for (std::size_t r = 0; r < rows; ++r) {
      std::size_t ag = 0, aw = 0;
      for (std::size_t i = 0; i < V; ++i) {
        max_abs =
            std::max(max_abs, std::fabs(static_cast<double>(got[r * V + i]) - want[r * V + i]));
        if (got[r * V + i] > got[r * V + ag]) ag = i;
        if (want[r * V + i] > want[r * V + aw]) aw = i;
      }
      same_argmax += ag == aw;
    }
    std::printf(
        "%s: max |logits - training framework| = %.3g over %zu rows, argmax agrees on %zu\n", what,
        max_abs, rows, same_argmax);
    EXPECT_LE(max_abs, 1e-3) << what;
    EXPECT_EQ(same_argmax, rows) << what;
  };
  compare(trunk.logits, ref_trunk, "trunk");
  compare(head.logits, ref_mtp, "mtp head");
}

TEST_F(EmbeddedModel, GreedyMtpEmitsTheAutoregressiveTokens) {
  test::expect_greedy_mtp_is_autoregressive(*model_, parity_tokens(), {5, 23, 61}, {1, 9, 40}, -1);
}

// A prefill's hidden rows stay in the backend's memory (extend asks for HiddenRows::kBackend; the
// MTP head takes them there through absorb_rows) and build, over two calls, exactly the MTP
// history, last hidden row, trunk state and next logits that the rows sent through the host do.
TEST_F(EmbeddedModel, PrefillHiddenRowsOnTheBackendBuildTheSameHistory) {
  const auto all = parity_tokens();
  ASSERT_GT(all.size(), 12u);
  const std::span<const TokenId> tokens(all);
  const std::array<std::span<const TokenId>, 2> parts = {tokens.first(9), tokens.subspan(9)};

  ForwardOutput probe;
  auto probe_state = model_->new_state();
  ASSERT_TRUE(
      model_->forward(*probe_state, parts[0], LogitsRows::kLast, probe, HiddenRows::kBackend).ok());
  EXPECT_EQ(probe.device_hidden.rows(), 9);
  EXPECT_EQ(probe.device_hidden.cols(), probe.hidden_width);
  ASSERT_EQ(static_cast<std::int64_t>(probe.hidden.size()), probe.hidden_width);  // the last row
  const auto rows = probe.device_hidden.to_host_vector();
  EXPECT_TRUE(
      std::equal(probe.hidden.begin(), probe.hidden.end(), rows.end() - probe.hidden_width));

  DecodeState on_backend = new_decode_state(*model_);
  DecodeState on_host = new_decode_state(*model_);
  for (const auto part : parts) {
    ASSERT_TRUE(extend(*model_, on_backend, part).ok());
    ForwardOutput out;
    ASSERT_TRUE(model_->forward(*on_host.trunk, part, LogitsRows::kLast, out).ok());
    ASSERT_EQ(static_cast<std::int64_t>(out.hidden.size()),
              static_cast<std::int64_t>(part.size()) * out.hidden_width);
    ASSERT_TRUE(absorb(*model_, on_host, part, std::move(out)).ok());
  }
  EXPECT_EQ(on_backend.tokens, on_host.tokens);
  EXPECT_EQ(on_backend.last_hidden, on_host.last_hidden);
  EXPECT_EQ(on_backend.next_logits, on_host.next_logits);
  ASSERT_TRUE(on_backend.mtp_history && on_host.mtp_history);
  EXPECT_EQ(max_difference(compare_states(*on_backend.mtp_history, *on_host.mtp_history)), 0.0);
  EXPECT_EQ(max_difference(compare_states(*on_backend.trunk, *on_host.trunk)), 0.0);
  EXPECT_TRUE(on_backend.check_invariant().ok());
}

// The *Argmax forward forms pick on the backend what fs::argmax picks from the host rows, and
// leave exactly those rows on the backend.
TEST_F(EmbeddedModel, ArgmaxForwardPicksWhatTheHostPicks) {
  const auto all = parity_tokens();
  const std::span<const TokenId> prompt(all.data(), 29);
  for (const bool every_row : {false, true}) {
    auto host_state = model_->new_state(), device_state = model_->new_state();
    ForwardOutput host, device;
    ASSERT_TRUE(
        model_->forward(*host_state, prompt, every_row ? LogitsRows::kAll : LogitsRows::kLast, host)
            .ok());
    ASSERT_TRUE(model_
                    ->forward(*device_state, prompt,
                              every_row ? LogitsRows::kAllArgmax : LogitsRows::kLastArgmax, device)
                    .ok());
    const auto vocab = static_cast<std::size_t>(model_->info().vocab_size);
    ASSERT_EQ(device.rows, host.rows);
    EXPECT_TRUE(device.logits.empty());
    ASSERT_EQ(device.argmax.size(), static_cast<std::size_t>(host.rows));
    for (std::int64_t r = 0; r < host.rows; ++r) {
      const std::span<const float> row(host.logits.data() + static_cast<std::size_t>(r) * vocab,
                                       vocab);
      EXPECT_EQ(device.argmax[static_cast<std::size_t>(r)], argmax(row)) << "row " << r;
    }
    EXPECT_EQ(device.device_logits.to_host_vector(), host.logits);
    EXPECT_EQ(device.hidden, host.hidden);
    EXPECT_EQ(max_difference(compare_states(*device_state, *host_state)), 0.0);
  }
}

// Greedy decoding with the picks on the backend (only token ids come back) emits the tokens of
// the host picks at every MTP depth, with the same acceptance, and leaves the same state: the
// same caches, and next-token logits that read back to the host path's.
TEST_F(EmbeddedModel, GreedyPicksOnTheBackendEqualTheHostPicks) {
  const auto all = parity_tokens();
  const std::span<const TokenId> prompt(all.data(), 23);
  for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
    GenerateOptions opt;
    opt.max_tokens = 48;
    opt.mtp_depth = depth;
    opt.pick_on = PickOn::kHost;
    ASSERT_FALSE(picks_on_backend(*model_, opt));
    DecodeState host_state = prefill(prompt);
    const auto host = generate(*model_, host_state, opt);
    ASSERT_TRUE(host.error.ok()) << host.error.to_string();
    opt.pick_on = PickOn::kBackend;
    ASSERT_TRUE(picks_on_backend(*model_, opt));
    DecodeState device_state = prefill(prompt);
    // Inside the turn no logits row comes back: every committed state holds only the argmax.
    int commits = 0, rows_on_host = 0;
    opt.on_commit = [&](const DecodeState& s) {
      ++commits;
      if (!s.next_logits.empty() || !s.next_argmax) ++rows_on_host;
    };
    const auto device = generate(*model_, device_state, opt);
    opt.on_commit = nullptr;
    EXPECT_GT(commits, 0);
    EXPECT_EQ(rows_on_host, 0) << "depth " << depth;
    ASSERT_TRUE(device.error.ok()) << device.error.to_string();
    EXPECT_EQ(device.tokens, host.tokens) << "depth " << depth;
    EXPECT_EQ(device.stats.accepted, host.stats.accepted) << "depth " << depth;
    EXPECT_EQ(device.stats.rollbacks, host.stats.rollbacks) << "depth " << depth;
    EXPECT_TRUE(device.state_complete);
    EXPECT_EQ(device_state.tokens, host_state.tokens);
    // The turn hands back its next logits on the host, read back once.
    ASSERT_TRUE(device_state.next_argmax.has_value());
    EXPECT_EQ(*device_state.next_argmax, argmax(host_state.next_logits));
    EXPECT_EQ(device_state.next_logits, host_state.next_logits);
    EXPECT_EQ(device_state.next_logits_device.numel(), 0);
    EXPECT_EQ(max_difference(compare_states(*device_state.trunk, *host_state.trunk)), 0.0);
    EXPECT_EQ(max_difference(compare_states(*device_state.mtp_history, *host_state.mtp_history)),
              0.0);
    EXPECT_EQ(device_state.last_hidden, host_state.last_hidden);

    // A sampled turn after it reads the logits back (and a clone keeps them): same draws.
    GenerateOptions sampled;
    sampled.max_tokens = 8;
    sampled.sampler.temperature = 0.8;
    sampled.seed = 11 + static_cast<std::uint64_t>(depth);
    DecodeState cloned = device_state.clone();
    const auto after_host = generate(*model_, host_state, sampled);
    const auto after_device = generate(*model_, cloned, sampled);
    ASSERT_TRUE(after_host.error.ok() && after_device.error.ok());
    EXPECT_EQ(after_device.tokens, after_host.tokens) << "depth " << depth;
  }
  // Penalties are subtracted on the backend and logprobs scored there (the tests below).
  GenerateOptions opt;
  opt.pick_on = PickOn::kBackend;
  opt.sampler.presence_penalty = 0.5;
  EXPECT_TRUE(picks_on_backend(*model_, opt));
  opt.sampler.presence_penalty = 0;
  opt.on_logprobs = [](const TokenLogprobs&) {};
  EXPECT_TRUE(picks_on_backend(*model_, opt));
  // Under kAuto a device backend scores a turn with logprobs on the device (the CPU backend: on
  // the host); FLASHSERVE_DEVICE_LOGPROBS=0 keeps it on the host.
  opt.pick_on = PickOn::kAuto;
  unsetenv("FLASHSERVE_DEVICE_LOGPROBS");
  EXPECT_EQ(picks_on_backend(*model_, opt), model_->info().backend != "cpu");
  setenv("FLASHSERVE_DEVICE_LOGPROBS", "0", 1);
  EXPECT_FALSE(picks_on_backend(*model_, opt));
  unsetenv("FLASHSERVE_DEVICE_LOGPROBS");
}

// Logprobs with the picks on the backend: each emitted token scored on the row it was picked
// from (the primary's, an accepted draft's or a correction's verify row, penalised as its pick
// was) from what the backend sends (the row's top, its softmax denominator and the token's
// logit), the host path's values at every MTP depth: bit for bit on the CPU backend, to the
// rounding of the denominator's sum on a GPU. No row comes to the host.
TEST_F(EmbeddedModel, LogprobsOnTheBackendEqualTheHostPaths) {
  const auto all = parity_tokens();
  const std::span<const TokenId> prompt(all.data(), 23);
  const bool cpu = model_->info().backend == "cpu";
  std::vector<std::pair<const char*, SamplerConfig>> configs(5);
  configs[0].first = "greedy";
  configs[1] = {"greedy, presence 0.8", {}};
  configs[1].second.presence_penalty = 0.8;
  configs[2] = {"T 0.8 top_k 40", {}};
  configs[2].second.temperature = 0.8;
  configs[2].second.top_k = 40;
  configs[3] = {"T 0.7 (no prefix rule)", {}};
  configs[3].second.temperature = 0.7;
  configs[4] = {"T 0.8 (no prefix rule), repetition 1.2", {}};
  configs[4].second.temperature = 0.8;
  configs[4].second.repetition_penalty = 1.2;
  for (const auto& [name, sampler] : configs) {
    for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
      SCOPED_TRACE(std::string(name) + ", depth " + std::to_string(depth));
      std::vector<TokenLogprobs> scored[2];
      std::vector<TokenId> tokens[2];
      std::int64_t rollbacks = 0;
      for (int side = 0; side < 2; ++side) {
        GenerateOptions opt;
        opt.max_tokens = 24;
        opt.mtp_depth = depth;
        opt.sampler = sampler;
        opt.seed = 500 + static_cast<std::uint64_t>(depth);
        opt.top_logprobs = 5;
        opt.pick_on = side == 0 ? PickOn::kHost : PickOn::kBackend;
        opt.on_logprobs = [&, side](const TokenLogprobs& lp) { scored[side].push_back(lp); };
        int rows_on_host = 0;
        opt.on_commit = [&](const DecodeState& s) {
          if (!s.next_logits.empty()) ++rows_on_host;
        };
        DecodeState state = prefill(prompt);
        const auto r = generate(*model_, state, opt);
        ASSERT_TRUE(r.error.ok()) << r.error.to_string();
        tokens[side] = r.tokens;
        if (side == 1) {
          EXPECT_EQ(rows_on_host, 0);
          EXPECT_EQ(r.stats.rows_read_back, 0);
          rollbacks = r.stats.rollbacks;
        }
      }
      ASSERT_EQ(tokens[1], tokens[0]);
      ASSERT_EQ(scored[0].size(), tokens[0].size());
      ASSERT_EQ(scored[1].size(), tokens[1].size());
      if (depth > 0) {
        EXPECT_GT(rollbacks, 0) << "no rejected draft";
      }
      for (std::size_t i = 0; i < scored[0].size(); ++i) {
        const auto &h = scored[0][i], &d = scored[1][i];
        EXPECT_EQ(d.token, h.token);
        EXPECT_LE(h.logprob, 0.0);
        ASSERT_EQ(d.top.size(), 5u);
        ASSERT_EQ(h.top.size(), 5u);
        if (cpu) {
          EXPECT_EQ(d.logprob, h.logprob) << "token " << i;
        } else {
          EXPECT_NEAR(d.logprob, h.logprob, 1e-9) << "token " << i;
        }
        for (std::size_t k = 0; k < 5; ++k) {
          EXPECT_EQ(d.top[k].first, h.top[k].first);
          if (cpu) {
            EXPECT_EQ(d.top[k].second, h.top[k].second);
          } else {
            EXPECT_NEAR(d.top[k].second, h.top[k].second, 1e-9);
          }
        }
      }
    }
  }
}

// Repetition, presence and frequency penalties with the picks on the backend (applied to a copy
// of the rows there, Backend::penalise_entries): the host picks' tokens at every MTP depth, greedy
// and sampled, with the same acceptance; the verify's rows each penalised by the completion and
// the drafts before them (and the repetition penalty by the prompt too). No logits row comes to
// the host for a greedy pick nor for a sampled one with no prefix rule (drawn there, a rejected
// draft's correction from the residual of its penalised row), greedy MTP emits depth 0's tokens,
// and the penalties change what is emitted (so a backend that ignored them would fail).
TEST_F(EmbeddedModel, PenalisedPicksOnTheBackendEqualTheHostPicks) {
  const auto all = parity_tokens();
  const std::span<const TokenId> prompt(all.data(), 23);
  struct Config {
    const char* name;
    SamplerConfig sampler;
  };
  std::vector<Config> configs(5);
  configs[0] = {"greedy, presence 0.8, frequency 0.3", {}};
  configs[0].sampler.presence_penalty = 0.8;
  configs[0].sampler.frequency_penalty = 0.3;
  configs[1] = {"T 0.8 top_k 40, presence 1.5", {}};
  configs[1].sampler.temperature = 0.8;
  configs[1].sampler.top_k = 40;
  configs[1].sampler.presence_penalty = 1.5;
  configs[2] = {"T 0.7 top_p 0.9, frequency 0.6, presence -0.2", {}};
  configs[2].sampler.temperature = 0.7;
  configs[2].sampler.top_p = 0.9;
  configs[2].sampler.frequency_penalty = 0.6;
  configs[2].sampler.presence_penalty = -0.2;
  configs[3] = {"greedy, repetition 1.3", {}};
  configs[3].sampler.repetition_penalty = 1.3;
  configs[4] = {"T 0.8 top_k 40, repetition 1.2, frequency 0.3", {}};
  configs[4].sampler.temperature = 0.8;
  configs[4].sampler.top_k = 40;
  configs[4].sampler.repetition_penalty = 1.2;
  configs[4].sampler.frequency_penalty = 0.3;
  // No prefix rule: every row is drawn on the backend, a rejected draft's correction from the
  // residual of its penalised verify row against its draft row.
  configs.push_back({"T 0.8 (no prefix rule), repetition 1.2, presence 0.4", {}});
  configs[5].sampler.temperature = 0.8;
  configs[5].sampler.repetition_penalty = 1.2;
  configs[5].sampler.presence_penalty = 0.4;
  for (const auto& c : configs) {
    std::vector<TokenId> depth0;
    for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
      SCOPED_TRACE(std::string(c.name) + ", depth " + std::to_string(depth));
      GenerateOptions opt;
      opt.max_tokens = 40;
      opt.mtp_depth = depth;
      opt.sampler = c.sampler;
      opt.seed = 300 + static_cast<std::uint64_t>(depth);
      int rows_on_host = 0;
      opt.on_commit = [&](const DecodeState& s) {
        if (!s.next_logits.empty()) ++rows_on_host;
      };
      const auto both = generate_on_both(prompt, opt);
      EXPECT_EQ(rows_on_host, 0);
      if (c.sampler.greedy()) {
        EXPECT_EQ(both.device.stats.rows_read_back, 0);
        if (depth == 0) depth0 = both.device.tokens;
        EXPECT_EQ(both.device.tokens, depth0);
      }
      if (!c.sampler.greedy() && !c.sampler.has_prefix_rule()) {
        EXPECT_EQ(both.device.stats.rows_read_back, 0);
        EXPECT_GT(both.device.stats.rows_drawn, 0);
        if (depth > 0) {
          EXPECT_GT(both.device.stats.rollbacks, 0) << "no correction was drawn";
        }
      }
      // The same turn without penalties emits other tokens.
      GenerateOptions plain = opt;
      plain.on_commit = nullptr;
      plain.sampler.presence_penalty = plain.sampler.frequency_penalty = 0;
      plain.sampler.repetition_penalty = 1;
      DecodeState plain_state = prefill(prompt);
      const auto unpenalised = generate(*model_, plain_state, plain);
      ASSERT_TRUE(unpenalised.error.ok());
      EXPECT_NE(unpenalised.tokens, both.device.tokens);
    }
  }
}

// Sampled decoding with the picks on the backend (each row's top and softmax denominator come
// back, decode/row_sampling.h) draws the host picks' tokens at every MTP depth, seed for seed:
// the distributions are the host sampler's (bit for bit on the CPU backend), so the same
// uniforms pick the same tokens and accept the same drafts. top_k decides inside the top (no row
// comes back); top_p mostly does (a flat row reaches past its top and comes back whole); without a
// prefix rule every row is drawn on the backend (only ids come back): the primaries, the drafts
// (with q(x)), and a rejected draft's correction from the residual of its verify and draft rows.
TEST_F(EmbeddedModel, SampledPicksOnTheBackendEqualTheHostPicks) {
  const auto all = parity_tokens();
  const std::span<const TokenId> prompt(all.data(), 23);
  enum class Rows { kAllFromTop, kSomeFromTop, kNoneFromTop };
  struct Config {
    const char* name;
    SamplerConfig sampler;
    Rows rows;
  };
  std::vector<Config> configs(3);
  configs[0] = {"T 0.8 top_p 0.95", {}, Rows::kSomeFromTop};
  configs[0].sampler.temperature = 0.8;
  configs[0].sampler.top_p = 0.95;
  configs[1] = {"T 1.2 top_k 40", {}, Rows::kAllFromTop};
  configs[1].sampler.temperature = 1.2;
  configs[1].sampler.top_k = 40;
  configs[2] = {"T 0.7 (no prefix rule)", {}, Rows::kNoneFromTop};
  configs[2].sampler.temperature = 0.7;
  for (const auto& c : configs) {
    for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
      SCOPED_TRACE(std::string(c.name) + ", depth " + std::to_string(depth));
      GenerateOptions opt;
      opt.max_tokens = 24;
      opt.mtp_depth = depth;
      opt.sampler = c.sampler;
      opt.seed = 100 + static_cast<std::uint64_t>(depth);
      const auto both = generate_on_both(prompt, opt);
      EXPECT_EQ(both.host.stats.rows_from_top + both.host.stats.rows_read_back +
                    both.host.stats.rows_drawn,
                0);
      // Rows picked on the backend: the turn's primaries after its first, the verify rows and
      // the drafts' rows.
      const auto from_top = both.device.stats.rows_from_top,
                 read_back = both.device.stats.rows_read_back, drawn = both.device.stats.rows_drawn;
      EXPECT_GT(from_top + read_back + drawn, 0);
      switch (c.rows) {
        case Rows::kAllFromTop:
          EXPECT_EQ(read_back + drawn, 0);
          break;
        case Rows::kSomeFromTop:
          EXPECT_GT(from_top, read_back);
          EXPECT_EQ(drawn, 0);
          break;
        case Rows::kNoneFromTop:
          EXPECT_EQ(from_top, 0);
          // Autoregressive: every primary after the first drawn there, no row read back.
          if (depth == 0) {
            EXPECT_EQ(read_back, 0);
            EXPECT_EQ(drawn, static_cast<std::int64_t>(both.device.tokens.size()) - 1);
          } else {
            // A verify sends each draft's p(x); the drafts are drawn where their rows lie, and a
            // rejected draft's correction from the residual of its two rows there: no row comes
            // back, each draft and each correction is a draw.
            EXPECT_EQ(read_back, 0);
            std::int64_t drafted = 0;
            for (const auto n : both.device.stats.drafted) drafted += n;
            EXPECT_GE(drawn, drafted);
            EXPECT_GT(both.device.stats.rollbacks, 0) << "no correction was drawn";
          }
          break;
      }
    }
  }
}

// A verify keeps every position of its recurrent caches, so each partial acceptance truncates the
// state in place (no second forward) and still emits the autoregressive tokens, leaving the
// cold-prefill state.
TEST_F(EmbeddedModel, PartialAcceptanceRewindsInPlace) {
  const auto all = parity_tokens();
  test::expect_partial_acceptance_rewinds_to_cold(*model_, std::span(all).first(37), 24, 1e-4);
}

TEST_F(EmbeddedModel, EveryExitLeavesTheColdPrefillState) {
  const auto sweep = test::sweep_exit_paths(*model_, parity_tokens());
  test::expect_every_exit_reached(sweep, "embedded qwen " + test::test_backend());
  EXPECT_LE(sweep.worst_state, 1e-5);
  EXPECT_LE(sweep.worst_logits, 1e-4);
}

TEST_F(EmbeddedModel, DraftsAreAcceptedOnHeldOutCode) {
  const auto all = parity_tokens();
  const std::span<const TokenId> prompt(all.data(), 40);
  for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
    GenerateOptions opt;
    opt.max_tokens = 64;
    opt.mtp_depth = depth;
    DecodeState s = prefill(prompt);
    const auto r = generate(*model_, s, opt);
    ASSERT_TRUE(r.error.ok());
    std::printf("depth %d: %lld tokens in %lld rounds; accepted/drafted per depth:", depth,
                static_cast<long long>(r.tokens.size()), static_cast<long long>(r.stats.rounds));
    for (int d = 0; d < depth; ++d) {
      std::printf(" %lld/%lld",
                  static_cast<long long>(r.stats.accepted[static_cast<std::size_t>(d)]),
                  static_cast<long long>(r.stats.drafted[static_cast<std::size_t>(d)]));
    }
    std::printf("\n");
    EXPECT_GT(r.stats.accepted[0], r.stats.drafted[0] / 4) << "depth-1 acceptance below 25%";
    EXPECT_LT(r.stats.rounds, 64);
  }
}

// Sessions on the real model: a checkpoint roundtrip is bitwise, and a three-turn conversation
// through the RAM bank and through the disk after restarts gives the tokens of recomputing.
TEST_F(EmbeddedModel, ConversationThroughTheBankAndTheDiskEqualsRecomputing) {
  const auto all = parity_tokens();
  test::ScratchDir dir;
  auto fingerprint = model_fingerprint(kModel);
  ASSERT_TRUE(fingerprint.ok());
  const CheckpointIdentity id{model_->info().family, *fingerprint, 0, kEnginePolicyVersion};
  GenerateOptions opt;
  opt.max_tokens = 12;
  opt.mtp_depth = 2;
  opt.sampler.temperature = 0.6;
  auto user_turn = [&](int t) {
    return std::vector<TokenId>(all.begin() + 20 * t, all.begin() + 20 * t + 14);
  };

  // From scratch: every turn prefills the whole conversation cold.
  std::vector<TokenId> conversation;
  std::vector<std::vector<TokenId>> expected;
  for (int t = 0; t < 3; ++t) {
    const auto u = user_turn(t);
    conversation.insert(conversation.end(), u.begin(), u.end());
    DecodeState s = prefill(conversation);
    opt.seed = 100 + static_cast<std::uint64_t>(t);
    const auto r = generate(*model_, s, opt);
    expected.push_back(r.tokens);
    conversation.insert(conversation.end(), r.tokens.begin(), r.tokens.end());
  }

  for (const bool through_disk : {false, true}) {
    SCOPED_TRACE(through_disk ? "disk, restarted every turn" : "RAM bank");
    SessionBank bank;
    std::vector<TokenId> conv;
    double worst = 0;
    for (int t = 0; t < 3; ++t) {
      std::unique_ptr<DiskStore> store;
      SessionBank fresh;
      SessionTiers tiers{&bank, nullptr};
      if (through_disk) {
        auto opened = DiskStore::open({.dir = dir.path().string(), .identity = id});
        ASSERT_TRUE(opened.ok());
        store = std::move(opened).value();
        tiers = {&fresh, store.get()};
      }
      const auto u = user_turn(t);
      conv.insert(conv.end(), u.begin(), u.end());
      auto p =
          prepare_session(*model_, tiers, conv, {.prefill_chunk = 8, .restore_point_interval = 0});
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(p->tier, t == 0 ? "cold" : (through_disk ? "disk" : "ram"));
      opt.seed = 100 + static_cast<std::uint64_t>(t);
      const auto r = generate(*model_, p->state, opt);
      ASSERT_TRUE(commit_session(tiers, p->state, r.state_complete));
      EXPECT_EQ(r.tokens, expected[static_cast<std::size_t>(t)]) << "turn " << t;
      conv.insert(conv.end(), r.tokens.begin(), r.tokens.end());
      DecodeState cold = prefill(conv);
      worst = std::max({worst, max_difference(compare_states(*p->state.trunk, *cold.trunk)),
                        max_difference(compare_states(*p->state.mtp_history, *cold.mtp_history))});
      if (through_disk) persist_all_to_disk(tiers);
    }
    std::printf("%s: max |warm - cold| state %.3g\n", through_disk ? "disk" : "ram", worst);
    EXPECT_LE(worst, 1e-5);
  }
}

TEST_F(EmbeddedModel, CheckpointRoundTripIsBitwise) {
  const auto all = parity_tokens();
  test::ScratchDir dir;
  auto fingerprint = model_fingerprint(kModel);
  ASSERT_TRUE(fingerprint.ok());
  const CheckpointIdentity id{model_->info().family, *fingerprint, 0, kEnginePolicyVersion};
  DecodeState s = prefill(std::span(all).first(50));
  ASSERT_TRUE(save_checkpoint(dir.file("s.fsck"), s, id).ok());
  auto loaded = load_checkpoint(dir.file("s.fsck"), *model_, id);
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  EXPECT_EQ(max_difference(compare_states(*loaded->state.trunk, *s.trunk)), 0.0);
  EXPECT_EQ(max_difference(compare_states(*loaded->state.mtp_history, *s.mtp_history)), 0.0);
  EXPECT_EQ(loaded->state.next_logits, s.next_logits);
  // Another model's fingerprint is refused.
  std::string reason;
  EXPECT_FALSE(load_checkpoint(dir.file("s.fsck"), *model_,
                               {id.family, "other", 0, kEnginePolicyVersion}, &reason)
                   .ok());
  EXPECT_EQ(reason, "fingerprint");
}

}  // namespace
}  // namespace fs
