// The decode step as a CUDA graph (DESIGN "On the GPU" rule 5, docs/GPU.md): the first step of a
// key is recorded, later ones replay the kept executable unchanged (the per-step scalars read
// from device memory). Greedy tokens, logits, hidden rows and the whole state after many steps
// are bit-identical with graphs on and off, on the embedded model and the hf-tiny qwen fixtures,
// across QSA block completions and cache regrowth, for two states interleaved, and through MTP
// decoding at depth 0-3; the counters prove the steps were replays. Single ops that read
// per-step scalars give the eager results when replayed with new values. A step that would
// synchronise inside the recording, or a replay that does not allocate what its recording did,
// fails naming it. The GPU tests skip, saying so, without a CUDA device; the CPU backend's
// refusal runs everywhere.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "backend/backend.h"
#include "decode/generator.h"
#include "model/loader.h"
#include "model/qwen_next/forward.h"
#include "test_support.h"

namespace fs {
namespace {

const std::string kEmbedded = EMBEDDED_MODEL_DIR;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Model> load(const std::string& dir, const std::string& backend,
                            const std::string& dtype) {
  auto m = load_model(dir, {backend, dtype});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

Backend& backend_of(Model& m) {
  auto* qwen = dynamic_cast<QwenNextModel*>(&m);
  EXPECT_NE(qwen, nullptr);
  return qwen->mutable_backend();
}

DecodeState prefill(Model& m, std::span<const TokenId> tokens) {
  DecodeState s = new_decode_state(m);
  const Status st = extend(m, s, tokens);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return s;
}

std::vector<TokenId> embedded_prompt() {
  return test::read_json_ids(kEmbedded + "/parity/tokens.json");
}

std::vector<TokenId> fixture_prompt(const std::string& dir) {
  std::ifstream f(dir + "/golden.json");
  const auto g = nlohmann::json::parse(f);
  return g["cases"][0]["tokens"].get<std::vector<TokenId>>();
}

TEST(StepGraphs, TheCpuBackendRecordsNoGraphsAndSaysSo) {
  auto cpu = make_backend("cpu");
  ASSERT_TRUE(cpu.ok());
  Backend& be = **cpu;
  EXPECT_FALSE(be.step_graphs());
  be.set_step_graphs(false);
  EXPECT_TRUE(be.status().ok());
  be.set_step_graphs(true);
  EXPECT_FALSE(be.status().ok());
  EXPECT_NE(be.status().to_string().find("records no step graphs"), std::string::npos);
  be.clear_status();
  be.begin_step_graph({{1}});
  EXPECT_FALSE(be.status().ok());
}

class GpuGraphs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  }

  static void print_stats(const char* what, const Backend::StepGraphStats& a,
                          const Backend::StepGraphStats& b) {
    const auto replays = b.replays - a.replays;
    std::printf(
        "%s: %lld graph launches, %lld captures, %lld replays (walk %.1f us each), %lld "
        "evictions, %lld nodes leaked by walks\n",
        what, static_cast<long long>(b.launches - a.launches),
        static_cast<long long>(b.captures - a.captures), static_cast<long long>(replays),
        replays > 0
            ? static_cast<double>(b.walk_ns - a.walk_ns) / 1e3 / static_cast<double>(replays)
            : 0.0,
        static_cast<long long>(b.evictions - a.evictions),
        static_cast<long long>(b.walk_leaked_nodes - a.walk_leaked_nodes));
  }

  // `steps` greedy decode steps from `prompt` on three states of one model: one eager, two as
  // graphs (their cache buffers differ, so their keys do), interleaved (an eager step between
  // graphed ones must not disturb them). Every step's pick, logits row and hidden row, and the
  // states at the end, are bit-identical; a logits row held from the previous step is unchanged
  // by the next; after the first few keys every step is a replay.
  static void expect_identical_steps(Model& m, std::span<const TokenId> prompt, int steps) {
    Backend& be = backend_of(m);
    be.set_step_graphs(true);
    DecodeState eager = prefill(m, prompt), first = prefill(m, prompt), second = prefill(m, prompt);
    const auto before = be.step_graph_stats();
    TokenId next = static_cast<TokenId>(prompt.back());
    Tensor held;  // the second state's logits of the step before, kept across its next step
    std::vector<float> held_values;
    for (int i = 0; i < steps; ++i) {
      const TokenId in[1] = {next};
      ForwardOutput a, b, c;
      be.set_step_graphs(false);
      ASSERT_TRUE(m.forward(*eager.trunk, in, LogitsRows::kLastArgmax, a).ok());
      be.set_step_graphs(true);
      Status s = m.forward(*first.trunk, in, LogitsRows::kLastArgmax, b);
      ASSERT_TRUE(s.ok()) << "step " << i << ": " << s.to_string();
      s = m.forward(*second.trunk, in, LogitsRows::kLastArgmax, c);
      ASSERT_TRUE(s.ok()) << "step " << i << ": " << s.to_string();
      if (i > 0) {
        ASSERT_TRUE(same_bits(held.to_host_vector(), held_values))
            << "step " << i << ": a held logits row changed";
      }
      ASSERT_EQ(a.argmax.size(), 1u);
      const auto logits = a.device_logits.to_host_vector();
      for (const ForwardOutput* o : {&b, &c}) {
        ASSERT_EQ(a.argmax, o->argmax) << "step " << i;
        ASSERT_TRUE(same_bits(a.hidden, o->hidden)) << "step " << i;
        ASSERT_TRUE(same_bits(logits, o->device_logits.to_host_vector())) << "step " << i;
      }
      held = std::move(c.device_logits);
      held_values = logits;
      next = a.argmax[0];
    }
    const auto after = be.step_graph_stats();
    print_stats("decode", before, after);
    EXPECT_EQ(after.launches - before.launches, 2 * steps);
    EXPECT_EQ(after.captures + after.replays, after.launches);
    // Keys per state: whether the step completes an indexer block (2), times the cache buffers,
    // which change at each regrowth (geometric: a handful over these steps).
    const std::int64_t bound = 2 * 2 * 8;
    EXPECT_LE(after.captures - before.captures, bound);
    EXPECT_GE(after.replays - before.replays, 2 * steps - bound);
    EXPECT_EQ(after.walk_leaked_nodes - before.walk_leaked_nodes, 0)
        << "an op queued work during a replay's walk (it must return when walking)";
    EXPECT_EQ(max_difference(compare_states(*eager.trunk, *first.trunk)), 0.0);
    EXPECT_EQ(max_difference(compare_states(*eager.trunk, *second.trunk)), 0.0);
  }
};

// 31 prompt tokens, then 300 steps: QSA blocks of 4 complete every fourth step and the caches
// regrow several times (geometric capacity).
TEST_F(GpuGraphs, EmbeddedModelStepsAreBitIdenticalWithGraphsOnAndOff) {
  for (const char* dtype : {"bf16", "f32"}) {
    auto m = load(kEmbedded, "cuda", dtype);
    ASSERT_TRUE(m);
    SCOPED_TRACE(dtype);
    const auto prompt = embedded_prompt();
    expect_identical_steps(*m, std::span(prompt).first(31), 300);
  }
}

TEST_F(GpuGraphs, HfTinyQwenFixturesStepsAreBitIdenticalWithGraphsOnAndOff) {
  for (const std::string& dir : {test::hf_tiny("qwen4_exp"), std::string(QWEN_VARIANT_FIXTURE)}) {
    auto m = load(dir, "cuda", "f32");
    ASSERT_TRUE(m);
    SCOPED_TRACE(dir);
    const auto prompt = fixture_prompt(dir);
    ASSERT_FALSE(prompt.empty());
    expect_identical_steps(*m, prompt, 257);
  }
}

// generate() at every MTP depth: the same tokens, acceptances, final logits and states with graphs
// on and off (the trunk's steps run as graphs: the one-token steps at depth 0, the verify forwards
// of depth + 1 rows at depths 1-3; the MTP head's draft and history forwards stay eager).
TEST_F(GpuGraphs, GreedyGenerateIsIdenticalWithGraphsOnAndOffAtEveryMtpDepth) {
  auto m = load(kEmbedded, "cuda", "bf16");
  ASSERT_TRUE(m);
  Backend& be = backend_of(*m);
  be.set_step_graphs(true);
  const auto all = embedded_prompt();
  const auto prompt = std::span(all).first(31);
  for (int depth = 0; depth <= kMaxMtpDepth; ++depth) {
    GenerateOptions opt;
    opt.max_tokens = 300;
    opt.mtp_depth = depth;
    be.set_step_graphs(false);
    DecodeState off_state = prefill(*m, prompt);
    const auto off = generate(*m, off_state, opt);
    ASSERT_TRUE(off.error.ok()) << off.error.to_string();
    be.set_step_graphs(true);
    const auto before = be.step_graph_stats();
    DecodeState on_state = prefill(*m, prompt);
    const auto on = generate(*m, on_state, opt);
    ASSERT_TRUE(on.error.ok()) << on.error.to_string();
    const auto after = be.step_graph_stats();
    const auto launched = after.launches - before.launches;
    std::printf("depth %d: %zu tokens, ", depth, on.tokens.size());
    print_stats("generate", before, after);
    EXPECT_GT(launched, 0) << "depth " << depth << ": the trunk's steps ran eagerly";
    EXPECT_GT(after.replays - before.replays, 0) << "depth " << depth << ": nothing was replayed";
    EXPECT_EQ(on.tokens, off.tokens) << "depth " << depth;
    EXPECT_EQ(on.stats.accepted, off.stats.accepted) << "depth " << depth;
    EXPECT_TRUE(same_bits(on_state.next_logits, off_state.next_logits)) << "depth " << depth;
    EXPECT_EQ(max_difference(compare_states(*on_state.trunk, *off_state.trunk)), 0.0);
    EXPECT_EQ(max_difference(compare_states(*on_state.mtp_history, *off_state.mtp_history)), 0.0);
  }
}

// Rule 5's "no allocation inside a step": once both keys of a state (a plain step and one that
// completes an indexer block) are recorded, replayed steps take every block from their graphs or
// the pool (the same window as the eager SteadyStateDecodeAllocatesNoDeviceMemory test).
TEST_F(GpuGraphs, WarmReplayedStepsAllocateNoDeviceMemory) {
  auto m = load(kEmbedded, "cuda", "bf16");
  ASSERT_TRUE(m);
  Backend& be = backend_of(*m);
  be.set_step_graphs(true);
  const auto all = embedded_prompt();
  DecodeState s = prefill(*m, std::span(all).first(20));
  auto step = [&](TokenId t) {
    const TokenId in[1] = {t};
    ForwardOutput out, head;
    ASSERT_TRUE(m->forward(*s.trunk, in, LogitsRows::kLastArgmax, out).ok());
    ASSERT_TRUE(m->mtp()->forward(*s.mtp_history, out.hidden, in, LogitsRows::kLast, head).ok());
  };
  for (int i = 0; i < 8; ++i) step(all[static_cast<std::size_t>(20 + i)]);
  const auto warm = be.memory()->stats();
  const auto before = be.step_graph_stats();
  for (int i = 0; i < 32; ++i) step(all[static_cast<std::size_t>(28 + i)]);
  const auto after = be.memory()->stats();
  const auto stats = be.step_graph_stats();
  print_stats("warm", before, stats);
  EXPECT_EQ(stats.launches - before.launches, 32);
  EXPECT_EQ(stats.replays - before.replays, 32);
  EXPECT_EQ(after.system_allocations, warm.system_allocations);
  EXPECT_EQ(after.bytes_reserved, warm.bytes_reserved);
}

// A host wait inside the recording is refused with a message naming it, never run silently
// (a fresh backend: the refusal is recorded in its memory for good).
TEST_F(GpuGraphs, ASynchronisingCopyInsideTheRecordingFailsNamingIt) {
  auto made = make_backend("cuda");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& be = **made;
  Tensor t = be.new_tensor({4, 4});
  ASSERT_TRUE(be.status().ok());
  be.set_step_graphs(true);
  be.begin_step_graph({{1}});
  ASSERT_TRUE(be.status().ok()) << be.status().to_string();
  be.scale(t, 2.0f);
  (void)t.to_host_vector();  // would wait on the recorded, not yet launched, scale
  be.launch_step_graph();
  ASSERT_FALSE(be.status().ok());
  EXPECT_NE(be.status().to_string().find("inside a step graph"), std::string::npos)
      << be.status().to_string();
  EXPECT_EQ(be.step_graph_stats().launches, 0);
}

// Deterministic values in [-1, 1) (an LCG): inputs the eager and graphed runs share.
std::vector<float> values(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

void fill(Tensor& t, std::uint32_t seed) {
  t.copy_from_host(values(t.numel(), seed));
}

// The cache holds `rows` rows of seeded values (its buffer kept: reserved beforehand).
void set_rows(Backend& be, Tensor& cache, std::int64_t rows, std::uint32_t seed) {
  cache.shrink_rows(0);
  Tensor src = be.new_tensor({rows, cache.cols()});
  fill(src, seed);
  be.append_rows(cache, src);
}

// The per-step-scalar ops of a QSA layer (rope at a position, appends at the cache length, the
// block scores over a growing block count, block selection, block-sparse attention, a block mean
// at a moving row), recorded once and replayed with new positions and lengths: every replay gives
// the eager results in bits, and only the first round records.
TEST_F(GpuGraphs, OpsReplayedWithNewScalarsMatchEager) {
  auto made = make_backend("cuda");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& be = **made;
  be.set_step_graphs(true);
  constexpr std::int64_t S = 1, heads = 4, kv_heads = 2, D = 64, block = 4, top = 3;
  constexpr std::int64_t nI = 2, dI = 32, kCapacity = 64;
  const float scale = 0.125f;
  struct Side {
    Tensor q, iq, k_row, v_row, keys, values, blocks;
  };
  auto make_side = [&]() {
    Side s{be.new_tensor({S, heads * D}),
           be.new_tensor({S, nI * dI}),
           be.new_tensor({S, kv_heads * D}),
           be.new_tensor({S, kv_heads * D}),
           be.new_tensor({0, kv_heads * D}),
           be.new_tensor({0, kv_heads * D}),
           be.new_tensor({0, dI})};
    EXPECT_TRUE(s.keys.reserve_rows(kCapacity) && s.values.reserve_rows(kCapacity) &&
                s.blocks.reserve_rows(kCapacity));
    return s;
  };
  Side eager = make_side(), graphed = make_side();
  struct Results {
    std::vector<float> q, scores, out, pooled, keys;
    std::vector<float> picked;
  };
  auto run = [&](Side& side, std::int64_t first) {
    Tensor scores, picked, out, pooled;
    be.rope(side.q, D, D / 2, first, 1, 10000.0);
    be.rope(side.iq, dI, dI, first, 1, 10000.0);
    be.append_rows(side.keys, side.k_row);
    be.append_rows(side.values, side.v_row);
    be.index_scores(side.iq, side.blocks, nI, scale, scores);
    be.select_blocks(scores, first, block, top, picked);
    be.block_sparse_attention(side.q, side.keys, side.values, heads, kv_heads, picked, block, first,
                              scale, out);
    be.block_mean(side.keys, ((first + 1) / block - 1) * block, 1, block, pooled);
    return std::make_tuple(std::move(scores), std::move(picked), std::move(out), std::move(pooled));
  };
  const Backend::StepGraphKey key{{42}};
  const auto before = be.step_graph_stats();
  int round = 0;
  for (const std::int64_t first : {9, 10, 13, 17, 22, 30, 31}) {
    SCOPED_TRACE(first);
    const auto seed = static_cast<std::uint32_t>(7 * first);
    Results r[2];
    for (int g = 0; g < 2; ++g) {
      Side& side = g == 0 ? eager : graphed;
      fill(side.q, seed + 1);
      fill(side.iq, seed + 2);
      fill(side.k_row, seed + 3);
      fill(side.v_row, seed + 4);
      set_rows(be, side.keys, first, seed + 5);
      set_rows(be, side.values, first, seed + 6);
      set_rows(be, side.blocks, (first + 1) / block, seed + 7);
      ASSERT_TRUE(be.status().ok()) << be.status().to_string();
      if (g == 1) be.begin_step_graph(key);
      auto [scores, picked, out, pooled] = run(side, first);
      if (g == 1) be.launch_step_graph();
      ASSERT_TRUE(be.status().ok()) << be.status().to_string();
      ASSERT_EQ(scores.cols(), (first + 1) / block);
      r[g] = {side.q.to_host_vector(), scores.to_host_vector(),    out.to_host_vector(),
              pooled.to_host_vector(), side.keys.to_host_vector(), {}};
      std::vector<std::int32_t> ids(static_cast<std::size_t>(picked.numel()));
      picked.memory()->to_host(ids.data(), picked.raw(), picked.bytes());
      r[g].picked.assign(ids.begin(), ids.end());
    }
    EXPECT_TRUE(same_bits(r[0].q, r[1].q)) << "rope";
    EXPECT_TRUE(same_bits(r[0].keys, r[1].keys)) << "append_rows";
    EXPECT_TRUE(same_bits(r[0].scores, r[1].scores)) << "index_scores";
    EXPECT_EQ(r[0].picked, r[1].picked) << "select_blocks";
    EXPECT_TRUE(same_bits(r[0].out, r[1].out)) << "block_sparse_attention";
    EXPECT_TRUE(same_bits(r[0].pooled, r[1].pooled)) << "block_mean";
    ++round;
  }
  const auto after = be.step_graph_stats();
  EXPECT_EQ(after.captures - before.captures, 1);
  EXPECT_EQ(after.replays - before.replays, round - 1);
  EXPECT_EQ(after.walk_leaked_nodes, 0);
}

// By construction a key fixes the step's allocations; a replay that asks for other ones must fail
// naming the divergence, not run a graph whose blocks do not fit.
TEST_F(GpuGraphs, AReplayThatAllocatesOtherwiseFailsNamingIt) {
  auto made = make_backend("cuda");
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Backend& be = **made;
  be.set_step_graphs(true);
  const Backend::StepGraphKey key{{7}};
  be.begin_step_graph(key);
  {
    Tensor t = be.new_tensor({4, 4});
    be.scale(t, 2.0f);
  }
  be.launch_step_graph();
  ASSERT_TRUE(be.status().ok()) << be.status().to_string();
  be.begin_step_graph(key);
  {
    Tensor t = be.new_tensor({1024, 1024});  // larger than the recording's block
    be.scale(t, 2.0f);
  }
  be.launch_step_graph();
  ASSERT_FALSE(be.status().ok());
  EXPECT_NE(be.status().to_string().find("does not fix"), std::string::npos)
      << be.status().to_string();
  EXPECT_EQ(be.step_graph_stats().replays, 0);
  // The failed key is forgotten: the next step of it records afresh.
  be.clear_status();
  be.begin_step_graph(key);
  be.launch_step_graph();
  EXPECT_TRUE(be.status().ok()) << be.status().to_string();
  EXPECT_EQ(be.step_graph_stats().captures, 2);
}

}  // namespace
}  // namespace fs
