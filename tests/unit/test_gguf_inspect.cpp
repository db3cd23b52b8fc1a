// inspect on GGUF: per-tensor types, totals by type, and the bytes decode reads per token, on a
// hand-built file shaped like ds4's DeepSeek V4 mixes; the command line prints it as JSON.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "gguf_test_writer.h"
#include "model/gguf_inspect.h"
#include "test_support.h"

namespace fs {
namespace {

using test::GgufBuilder;

constexpr std::uint32_t kF32 = 0, kF16 = 1, kQ8_0 = 8, kQ2_K = 10, kIQ2_XXS = 16, kI32 = 26;

GgufBuilder::Tensor sized(const std::string& name, std::uint32_t type,
                          std::vector<std::uint64_t> dims, std::size_t bytes) {
  return {name, type, std::move(dims), std::vector<std::uint8_t>(bytes), std::nullopt};
}

// V=16 tokens, D=256, 4 experts of which 2 are used, two layers, one MTP tensor.
std::vector<std::uint8_t> ds4_like(bool with_output) {
  GgufBuilder b;
  b.kv_string("general.architecture", "deepseek4")
      .kv_u32("deepseek4.block_count", 2)
      .kv_u32("deepseek4.expert_count", 4)
      .kv_u32("deepseek4.expert_used_count", 2)
      .kv_string_array("tokenizer.ggml.tokens", {"a", "b"});
  b.tensor(sized("token_embd.weight", kF16, {256, 16}, 16 * 256 * 2));
  if (with_output) b.tensor(sized("output.weight", kQ8_0, {256, 16}, 16 * 8 * 34));
  b.tensor(sized("output_norm.weight", kF32, {256}, 1024));
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.tensor(sized(p + "attn_q_a.weight", kQ8_0, {256, 8}, 8 * 8 * 34));
    b.tensor(sized(p + "ffn_gate_exps.weight", kIQ2_XXS, {256, 2, 4}, 4 * 2 * 66));
    b.tensor(sized(p + "ffn_down_exps.weight", kQ2_K, {256, 2, 4}, 4 * 2 * 84));
  }
  b.tensor(sized("blk.0.ffn_gate_tid2eid.weight", kI32, {6, 16}, 16 * 6 * 4));
  b.tensor(sized("mtp.0.e_proj.weight", kQ8_0, {256, 256}, 256 * 8 * 34));
  return b.build();
}

TEST(GgufInspect, DecodeBytesPerTokenFromTheNames) {
  test::ScratchDir dir;
  test::write_bytes(dir.file("ds4.gguf"), ds4_like(true));
  auto r = inspect_gguf_path(dir.file("ds4.gguf"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->architecture, "deepseek4");
  EXPECT_EQ(r->expert_count, 4u);
  EXPECT_EQ(r->expert_used_count, 2u);
  EXPECT_FALSE(r->tied_output);
  EXPECT_EQ(r->by_type.at("IQ2_XXS").tensors, 2u);
  EXPECT_EQ(r->by_type.at("IQ2_XXS").bytes, 2u * 4 * 2 * 66);
  EXPECT_EQ(r->by_type.at("Q8_0").tensors, 4u);

  const std::uint64_t embed_row = 256 * 2, head = 16 * 8 * 34, norm = 1024, tid_row = 6 * 4;
  const std::uint64_t q_a = 8 * 8 * 34, gate_used = 2 * 2 * 66, down_used = 2 * 2 * 84;
  EXPECT_EQ(r->decode_outside_layers.total, embed_row + head + norm);
  ASSERT_EQ(r->decode_per_layer.size(), 2u);
  EXPECT_EQ(r->decode_per_layer[0].total, q_a + gate_used + down_used + tid_row);
  EXPECT_EQ(r->decode_per_layer[1].total, q_a + gate_used + down_used);
  EXPECT_EQ(r->decode_per_layer[1].by_type.at("IQ2_XXS"), gate_used);
  EXPECT_EQ(r->decode.total, embed_row + head + norm + 2 * (q_a + gate_used + down_used) + tid_row);
  EXPECT_EQ(r->decode.by_type.at("Q2_K"), 2 * down_used);
  EXPECT_EQ(r->mtp.total, 256u * 8 * 34);
  EXPECT_EQ(r->metadata.at("deepseek4.expert_count"), "u32 4");
  // ds4's names map onto the schema's; the MTP tensor is not asked to.
  EXPECT_TRUE(r->names_mapped);
  EXPECT_TRUE(r->unmapped_tensors.empty()) << r->unmapped_tensors.front();
  const auto gate = std::find_if(r->tensors.begin(), r->tensors.end(), [](const auto& t) {
    return t.name == "blk.1.ffn_gate_exps.weight";
  });
  ASSERT_NE(gate, r->tensors.end());
  EXPECT_EQ(gate->hf_name, "layers.1.mlp.experts.gate_up_proj");
}

TEST(GgufInspect, TiedHeadReadsTheWholeEmbedding) {
  test::ScratchDir dir;
  test::write_bytes(dir.file("tied.gguf"), ds4_like(false));
  auto r = inspect_gguf_path(dir.file("tied.gguf"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->tied_output);
  EXPECT_EQ(r->decode_outside_layers.total, 16u * 256 * 2 + 1024);
}

TEST(GgufInspect, CommandLinePrintsJsonAndRefusesCorruptFiles) {
  test::ScratchDir dir;
  test::write_bytes(dir.file("ds4.gguf"), ds4_like(true));
  std::string out;
  ASSERT_EQ(test::run_command(test::flashserve_binary() + " inspect --json --model " +
                                  dir.file("ds4.gguf") + " 2>&1",
                              &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["architecture"], "deepseek4");
  EXPECT_EQ(j["tensors"].size(), 11u);
  EXPECT_EQ(j["by_type"]["Q2_K"]["tensors"], 2);
  EXPECT_EQ(j["decode_bytes_per_token"]["per_layer"].size(), 2u);
  EXPECT_EQ(j["unmapped_tensors"].size(), 0u);
  EXPECT_GT(j["decode_bytes_per_token"]["total"].get<std::uint64_t>(), 0u);

  auto broken = ds4_like(true);
  broken.resize(broken.size() - 10);
  test::write_bytes(dir.file("broken.gguf"), broken);
  EXPECT_NE(test::run_command(
                test::flashserve_binary() + " inspect --model " + dir.file("broken.gguf") + " 2>&1",
                &out),
            0);
  EXPECT_NE(out.find("tensor 'mtp.0.e_proj.weight'"), std::string::npos) << out;
  EXPECT_NE(out.find("truncated?"), std::string::npos) << out;
}

}  // namespace
}  // namespace fs
