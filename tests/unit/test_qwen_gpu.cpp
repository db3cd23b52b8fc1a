// What only a GPU can show, on the embedded model: checkpoints move between the CPU and the GPU
// and the next turn continues identically; a warm decode loop allocates no device memory; and
// sampled MTP decoding on the GPU has the autoregressive output distribution. Label `gpu`;
// skipped, saying so, without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "backend/backend.h"
#include "decode/generator.h"
#include "model/loader.h"
#include "model/qwen_next/forward.h"
#include "session/checkpoint.h"
#include "test_support.h"

namespace fs {
namespace {

const std::string kModel = EMBEDDED_MODEL_DIR;

std::vector<TokenId> parity_tokens() {
  return test::read_json_ids(kModel + "/parity/tokens.json");
}

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device: this test needs a GPU";
  }
  static std::unique_ptr<Model> load(const std::string& backend, const std::string& dtype = "f32") {
    auto m = load_model(kModel, {backend, dtype});
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::move(m).value() : nullptr;
  }
  static DecodeState prefill(Model& m, std::span<const TokenId> tokens) {
    DecodeState s = new_decode_state(m);
    const Status st = extend(m, s, tokens);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return s;
  }
};

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// A checkpoint written from one backend loads on the other, tensor for tensor, and the next
// turn's logits there equal the next turn continued where it was written (within the two
// backends' fp32 agreement), and the cold prefill of the whole conversation.
TEST_F(Gpu, CheckpointsMoveBetweenBackendsAndTheNextTurnContinues) {
  auto cpu = load("cpu");
  auto gpu = load("cuda");
  ASSERT_TRUE(cpu && gpu);
  auto fingerprint = model_fingerprint(kModel);
  ASSERT_TRUE(fingerprint.ok());
  const CheckpointIdentity id{cpu->info().family, *fingerprint, 0, kEnginePolicyVersion};
  const auto all = parity_tokens();
  const std::span<const TokenId> turn1(all.data(), 47), turn2(all.data() + 47, 13);
  test::ScratchDir dir;
  for (const bool from_gpu : {true, false}) {
    Model& writer = from_gpu ? *gpu : *cpu;
    Model& reader = from_gpu ? *cpu : *gpu;
    DecodeState written = prefill(writer, turn1);
    const auto path = dir.file(from_gpu ? "gpu.fsck" : "cpu.fsck");
    ASSERT_TRUE(save_checkpoint(path, written, id).ok());
    auto loaded = load_checkpoint(path, reader, id);
    ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
    // The copy is exact: the same values, now in the other backend's memory.
    EXPECT_EQ(max_difference(compare_states(*loaded->state.trunk, *written.trunk)), 0.0);
    EXPECT_EQ(max_difference(compare_states(*loaded->state.mtp_history, *written.mtp_history)),
              0.0);
    EXPECT_EQ(loaded->state.next_logits, written.next_logits);
    DecodeState continued = std::move(loaded->state);
    ASSERT_TRUE(extend(reader, continued, turn2).ok());
    ASSERT_TRUE(extend(writer, written, turn2).ok());
    std::vector<TokenId> both(turn1.begin(), turn1.end());
    both.insert(both.end(), turn2.begin(), turn2.end());
    DecodeState cold = prefill(reader, both);
    const double across = max_abs(continued.next_logits, written.next_logits);
    const double vs_cold = max_abs(continued.next_logits, cold.next_logits);
    const double state_vs_cold = max_difference(compare_states(*continued.trunk, *cold.trunk));
    std::printf("[%s -> %s] next-turn logits vs writer %.3g, vs cold %.3g; state vs cold %.3g\n",
                writer.info().backend.c_str(), reader.info().backend.c_str(), across, vs_cold,
                state_vs_cold);
    EXPECT_LE(across, 1e-4);
    EXPECT_LE(vs_cold, 1e-4);
    EXPECT_LE(state_vs_cold, 1e-4);
    EXPECT_EQ(argmax(continued.next_logits), argmax(cold.next_logits));
  }
}

// DESIGN "On the GPU" rule 5: after warm-up, a decode step (trunk and MTP head) is served from
// the device pool: no cudaMalloc, counted by the memory itself.
TEST_F(Gpu, SteadyStateDecodeAllocatesNoDeviceMemory) {
  auto gpu = load("cuda", "bf16");
  ASSERT_TRUE(gpu);
  const auto* qwen = dynamic_cast<const QwenNextModel*>(gpu.get());
  ASSERT_NE(qwen, nullptr);
  const auto& memory = qwen->backend().memory();
  const auto all = parity_tokens();
  DecodeState s = prefill(*gpu, std::span(all).first(20));
  auto step = [&](TokenId t) {
    const TokenId in[1] = {t};
    ForwardOutput out, head;
    ASSERT_TRUE(gpu->forward(*s.trunk, in, LogitsRows::kLast, out).ok());
    ASSERT_TRUE(gpu->mtp()->forward(*s.mtp_history, out.hidden, in, LogitsRows::kLast, head).ok());
  };
  for (int i = 0; i < 3; ++i) step(all[static_cast<std::size_t>(20 + i)]);
  const auto warm = memory->stats();
  for (int i = 0; i < 32; ++i) step(all[static_cast<std::size_t>(23 + i)]);
  const auto after = memory->stats();
  std::printf("device allocations: %lld at warm-up, %lld after 32 more steps; %.1f MiB reserved\n",
              static_cast<long long>(warm.system_allocations),
              static_cast<long long>(after.system_allocations),
              static_cast<double>(after.bytes_reserved) / (1 << 20));
  EXPECT_GT(warm.system_allocations, 0);
  EXPECT_EQ(after.system_allocations, warm.system_allocations);
  EXPECT_EQ(after.bytes_reserved, warm.bytes_reserved);
}

// On the GPU greedy decoding picks on the device by default (only token ids come back), and
// over a long decode (QSA blocks completed, caches regrown) it emits the host picks' tokens at
// every MTP depth; FLASHSERVE_DEVICE_SAMPLING=0 turns it off.
TEST_F(Gpu, GreedyDecodePicksOnTheDeviceAndEmitsTheHostPicksTokens) {
  auto gpu = load("cuda", "bf16");
  ASSERT_TRUE(gpu);
  const auto all = parity_tokens();
  for (const int depth : {0, 1, 3}) {
    GenerateOptions opt;
    opt.max_tokens = 256;
    opt.mtp_depth = depth;
    ASSERT_TRUE(picks_on_backend(*gpu, opt) ||
                std::getenv("FLASHSERVE_DEVICE_SAMPLING") != nullptr);
    DecodeState device_state = prefill(*gpu, std::span(all).first(31));
    const auto device = generate(*gpu, device_state, opt);
    ASSERT_TRUE(device.error.ok()) << device.error.to_string();
    opt.pick_on = PickOn::kHost;
    DecodeState host_state = prefill(*gpu, std::span(all).first(31));
    const auto host = generate(*gpu, host_state, opt);
    ASSERT_TRUE(host.error.ok()) << host.error.to_string();
    EXPECT_EQ(device.tokens, host.tokens) << "depth " << depth;
    EXPECT_EQ(device.stats.accepted, host.stats.accepted) << "depth " << depth;
    EXPECT_EQ(device_state.next_logits, host_state.next_logits) << "depth " << depth;
    EXPECT_EQ(max_difference(compare_states(*device_state.trunk, *host_state.trunk)), 0.0);
  }
}

// Two-sample chi-square of the token at each of the first three positions, sampled MTP at each
// depth against sampled autoregressive decoding, on the GPU. Cells with fewer than 10 draws in
// both arms together are pooled into one cell (kept, not dropped).
TEST_F(Gpu, SampledMtpHasTheAutoregressiveDistribution) {
  auto gpu = load("cuda");
  ASSERT_TRUE(gpu);
  const auto all = parity_tokens();
  const DecodeState base = prefill(*gpu, std::span(all).first(30));
  constexpr int kDraws = 600;
  GenerateOptions opt;
  opt.max_tokens = 3;
  opt.sampler.temperature = 1.0;
  opt.sampler.top_k = 20;
  opt.sampler.top_p = 1.0;
  auto draws = [&](int depth, std::uint64_t seed0) {
    std::vector<std::vector<TokenId>> out;
    opt.mtp_depth = depth;
    for (int i = 0; i < kDraws; ++i) {
      opt.seed = seed0 + static_cast<std::uint64_t>(i);
      DecodeState s = base.clone();
      auto r = generate(*gpu, s, opt);
      EXPECT_TRUE(r.error.ok()) << r.error.to_string();
      EXPECT_TRUE(r.state_complete);
      r.tokens.resize(3, -1);
      out.push_back(r.tokens);
    }
    return out;
  };
  const auto ar = draws(0, 1'000'000);
  for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
    const auto mtp = draws(depth, 2'000'000 + 100'000 * static_cast<std::uint64_t>(depth));
    for (std::size_t pos = 0; pos < 3; ++pos) {
      std::map<TokenId, std::pair<int, int>> cells;
      for (const auto& t : ar) ++cells[t[pos]].first;
      for (const auto& t : mtp) ++cells[t[pos]].second;
      std::vector<std::pair<int, int>> kept;
      std::pair<int, int> pooled{0, 0};
      for (const auto& [tok, c] : cells) {
        if (c.first + c.second >= 10) {
          kept.push_back(c);
        } else {
          pooled.first += c.first;
          pooled.second += c.second;
        }
      }
      if (pooled.first + pooled.second > 0) kept.push_back(pooled);
      double chi2 = 0;
      for (const auto& [a, b] : kept)
        chi2 += static_cast<double>(a - b) * (a - b) / static_cast<double>(a + b);
      const double df = static_cast<double>(kept.size()) - 1;
      // Wilson-Hilferty critical value at p = 0.001 / 9 (9 tests), z = 3.69.
      const double z = 3.69, h = 2.0 / (9.0 * df);
      const double critical = df * std::pow(1 - h + z * std::sqrt(h), 3);
      std::printf("depth %d position %zu: chi2 %.1f, df %.0f, critical %.1f\n", depth, pos + 1,
                  chi2, df, critical);
      if (df >= 1) {
        EXPECT_LT(chi2, critical) << "depth " << depth << " position " << pos + 1;
      }
    }
  }
}

}  // namespace
}  // namespace fs
