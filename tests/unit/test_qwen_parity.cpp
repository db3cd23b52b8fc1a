// Logits parity of the Qwen 3.8 Flash Next CPU forward with the HF reference (float64 logits of
// the hf-tiny qwen4_exp fixture): one call, the golden incremental splits, bf16 weights, and the
// sharded PLE table layout.
#include <gtest/gtest.h>

#include <cstdio>

#include "model/convert.h"
#include "model/loader.h"
#include "qwen_fixture.h"
#include "test_support.h"

namespace fs {
namespace {

using test::diff_logits;
using test::hf_tiny;
using test::qwen_cases;
using test::run_splits;

std::unique_ptr<Model> load(const std::string& dir) {
  auto m = load_model(dir);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

// The float32 engine against float64 reference logits: measured max 1.5e-5 (README).
constexpr double kF32Tolerance = 1e-3;

TEST(QwenParity, FullAndIncrementalMatchReference) {
  auto m = load(hf_tiny("qwen4_exp"));
  ASSERT_NE(m, nullptr);
  const auto V = m->info().vocab_size;
  for (const auto& c : qwen_cases()) {
    auto full_state = m->new_state();
    const auto full =
        run_splits(*m, *full_state, c.tokens, {static_cast<std::int64_t>(c.tokens.size())});
    const auto df = diff_logits(full, c.full, V);
    auto inc_state = m->new_state();
    const auto inc = run_splits(*m, *inc_state, c.tokens, c.splits);
    const auto di = diff_logits(inc, c.inc, V);
    std::printf("[parity] L=%zu full max|d|=%.3g inc max|d|=%.3g\n", c.tokens.size(), df.max_abs,
                di.max_abs);
    EXPECT_LE(df.max_abs, kF32Tolerance);
    EXPECT_LE(di.max_abs, kF32Tolerance);
    EXPECT_EQ(df.argmax_mismatches, 0);
    EXPECT_EQ(di.argmax_mismatches, 0);
  }
}

TEST(QwenParity, LoaderRejectsOtherFamilies) {
  for (const char* fam : {"deepseek_v4", "glm5_next"}) {
    auto m = load_model(hf_tiny(fam));
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), ErrorCode::kUnsupported) << m.status().to_string();
  }
}

}  // namespace
}  // namespace fs
