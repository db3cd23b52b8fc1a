// inspect: the fixtures account for every tensor; a checkpoint that lacks, adds or reshapes a
// tensor is reported; the command line fails with a message on corrupt files.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "model/inspect.h"
#include "test_support.h"

namespace fs {
namespace {

using test::ScratchDir;

TEST(Inspect, EveryFixtureIsComplete) {
  for (const char* family : {"qwen4_exp", "deepseek_v4", "glm5_next"}) {
    SCOPED_TRACE(family);
    auto r = inspect_model_dir(test::hf_tiny(family));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_TRUE(r->missing_tensors.empty()) << r->missing_tensors.front();
    EXPECT_TRUE(r->unexpected_tensors.empty()) << r->unexpected_tensors.front();
    EXPECT_TRUE(r->mismatched_tensors.empty()) << r->mismatched_tensors.front();
    EXPECT_GT(r->parameters, 100000);
    EXPECT_GT(r->bytes_by_dtype.at("F32"), 0u);
  }
}

// Copies a fixture with `edit` applied to its tensor list.
void copy_fixture(const std::string& family, const std::string& out_dir,
                  const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  std::filesystem::copy_file(test::hf_tiny(family) + "/config.json", out_dir + "/config.json");
  auto f = SafetensorsFile::open(test::hf_tiny(family) + "/model.safetensors");
  ASSERT_TRUE(f.ok());
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, e] : f->tensors()) {
    const auto v = *f->view(name);
    tensors.push_back({name, v.dtype, v.shape, v.bytes});
  }
  edit(tensors);
  ASSERT_TRUE(write_safetensors(out_dir + "/model.safetensors", tensors).ok());
}

TEST(Inspect, ReportsMissingUnexpectedAndMismatched) {
  ScratchDir dir;
  const std::vector<float> extra(64, 0.5f);
  const auto* p = reinterpret_cast<const std::uint8_t*>(extra.data());
  copy_fixture("qwen4_exp", dir.path().string(), [&](std::vector<TensorToWrite>& t) {
    std::erase_if(
        t, [](const TensorToWrite& x) { return x.name == "model.layers.2.linear_attn.A_log"; });
    for (auto& x : t) {
      if (x.name == "model.layers.0.linear_attn.dt_bias")
        x.shape = {2, 2};  // same bytes, wrong shape
    }
    t.push_back({"model.layers.9.bogus.weight", DType::kF32, {64}, {p, 256}});
    t.push_back({"mtp.layers.0.norm.weight", DType::kF32, {64}, {p, 256}});
  });
  auto r = inspect_model_dir(dir.path().string());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->missing_tensors, (std::vector<std::string>{"layers.2.linear_attn.A_log"}));
  EXPECT_EQ(r->unexpected_tensors, (std::vector<std::string>{"layers.9.bogus.weight"}));
  ASSERT_EQ(r->mismatched_tensors.size(), 1u);
  EXPECT_NE(r->mismatched_tensors[0].find("layers.0.linear_attn.dt_bias"), std::string::npos);
  EXPECT_EQ(r->mtp_tensors.size(), 1u);
  EXPECT_FALSE(r->complete());
}

TEST(InspectCli, JsonShowsScheduleAndEmptyLists) {
  std::string out;
  const int rc = test::run_command(
      test::flashserve_binary() + " inspect --json --model " + test::hf_tiny("deepseek_v4"), &out);
  ASSERT_EQ(rc, 0) << out;
  const auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["family"], "deepseek_v4");
  EXPECT_EQ(j["layers"][1]["attention"], "compressed_sparse_attention");
  EXPECT_EQ(j["layers"][0]["mlp"], "hash_moe");
  EXPECT_TRUE(j["missing_tensors"].empty());
  EXPECT_TRUE(j["unexpected_tensors"].empty());
}

TEST(InspectCli, CorruptCheckpointExitsNonZeroNamingTheProblem) {
  ScratchDir dir;
  std::filesystem::copy_file(test::hf_tiny("qwen4_exp") + "/config.json", dir.file("config.json"));
  auto bytes = test::read_bytes(test::hf_tiny("qwen4_exp") + "/model.safetensors");
  bytes.resize(bytes.size() / 2);
  test::write_bytes(dir.file("model.safetensors"), bytes);
  std::string out;
  int rc = test::run_command(test::flashserve_binary() + " inspect --model " + dir.path().string(),
                             &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("out of range"), std::string::npos) << out;
  EXPECT_NE(out.find("model.safetensors"), std::string::npos) << out;

  test::write_text(dir.file("config.json"), "{\"model_type\": \"qwen4_exp\"}");
  rc = test::run_command(test::flashserve_binary() + " inspect --model " + dir.path().string(),
                         &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("'vocab_size' is required"), std::string::npos) << out;
}

}  // namespace
}  // namespace fs
