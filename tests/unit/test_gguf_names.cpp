// ds4's GGUF names for DeepSeek V4 map onto the HF names of our schema: every tensor the
// hf-tiny deepseek_v4 config requires has a GGUF name, and the names of a hand-built ds4-style
// file map as the table says.
#include <gtest/gtest.h>

#include <set>

#include "format/gguf.h"
#include "format/gguf_names.h"
#include "gguf_test_writer.h"
#include "model/deepseek_v4/schema.h"
#include "model/family.h"
#include "test_support.h"

namespace fs {
namespace {

TEST(GgufNames, Deepseek4CoversTheSchema) {
  auto d = describe_model(test::hf_tiny("deepseek_v4"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  std::set<std::string> mapped;
  for (const auto& g : gguf_names_of("deepseek4", static_cast<int>(d->layers.size()))) {
    const auto m = map_gguf_name("deepseek4", g);
    ASSERT_TRUE(m.has_value()) << g;
    mapped.insert(m->hf_name);
  }
  for (const auto& spec : d->tensors) {
    EXPECT_TRUE(mapped.count(spec.name)) << spec.name << " has no ds4 GGUF name";
  }
}

// ds4's MTP names (its side file's `mtp.0.*`) cover the MTP schema: the block's own tensors and
// its layer named as blk.0's.
TEST(GgufNames, Deepseek4MtpCoversTheMtpSchema) {
  auto d = describe_model(test::hf_tiny("deepseek_v4"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  std::set<std::string> mapped;
  std::vector<std::string> names = {
      "enorm.weight", "hnorm.weight",      "e_proj.weight",       "h_proj.weight",
      "norm.weight",  "hc_head_fn.weight", "hc_head_base.weight", "hc_head_scale.weight"};
  for (const auto& g : gguf_names_of("deepseek4", 1))
    if (g.rfind("blk.0.", 0) == 0) names.push_back(g.substr(6));
  for (const auto& n : names) {
    const auto m = map_gguf_mtp_name("deepseek4", "mtp.0." + n);
    ASSERT_TRUE(m.has_value()) << n;
    mapped.insert(m->hf_name);
  }
  for (const auto& spec : deepseek_v4_mtp_tensors(std::get<DeepseekV4Config>(d->config)))
    EXPECT_TRUE(mapped.count(spec.name)) << spec.name << " has no ds4 MTP GGUF name";
  EXPECT_EQ(map_gguf_mtp_name("deepseek4", "mtp.0.attn_q_a.weight")->hf_name,
            "mtp.0.self_attn.q_a_proj.weight");
  EXPECT_EQ(map_gguf_mtp_name("deepseek4", "mtp.0.hc_head_fn.weight")->hf_name,
            "mtp.0.hc_head.hc_fn");
  EXPECT_FALSE(map_gguf_mtp_name("deepseek4", "mtp.1.attn_q_a.weight"));
  EXPECT_FALSE(map_gguf_mtp_name("deepseek4", "blk.0.attn_q_a.weight"));
  EXPECT_FALSE(map_gguf_mtp_name("llama", "mtp.0.attn_q_a.weight"));
}

TEST(GgufNames, HandBuiltDs4FileMaps) {
  test::GgufBuilder b;
  b.kv_string("general.architecture", "deepseek4");
  for (const char* n : {"token_embd.weight", "output_hc_fn.weight", "blk.2.indexer.proj.weight",
                        "blk.2.indexer_compressor_ape.weight", "blk.12.ffn_gate_exps.weight",
                        "blk.12.ffn_up_exps.weight", "blk.0.ffn_gate_tid2eid.weight",
                        "blk.3.exp_probs_b.bias", "blk.0.unknown.weight"}) {
    b.f32_tensor(n, {4});
  }
  test::ScratchDir dir;
  test::write_bytes(dir.file("ds4.gguf"), b.build());
  auto m = GgufModel::open(dir.file("ds4.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const std::string arch = *m->find("general.architecture")->as_string();
  ASSERT_TRUE(gguf_architecture_mapped(arch));
  auto hf = [&](const std::string& n) {
    const auto r = map_gguf_name(arch, n);
    return r ? r->hf_name : std::string("(none)");
  };
  EXPECT_EQ(hf("token_embd.weight"), "embed_tokens.weight");
  EXPECT_EQ(hf("output_hc_fn.weight"), "hc_head.hc_fn");
  EXPECT_EQ(hf("blk.2.indexer.proj.weight"),
            "layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight");
  EXPECT_EQ(hf("blk.2.indexer_compressor_ape.weight"),
            "layers.2.self_attn.compressor.indexer.position_bias");
  EXPECT_EQ(hf("blk.0.ffn_gate_tid2eid.weight"), "layers.0.mlp.gate.tid2eid");
  EXPECT_EQ(hf("blk.3.exp_probs_b.bias"), "layers.3.mlp.gate.e_score_correction_bias");
  const auto gate = map_gguf_name(arch, "blk.12.ffn_gate_exps.weight");
  const auto up = map_gguf_name(arch, "blk.12.ffn_up_exps.weight");
  ASSERT_TRUE(gate && up);
  EXPECT_EQ(gate->hf_name, "layers.12.mlp.experts.gate_up_proj");
  EXPECT_EQ(up->hf_name, gate->hf_name);
  EXPECT_EQ(gate->part, GgufPart::kFirstHalf);
  EXPECT_EQ(up->part, GgufPart::kSecondHalf);
  EXPECT_EQ(hf("blk.0.unknown.weight"), "(none)");
  EXPECT_EQ(hf("blk.01.attn_norm.weight"), "(none)");
  EXPECT_EQ(hf("blk..attn_norm.weight"), "(none)");
  for (const auto& [name, stored] : m->tensors()) {
    if (name != "blk.0.unknown.weight") {
      EXPECT_TRUE(map_gguf_name(arch, name).has_value()) << name;
    }
  }
  EXPECT_FALSE(map_gguf_name("llama", "token_embd.weight").has_value());
}

}  // namespace
}  // namespace fs
