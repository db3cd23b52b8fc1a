// The safetensors reader: real fixtures load whole; every kind of corruption is an error that
// names the problem, never a crash (this file also runs under ASan/UBSan).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "test_support.h"

namespace fs {
namespace {

using test::ScratchDir;

// A file with a hand-written header and `data_bytes` bytes of payload.
std::vector<std::uint8_t> raw_file(const std::string& header, std::size_t data_bytes) {
  std::vector<std::uint8_t> out;
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0x11);
  return out;
}

Status parse_status(const std::vector<std::uint8_t>& bytes) {
  return parse_safetensors_header(bytes).status();
}

void expect_error(const Status& s, ErrorCode code, const std::string& fragment) {
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(fragment), std::string::npos) << "message: " << s.message();
}

TEST(Safetensors, EveryFixtureLoadsWithEveryTensorInBounds) {
  for (const char* family : {"qwen4_exp", "deepseek_v4", "glm5_next"}) {
    SCOPED_TRACE(family);
    const auto path = test::hf_tiny(family) + "/model.safetensors";
    auto file = SafetensorsFile::open(path);
    ASSERT_TRUE(file.ok()) << file.status().to_string();
    EXPECT_GT(file->tensors().size(), 20u);
    const auto size = std::filesystem::file_size(path);
    std::uint64_t payload = 0;
    for (const auto& [name, e] : file->tensors()) {
      const auto view = file->view(name);
      ASSERT_TRUE(view.has_value());
      EXPECT_EQ(view->bytes.size(),
                static_cast<std::size_t>(view->numel()) * dtype_size(view->dtype));
      payload += e.end - e.begin;
    }
    EXPECT_LE(payload, size);
    EXPECT_EQ(file->metadata().at("format"), "pt");
  }
}

TEST(Safetensors, WriterRoundTrip) {
  ScratchDir dir;
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  const std::vector<std::int64_t> b = {7, -8};
  const auto* ab = reinterpret_cast<const std::uint8_t*>(a.data());
  const auto* bb = reinterpret_cast<const std::uint8_t*>(b.data());
  ASSERT_TRUE(write_safetensors(dir.file("x.safetensors"),
                                {{"a", DType::kF32, {2, 3}, {ab, a.size() * 4}},
                                 {"b", DType::kI64, {2}, {bb, b.size() * 8}}},
                                {{"format", "pt"}})
                  .ok());
  auto f = SafetensorsFile::open(dir.file("x.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const auto va = f->view("a");
  ASSERT_TRUE(va);
  EXPECT_EQ(va->shape, (Shape{2, 3}));
  EXPECT_EQ(std::memcmp(va->bytes.data(), a.data(), 24), 0);
  const auto vb = f->view("b");
  ASSERT_TRUE(vb);
  EXPECT_EQ(vb->dtype, DType::kI64);
  EXPECT_FALSE(f->view("c").has_value());
  EXPECT_FALSE(write_safetensors(dir.file("y"), {{"a", DType::kF32, {7}, {ab, 24}}}).ok());
}

TEST(SafetensorsCorrupt, TruncatedFile) {
  const auto good = test::read_bytes(test::hf_tiny("qwen4_exp") + "/model.safetensors");
  std::uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  // Before the length, inside the header, and inside the tensor payload.
  expect_error(parse_status({good.begin(), good.begin() + 5}), ErrorCode::kCorrupt, "too short");
  expect_error(parse_status({good.begin(), good.begin() + 8 + static_cast<long>(header_len) / 2}),
               ErrorCode::kCorrupt, "runs past the end");
  expect_error(parse_status({good.begin(), good.end() - 100}), ErrorCode::kCorrupt, "out of range");
  expect_error(parse_status({}), ErrorCode::kCorrupt, "too short");
}

TEST(SafetensorsCorrupt, HeaderLengthPastEndOrHuge) {
  auto bytes = raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4);
  bytes[0] = 0xff;  // header length now larger than the file
  expect_error(parse_status(bytes), ErrorCode::kCorrupt, "runs past the end");
  bytes[7] = 0x7f;  // and larger than any header may be
  expect_error(parse_status(bytes), ErrorCode::kCorrupt, "exceeds the limit");
}

TEST(SafetensorsCorrupt, OffsetsOutOfRange) {
  expect_error(
      parse_status(raw_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12)),
      ErrorCode::kCorrupt, "out of range");
  expect_error(
      parse_status(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 12)),
      ErrorCode::kCorrupt, "before begin");
  expect_error(
      parse_status(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 12)),
      ErrorCode::kCorrupt, "negative");
}

TEST(SafetensorsCorrupt, DtypeShapeSizeMismatch) {
  expect_error(
      parse_status(raw_file(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,24]}})", 24)),
      ErrorCode::kCorrupt, "size mismatch");
  expect_error(
      parse_status(raw_file(R"({"w":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})", 2)),
      ErrorCode::kUnsupported, "unsupported dtype 'Q4_K'");
  expect_error(
      parse_status(raw_file(R"({"w":{"dtype":"F32","shape":[2,"x"],"data_offsets":[0,8]}})", 8)),
      ErrorCode::kCorrupt, "shape entry");
  expect_error(
      parse_status(raw_file(
          R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8)),
      ErrorCode::kCorrupt, "overflows");
  expect_error(parse_status(raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8)),
               ErrorCode::kCorrupt, "missing field 'shape'");
}

TEST(SafetensorsCorrupt, OverlappingTensors) {
  expect_error(parse_status(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     12)),
               ErrorCode::kCorrupt, "overlap");
}

// Found by fuzz.safetensors: a number too large for a double made nlohmann throw out_of_range,
// which the parser did not catch (std::terminate). Deep nesting is refused too.
TEST(SafetensorsCorrupt, NumbersOutOfRangeAndDeepNesting) {
  expect_error(parse_status(raw_file(
                   R"({"a":{"dtype":"F32","shape":333e3333333333,"data_offsets":[0,4]}})", 4)),
               ErrorCode::kCorrupt, "not valid JSON");
  expect_error(parse_status(raw_file(
                   "{\"a\":" + std::string(100000, '[') + "1" + std::string(100000, ']') + "}", 0)),
               ErrorCode::kCorrupt, "nested deeper than 64");
}

TEST(SafetensorsCorrupt, BadJson) {
  expect_error(parse_status(raw_file(R"({"a":{"dtype":"F32",)", 0)), ErrorCode::kCorrupt,
               "not valid JSON");
  expect_error(parse_status(raw_file("[1,2,3]", 0)), ErrorCode::kCorrupt, "not an object");
  expect_error(parse_status(raw_file(R"({"__metadata__":{"format":3}})", 0)), ErrorCode::kCorrupt,
               "__metadata__");
}

TEST(SafetensorsCorrupt, FileOpenReportsPath) {
  ScratchDir dir;
  test::write_bytes(dir.file("bad.safetensors"), raw_file("{", 0));
  auto f = SafetensorsFile::open(dir.file("bad.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("bad.safetensors"), std::string::npos);
  auto missing = SafetensorsFile::open(dir.file("nope.safetensors"));
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
}

// Splits a fixture into two shards with an index, as large checkpoints are published.
void write_sharded(const std::string& src, const std::string& out_dir, bool drop_second_shard) {
  auto file = SafetensorsFile::open(src);
  ASSERT_TRUE(file.ok());
  std::vector<TensorToWrite> first, second;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  std::size_t i = 0;
  for (const auto& [name, e] : file->tensors()) {
    const auto view = *file->view(name);
    auto& shard = (i++ % 2 == 0) ? first : second;
    shard.push_back({name, view.dtype, view.shape, view.bytes});
    index["weight_map"][name] = (&shard == &first) ? "model-00001-of-00002.safetensors"
                                                   : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(write_safetensors(out_dir + "/model-00001-of-00002.safetensors", first).ok());
  if (!drop_second_shard) {
    ASSERT_TRUE(write_safetensors(out_dir + "/model-00002-of-00002.safetensors", second).ok());
  }
  test::write_text(out_dir + "/model.safetensors.index.json", index.dump());
}

TEST(Checkpoint, ShardedCheckpointMatchesSingleFile) {
  ScratchDir dir;
  const auto src = test::hf_tiny("glm5_next") + "/model.safetensors";
  write_sharded(src, dir.path().string(), false);
  auto sharded = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(sharded.ok()) << sharded.status().to_string();
  auto single = Checkpoint::open(test::hf_tiny("glm5_next"));
  ASSERT_TRUE(single.ok()) << single.status().to_string();
  EXPECT_EQ(sharded->shard_count(), 2u);
  ASSERT_EQ(sharded->tensors().size(), single->tensors().size());
  for (const auto& [name, stored] : single->tensors()) {
    const auto a = single->view(name);
    const auto b = sharded->view(name);
    ASSERT_TRUE(a && b) << name;
    ASSERT_EQ(a->bytes.size(), b->bytes.size());
    EXPECT_EQ(std::memcmp(a->bytes.data(), b->bytes.data(), a->bytes.size()), 0) << name;
  }
}

TEST(Checkpoint, MissingShardIsNamed) {
  ScratchDir dir;
  write_sharded(test::hf_tiny("qwen4_exp") + "/model.safetensors", dir.path().string(), true);
  auto ck = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ck.ok());
  EXPECT_EQ(ck.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(ck.status().message().find("missing shard model-00002-of-00002.safetensors"),
            std::string::npos)
      << ck.status().message();
}

TEST(Checkpoint, IndexMustAgreeWithShards) {
  ScratchDir dir;
  const std::vector<float> v = {1, 2};
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"),
                                {{"model.norm.weight", DType::kF32, {2}, {p, 8}}})
                  .ok());
  test::write_text(
      dir.file("model.safetensors.index.json"),
      R"({"weight_map": {"model.norm.weight": "a.safetensors", "lm_head.weight": "a.safetensors"}})");
  auto ck = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(ck.ok());
  EXPECT_NE(ck.status().message().find("lm_head.weight"), std::string::npos);
  test::write_text(dir.file("model.safetensors.index.json"),
                   R"({"weight_map": {"x": "../a.safetensors"}})");
  EXPECT_FALSE(Checkpoint::open(dir.path().string()).ok());
  test::write_text(dir.file("model.safetensors.index.json"), R"({"weight_map": )");
  auto bad_json = Checkpoint::open(dir.path().string());
  EXPECT_NE(bad_json.status().message().find("not valid JSON"), std::string::npos);
}

TEST(Checkpoint, PrefixesResolveAndVisionIsIgnored) {
  EXPECT_EQ(canonical_tensor_name("model.layers.0.mlp.gate.weight"), "layers.0.mlp.gate.weight");
  EXPECT_EQ(canonical_tensor_name("model.language_model.layers.0.mlp.gate.weight"),
            "layers.0.mlp.gate.weight");
  EXPECT_EQ(canonical_tensor_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(canonical_tensor_name("mtp.layers.0.norm.weight"), "mtp.layers.0.norm.weight");
  EXPECT_FALSE(canonical_tensor_name("model.visual.blocks.0.attn.qkv.weight").has_value());

  ScratchDir dir;
  const std::vector<float> v = {1, 2};
  const auto* p = reinterpret_cast<const std::uint8_t*>(v.data());
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"),
                                {{"model.language_model.norm.weight", DType::kF32, {2}, {p, 8}},
                                 {"model.visual.patch.weight", DType::kF32, {2}, {p, 8}}})
                  .ok());
  auto ck = Checkpoint::open(dir.path().string());
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE(ck->contains("norm.weight"));
  EXPECT_EQ(ck->tensors().size(), 1u);
  EXPECT_EQ(ck->ignored_count(), 1u);

  // The same tensor under both prefixes is ambiguous.
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"),
                                {{"model.language_model.norm.weight", DType::kF32, {2}, {p, 8}},
                                 {"model.norm.weight", DType::kF32, {2}, {p, 8}}})
                  .ok());
  auto dup = Checkpoint::open(dir.path().string());
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("stored twice"), std::string::npos);
}

TEST(Checkpoint, MissingFolderOrWeights) {
  ScratchDir dir;
  EXPECT_EQ(Checkpoint::open(dir.path().string()).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(Checkpoint::open(dir.file("absent")).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace fs
