// config.json -> typed configs: the fixtures parse to the schedules their layer lists say, and a
// bad field is named in the error.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/family.h"
#include "test_support.h"
#include "util/mapped_file.h"

namespace fs {
namespace {

nlohmann::json fixture_config(const std::string& family) {
  return nlohmann::json::parse(*read_text_file(test::hf_tiny(family) + "/config.json"));
}

Status describe_status(const nlohmann::json& j) {
  return describe_model_config(j.dump(), "config.json").status();
}

void expect_field_error(const nlohmann::json& j, const std::string& field) {
  const auto s = describe_status(j);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'" + field + "'"), std::string::npos) << s.message();
}

TEST(Config, QwenFixture) {
  auto d = describe_model(test::hf_tiny("qwen4_exp"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->family, Family::kQwenNext);
  const auto& c = std::get<QwenNextConfig>(d->config);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.hc_count, 2);
  EXPECT_EQ(c.rotary_dim(), 8);
  EXPECT_EQ(c.gdn_conv_dim(), 128);
  EXPECT_EQ(c.ple_layer_ids, (std::vector<std::int64_t>{2}));
  EXPECT_EQ(c.ple_layer_index(1), 0);
  EXPECT_EQ(c.ple_layer_index(2), -1);
  ASSERT_EQ(d->layers.size(), 4u);
  EXPECT_EQ(d->layers[0].attention, "linear_attention");
  EXPECT_EQ(d->layers[1].features, (std::vector<std::string>{"ple"}));
  EXPECT_EQ(d->layers[3].attention, "qwen_sparse_attention");
  // arch-qwen.md section 7: primes 101, 103, 107, 109; 420 rows padded to 424.
  EXPECT_EQ(ple_head_vocab_sizes(c, 0), (std::vector<std::int64_t>{101, 103, 107, 109}));
  EXPECT_EQ(ple_table_rows(c, 0), 424);
  EXPECT_EQ(ple_head_vocab_sizes(c, 1), (std::vector<std::int64_t>{113, 127, 131, 137}));
}

TEST(Config, QwenDefaultsMatchTheReleasedTableSize) {
  // arch-qwen.md 2.7: HF defaults give 16 primes from 20000003 to 20000171, 320001536 rows.
  auto j = fixture_config("qwen4_exp");
  j["ngram_vocab_size_base"] = 20000000;
  j["make_ngram_vocab_size_divisible_by"] = 128;
  j["heads_per_ngram"] = 8;
  j["ple_embed_dim"] = 64;
  auto d = describe_model_config(j.dump(), "config.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const auto& c = std::get<QwenNextConfig>(d->config);
  const auto sizes = ple_head_vocab_sizes(c, 0);
  ASSERT_EQ(sizes.size(), 16u);
  EXPECT_EQ(sizes.front(), 20000003);
  EXPECT_EQ(sizes.back(), 20000171);
  EXPECT_EQ(ple_table_rows(c, 0), 320001536);
}

TEST(Config, DeepseekFixture) {
  auto d = describe_model(test::hf_tiny("deepseek_v4"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->family, Family::kDeepseekV4);
  const auto& c = std::get<DeepseekV4Config>(d->config);
  EXPECT_EQ(c.rope_head_dim(), 8);
  EXPECT_EQ(c.csa_compress_rate, 4);
  EXPECT_EQ(c.hca_compress_rate, 16);
  ASSERT_EQ(d->layers.size(), 6u);
  EXPECT_EQ(d->layers[0].attention, "sliding_attention");
  EXPECT_EQ(d->layers[0].mlp, "hash_moe");
  EXPECT_EQ(d->layers[1].attention, "compressed_sparse_attention");
  EXPECT_EQ(d->layers[2].attention, "heavily_compressed_attention");
  EXPECT_EQ(d->layers[2].mlp, "moe");
}

// DeepSeek's own config.json spells the layer kinds as HF's legacy fields: per-layer
// compress_ratios (the MTP block's entry after the trunk's), num_hash_layers, no compress_rates.
TEST(Config, DeepseekLegacyFieldsOfTheOfficialRelease) {
  auto ds = fixture_config("deepseek_v4");
  for (const char* f : {"layer_types", "mlp_layer_types", "compress_rates"}) ds.erase(f);
  ds["compress_ratios"] = {0, 4, 128, 4, 0, 128, 0};  // 6 layers, then the MTP block's
  ds["num_hash_layers"] = 1;
  auto d = describe_model_config(ds.dump(), "config.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const auto& c = std::get<DeepseekV4Config>(d->config);
  EXPECT_EQ(c.csa_compress_rate, 4);
  EXPECT_EQ(c.hca_compress_rate, 128);
  ASSERT_EQ(d->layers.size(), 6u);
  EXPECT_EQ(d->layers[0].attention, "sliding_attention");
  EXPECT_EQ(d->layers[1].attention, "compressed_sparse_attention");
  EXPECT_EQ(d->layers[2].attention, "heavily_compressed_attention");
  EXPECT_EQ(d->layers[5].attention, "heavily_compressed_attention");
  EXPECT_EQ(d->layers[0].mlp, "hash_moe");
  EXPECT_EQ(d->layers[1].mlp, "moe");
  ds["compress_rate_hca"] = 16;
  d = describe_model_config(ds.dump(), "config.json");
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(std::get<DeepseekV4Config>(d->config).hca_compress_rate, 16);
  ds["compress_ratios"][1] = 8;
  expect_field_error(ds, "compress_ratios");
  ds.erase("compress_ratios");
  expect_field_error(ds, "layer_types");
}

TEST(Config, GlmFixtureAndTextConfigNesting) {
  auto d = describe_model(test::hf_tiny("glm5_next"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->family, Family::kGlm5);
  ASSERT_EQ(d->layers.size(), 5u);
  EXPECT_EQ(d->layers[0].mlp, "dense");
  EXPECT_EQ(d->layers[2].features, (std::vector<std::string>{"indexer:shared"}));

  // The multimodal layout: text fields under text_config, vision_config ignored.
  nlohmann::json nested = {{"model_type", "glm5_next"},
                           {"text_config", fixture_config("glm5_next")},
                           {"vision_config", {{"hidden_size", "whatever"}}}};
  auto dn = describe_model_config(nested.dump(), "config.json");
  ASSERT_TRUE(dn.ok()) << dn.status().to_string();
  EXPECT_EQ(dn->layers.size(), 5u);
}

TEST(Config, BadFieldsAreNamed) {
  auto q = fixture_config("qwen4_exp");
  q.erase("hidden_size");
  expect_field_error(q, "hidden_size");

  q = fixture_config("qwen4_exp");
  q["num_experts_per_tok"] = 9;
  expect_field_error(q, "num_experts_per_tok");

  q = fixture_config("qwen4_exp");
  q["hc_count"] = "two";
  expect_field_error(q, "hc_count");

  q = fixture_config("qwen4_exp");
  q["layer_types"][0] = "mamba";
  expect_field_error(q, "layer_types");

  q = fixture_config("qwen4_exp");
  q["ple_layer_ids"] = {4};  // layer 4 is sparse attention; PLE must sit on a linear layer
  expect_field_error(q, "ple_layer_ids");

  q = fixture_config("qwen4_exp");
  q["indexer_budget"] = 6;  // not a multiple of the compress ratio 4
  expect_field_error(q, "indexer_budget");

  auto g = fixture_config("glm5_next");
  g["indexer_types"] = {"full", "shared", "shared", "full", "full"};  // layer 1 follows a KDA layer
  expect_field_error(g, "indexer_types");

  g = fixture_config("glm5_next");
  g["num_key_value_heads"] = 1;
  expect_field_error(g, "num_key_value_heads");

  auto ds = fixture_config("deepseek_v4");
  ds["mlp_layer_types"] = {"moe"};
  expect_field_error(ds, "mlp_layer_types");

  ds = fixture_config("deepseek_v4");
  ds["model_type"] = "llama";
  const auto s = describe_status(ds);
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("llama"), std::string::npos);

  EXPECT_FALSE(describe_model_config("{not json", "config.json").ok());
  EXPECT_FALSE(describe_model_config("[]", "config.json").ok());
}

}  // namespace
}  // namespace fs
