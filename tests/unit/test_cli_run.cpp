// flashserve run with the embedded default model: it answers, reproducibly, and an interactive
// conversation reuses the warm state of the previous turn; the same on the tiny DeepSeek V4 and
// GLM 5.3 folders.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace fs {
namespace {

TEST(RunCli, EmbeddedModelCompletesACodePrompt) {
  std::string a, b;
  const auto cmd =
      test::flashserve_binary() + " run --max-tokens 24 --seed 3 --quiet 'def fibonacci(n):'";
  ASSERT_EQ(test::run_command(cmd, &a), 0) << a;
  ASSERT_EQ(test::run_command(cmd, &b), 0) << b;
  EXPECT_EQ(a.rfind("def fibonacci(n):", 0), 0u) << a;  // the prompt, then its continuation
  EXPECT_GT(a.size(), std::string("def fibonacci(n):").size() + 10);
  EXPECT_EQ(a, b);  // same seed, same text
}

TEST(RunCli, GreedyMtpAndAutoregressiveAgree) {
  std::string ar, mtp;
  const auto base =
      test::flashserve_binary() + " run --max-tokens 40 --temperature 0 --quiet 'import os\n'";
  ASSERT_EQ(test::run_command(base + " --mtp-depth 0", &ar), 0) << ar;
  ASSERT_EQ(test::run_command(base + " --mtp-depth 3", &mtp), 0) << mtp;
  EXPECT_EQ(ar, mtp);
}

TEST(RunCli, SecondChatTurnIsAWarmSessionHit) {
  std::string out;
  const int rc = test::run_command(
      "printf 'hello\\nwhat is a list?\\n' | " + test::flashserve_binary() + " run --max-tokens 8",
      &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("[cold prompt"), std::string::npos) << out;
  EXPECT_NE(out.find("[ram prompt"), std::string::npos) << out;
}

TEST(GenerateCli, PromptTextInTextOut) {
  std::string out;
  const auto model = test::flashserve_binary() + " generate --model " +
                     std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code";
  ASSERT_EQ(test::run_command(
                model + " --prompt 'def add(a, b):' --max-tokens 6 --mtp-depth 2 --json", &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["tokens"].size(), 6u);
  EXPECT_TRUE(j["text"].is_string());
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  EXPECT_EQ(j["stats"]["drafted"].size(), 2u);
  EXPECT_NE(test::run_command(model + " --prompt x --tokens 1,2", &out), 0);  // one or the other
  EXPECT_NE(test::run_command(model + " --tokens 1,99999", &out), 0);
  EXPECT_NE(out.find("99999"), std::string::npos) << out;
}

// The tiny random-weight DeepSeek V4 and GLM 5.3 folders (tools/make_tiny_servable.py) through
// the CLI: a chat turn in the family's format, a warm second turn, greedy MTP equal to plain
// decoding, `generate` text in and out. Their output is gibberish; what is checked is that it
// runs, reproducibly, with the state reused.
class TinyFamilyCli : public ::testing::TestWithParam<const char*> {
 protected:
  std::string model() const {
    return " --model " + std::string(FLASHSERVE_SOURCE_DIR) + "/models/" + GetParam();
  }
};

TEST_P(TinyFamilyCli, ChatTurnsAndMtp) {
  std::string a, b;
  const auto chat = test::flashserve_binary() + " run" + model() +
                    " --chat --max-tokens 12 --temperature 0 --quiet 'What is a list?'";
  ASSERT_EQ(test::run_command(chat, &a), 0) << a;
  ASSERT_EQ(test::run_command(chat, &b), 0) << b;
  EXPECT_GT(a.size(), 2u) << a;
  EXPECT_EQ(a, b);
  std::string ar, mtp;
  const auto base = test::flashserve_binary() + " run" + model() +
                    " --max-tokens 24 --temperature 0 --quiet 'import os\n'";
  ASSERT_EQ(test::run_command(base + " --mtp-depth 0", &ar), 0) << ar;
  ASSERT_EQ(test::run_command(base + " --mtp-depth 3", &mtp), 0) << mtp;
  EXPECT_EQ(ar, mtp);
  std::string turns;
  ASSERT_EQ(test::run_command("printf 'hello\\nwhat is a list?\\n' | " + test::flashserve_binary() +
                                  " run" + model() + " --max-tokens 6",
                              &turns),
            0)
      << turns;
  EXPECT_NE(turns.find("[cold prompt"), std::string::npos) << turns;
  EXPECT_NE(turns.find("[ram prompt"), std::string::npos) << turns;
}

TEST_P(TinyFamilyCli, GenerateTextInTextOut) {
  std::string out;
  ASSERT_EQ(test::run_command(test::flashserve_binary() + " generate" + model() +
                                  " --prompt 'def add(a, b):' --max-tokens 6 --mtp-depth 2 --json",
                              &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["tokens"].size(), 6u);
  EXPECT_FALSE(j["text"].get<std::string>().empty());
  EXPECT_EQ(j["stats"]["drafted"].size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(Families, TinyFamilyCli,
                         ::testing::Values("deepseek-v4-tiny", "glm5-tiny"), [](const auto& info) {
                           return std::string(info.param[0] == 'd' ? "DeepSeekV4" : "Glm5");
                         });

TEST(RunCli, MissingModelIsAClearError) {
  std::string out;
  EXPECT_EQ(test::run_command(test::flashserve_binary() + " run --model /nonexistent 'x'", &out),
            1);
  EXPECT_NE(out.find("/nonexistent"), std::string::npos) << out;
}

}  // namespace
}  // namespace fs
