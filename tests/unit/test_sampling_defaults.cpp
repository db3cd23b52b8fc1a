// The sampling a release's generation_config.json recommends (decode/sampling_defaults.h): the
// fields read as HF's GenerationConfig means them, bad values refused naming the file and field.
#include <gtest/gtest.h>

#include "decode/sampling_defaults.h"
#include "test_support.h"

namespace fs {
namespace {

Expected<SamplingDefaults> read_config(const test::ScratchDir& dir, const std::string& text) {
  test::write_text(dir.file("generation_config.json"), text);
  return read_sampling_defaults(dir.path().string());
}

TEST(SamplingDefaults, TheReleaseFieldsOverTheBase) {
  test::ScratchDir dir;
  const auto d = read_config(dir, R"({"bos_token_id": 1, "do_sample": true, "eos_token_id": [2, 3],
      "temperature": 0.7, "top_k": 20, "top_p": 0.8, "transformers_version": "5.17.0"})");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->temperature, 0.7);
  EXPECT_EQ(d->top_p, 0.8);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_FALSE(d->min_p.has_value());
  EXPECT_FALSE(d->repetition_penalty.has_value());
  EXPECT_EQ(d->describe(), "temperature 0.7, top_p 0.8, top_k 20");
  SamplerConfig base;
  base.min_p = 0.05;
  base.presence_penalty = 0.5;
  const SamplerConfig s = d->over(base);
  EXPECT_EQ(s.temperature, 0.7);
  EXPECT_EQ(s.top_p, 0.8);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_EQ(s.min_p, 0.05);  // not in the file: the base's
  EXPECT_EQ(s.presence_penalty, 0.5);
}

// HF decodes greedily unless do_sample is true: a release that says false asks for greedy.
TEST(SamplingDefaults, DoSampleFalseIsGreedy) {
  test::ScratchDir dir;
  const auto d = read_config(dir, R"({"do_sample": false, "temperature": 0.6, "top_p": 0.9})");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->temperature, 0.0);
  EXPECT_TRUE(d->over(SamplerConfig{.temperature = 0.8}).greedy());
}

// No file, a file without sampling fields (the embedded model's), or a GGUF file: no defaults.
TEST(SamplingDefaults, NoneWithoutSamplingFields) {
  test::ScratchDir dir;
  auto d = read_sampling_defaults(dir.path().string());
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty());
  EXPECT_EQ(d->describe(), "none");
  d = read_config(dir, R"({"eos_token_id": [2, 0], "pad_token_id": 0, "temperature": null})");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(d->empty());
  d = read_sampling_defaults(dir.file("generation_config.json"));  // a file, not a folder
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->empty());
  d = read_sampling_defaults(std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_TRUE(d->empty());
}

// A value the sampler would refuse in a request is refused in the file, naming both.
TEST(SamplingDefaults, BadValuesAreRefusedNamingTheFileAndField) {
  test::ScratchDir dir;
  const std::pair<const char*, const char*> cases[] = {
      {R"({"top_p": "high"})", "top_p"},
      {R"({"temperature": -1})", "temperature"},
      {R"({"top_p": 1.5})", "top_p"},
      {R"({"top_k": -3})", "top_k"},
      {R"({"min_p": 2})", "min_p"},
      {R"({"do_sample": "yes"})", "do_sample"},
      {R"({"temperature": 0.7,)", "generation_config.json"},
  };
  for (const auto& [text, field] : cases) {
    const auto d = read_config(dir, text);
    ASSERT_FALSE(d.ok()) << text;
    const auto message = d.status().to_string();
    EXPECT_NE(message.find(field), std::string::npos) << text << ": " << message;
    EXPECT_NE(message.find("generation_config.json"), std::string::npos) << message;
  }
}

// A release's repetition penalty (Qwen's 1.05) is a default like the others: applied to what a
// request leaves unset, named at start-up; out of the sampler's range it refuses the file.
TEST(SamplingDefaults, ARepetitionPenaltyIsApplied) {
  test::ScratchDir dir;
  auto d = read_config(dir, R"({"temperature": 0.7, "repetition_penalty": 1.05})");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->repetition_penalty, 1.05);
  EXPECT_EQ(d->describe(), "temperature 0.7, repetition_penalty 1.05");
  EXPECT_EQ(d->over(SamplerConfig{}).repetition_penalty, 1.05);
  SamplerConfig set;
  set.repetition_penalty = 1.2;
  EXPECT_EQ(d->over(set).repetition_penalty, 1.05);  // the file over the base, as serve layers it
  d = read_config(dir, R"({"repetition_penalty": 0})");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().to_string().find("repetition_penalty"), std::string::npos);
}

}  // namespace
}  // namespace fs
