// `flashserve logits` and `flashserve convert` as scripts drive them (DESIGN command-line
// contract).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "qwen_fixture.h"
#include "test_backend.h"
#include "test_support.h"

namespace fs {
namespace {

using test::flashserve_binary;
using test::hf_tiny;

std::string join(const std::vector<TokenId>& v) {
  std::string s;
  for (const auto t : v) {
    if (!s.empty()) s.push_back(',');
    s.append(std::to_string(t));
  }
  return s;
}

TEST(QwenCli, LogitsWritesRowsAndPrintsJson) {
  test::ScratchDir dir;
  const auto c = test::qwen_cases().front();
  const auto out = dir.file("l.f32");
  std::string text;
  const auto cmd = flashserve_binary() + " logits --backend " + test::test_backend() +
                   " --dtype f32 --model " + hf_tiny("qwen4_exp") + " --tokens " + join(c.tokens) +
                   " --splits 37,1,3,1,7,1,14 --out " + out;
  ASSERT_EQ(test::run_command(cmd, &text), 0) << text;
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["n_tokens"], c.tokens.size());
  EXPECT_EQ(j["vocab"], 256);
  EXPECT_EQ(j["backend"], test::test_backend());
  EXPECT_TRUE(j.contains("ms"));
  const auto got = test::read_f32(out);
  const auto d = test::diff_logits(got, c.inc, 256);
  EXPECT_LE(d.max_abs, 1e-3);
}

TEST(QwenCli, LogitsRejectsBadInput) {
  test::ScratchDir dir;
  const auto base = flashserve_binary() + " logits --model " + hf_tiny("qwen4_exp") + " --out " +
                    dir.file("x.f32") + " ";
  for (const std::string args :
       {"--tokens 1,2,x", "--tokens 1,,2", "--tokens 1,256", "--tokens 1,2,3 --splits 1,1",
        "--tokens 1,2 --splits 1,a", "--tokens -1", "--tokens 1 --backend tpu"}) {
    std::string text;
    EXPECT_NE(test::run_command(base + args, &text), 0) << args;
    EXPECT_NE(text.find("flashserve logits:"), std::string::npos) << args << ": " << text;
  }
}

TEST(QwenCli, ConvertToBf16) {
  test::ScratchDir dir;
  std::string text;
  const auto out = dir.file("bf16");
  ASSERT_EQ(test::run_command(flashserve_binary() + " convert --model " + hf_tiny("qwen4_exp") +
                                  " --dtype bf16 --out " + out,
                              &text),
            0)
      << text;
  ASSERT_EQ(test::run_command(flashserve_binary() + " inspect --json --model " + out, &text), 0)
      << text;
  const auto j = nlohmann::json::parse(text);
  EXPECT_TRUE(j["bytes_by_dtype"].contains("BF16"));
  EXPECT_FALSE(j["bytes_by_dtype"].contains("F32"));
}

}  // namespace
}  // namespace fs
