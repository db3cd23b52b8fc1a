// flashserve run with the embedded default model: it answers, reproducibly, and an interactive
// conversation reuses the warm state of the previous turn; the same on the tiny DeepSeek V4 and
// GLM 5.3 folders.
#include <gtest/gtest.h>

#include <filesystem>
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

// The embedded model's files linked into a scratch folder beside a generation_config.json of our
// own (the weights' fingerprint cache is written there, not into models/).
std::string embedded_with_generation_config(const test::ScratchDir& dir, const std::string& text) {
  const std::filesystem::path src = std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code";
  const auto model = dir.path() / "model";
  std::filesystem::create_directories(model);
  for (const auto& e : std::filesystem::directory_iterator(src)) {
    const auto name = e.path().filename().string();
    if (name == "generation_config.json" || name.starts_with(".")) continue;
    std::filesystem::create_symlink(e.path(), model / name);
  }
  test::write_text((model / "generation_config.json").string(), text);
  return model.string();
}

// `run` takes the sampling a model's generation_config.json recommends for what its flags leave
// unset; a flag wins; --generation-config none keeps run's own defaults.
TEST(RunCli, UnsetSamplingFlagsTakeTheModelsGenerationConfig) {
  test::ScratchDir dir;
  const auto model = embedded_with_generation_config(
      dir, R"({"eos_token_id": [2, 0], "do_sample": true, "temperature": 1.3, "top_k": 50})");
  const auto run = test::flashserve_binary() + " run --model " + model +
                   " --max-tokens 32 --seed 5 --quiet 'import os\n'";
  std::string from_file, same_by_flags, greedy, greedy_by_flag, own;
  ASSERT_EQ(test::run_command(run, &from_file), 0) << from_file;
  // run's top_p 0.95 stays: the file does not set it.
  ASSERT_EQ(test::run_command(run + " --generation-config none --temperature 1.3 --top-k 50",
                              &same_by_flags),
            0);
  EXPECT_EQ(from_file, same_by_flags);
  ASSERT_EQ(test::run_command(run + " --temperature 0", &greedy), 0);
  ASSERT_EQ(test::run_command(run + " --generation-config none --temperature 0", &greedy_by_flag),
            0);
  EXPECT_EQ(greedy, greedy_by_flag);
  ASSERT_EQ(test::run_command(run + " --generation-config none", &own), 0);
  EXPECT_NE(from_file, own);  // 1.3 / top-k 50 against run's 0.6 / top-k 20
  EXPECT_NE(from_file, greedy);
}

// `serve` says at start which sampling unset fields get, and refuses a bad generation_config.json
// naming the field instead of serving with it.
TEST(ServeCli, StartUpNamesTheSamplingDefaultsAndRefusesABadFile) {
  test::ScratchDir dir;
  const auto model = embedded_with_generation_config(
      dir, R"({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05})");
  // SIGINT after the banner: the clean stop path.
  const auto serve = "timeout --preserve-status -s INT 6 " + test::flashserve_binary() +
                     " serve --port 0 --model ";
  std::string out;
  EXPECT_EQ(test::run_command(serve + model, &out), 0) << out;
  EXPECT_NE(out.find("flashserve: sampling: temperature 0.7, top_p 0.8, top_k 20, "
                     "repetition_penalty 1.05 from generation_config.json unless a request sets "
                     "them"),
            std::string::npos)
      << out;
  EXPECT_EQ(test::run_command(serve + model + " --generation-config none", &out), 0) << out;
  EXPECT_NE(out.find("flashserve: sampling: greedy unless a request sets temperature"),
            std::string::npos)
      << out;
  test::write_text(model + "/generation_config.json", R"({"top_p": 3})");
  EXPECT_EQ(test::run_command(serve + model, &out), 1) << out;
  EXPECT_NE(out.find("generation_config.json: top_p must be in (0, 1]"), std::string::npos) << out;
  EXPECT_EQ(out.find("listening"), std::string::npos) << out;
}

TEST(RunCli, MissingModelIsAClearError) {
  std::string out;
  EXPECT_EQ(test::run_command(test::flashserve_binary() + " run --model /nonexistent 'x'", &out),
            1);
  EXPECT_NE(out.find("/nonexistent"), std::string::npos) << out;
}

}  // namespace
}  // namespace fs
