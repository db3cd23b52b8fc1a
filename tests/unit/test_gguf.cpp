// The GGUF reader: hand-built files (tests/support/gguf_test_writer.h) round-trip their metadata
// and tensors; each kind of corruption is refused with its reason; split sets open as one model.
#include <gtest/gtest.h>

#include <cstring>

#include "format/gguf.h"
#include "gguf_test_writer.h"
#include "test_support.h"

namespace fs {
namespace {

using quant::QuantType;
using test::GgufBuilder;

// A small valid file: metadata of most types, an F32 matrix, a Q8_0 matrix, an I32 vector.
GgufBuilder valid_builder() {
  GgufBuilder b;
  b.kv_string("general.architecture", "deepseek4")
      .kv_u32("deepseek4.block_count", 43)
      .kv_f32("deepseek4.rope.freq_base", 10000.0f)
      .kv_bool("deepseek4.expert_weights_norm", true)
      .kv_i32_array("deepseek4.attention.compress_ratios", {0, 0, 4, 128})
      .kv_string_array("tokenizer.ggml.tokens", {"a", "bc", ""})
      .f32_tensor("output_norm.weight", {4, 3});
  std::vector<std::uint8_t> q8(2 * 2 * 34);  // [2 rows, 64] Q8_0: 2 blocks a row
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<std::uint8_t>(i);
  b.tensor({"blk.0.attn_q_a.weight", 8, {64, 2}, q8, std::nullopt});
  b.tensor(
      {"blk.0.ffn_gate_tid2eid.weight", 26, {6}, std::vector<std::uint8_t>(24, 7), std::nullopt});
  return b;
}

std::string refusal(const std::vector<std::uint8_t>& file) {
  auto h = parse_gguf(file);
  return h.ok() ? std::string("accepted") : h.status().message();
}

TEST(Gguf, ValidFileRoundTrips) {
  const auto file = valid_builder().build();
  auto h = parse_gguf(file);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->version, 3u);
  EXPECT_EQ(h->alignment, 32u);
  EXPECT_EQ(h->data_start % 32, 0u);
  EXPECT_EQ(h->metadata.at("general.architecture").as_string(), "deepseek4");
  EXPECT_EQ(h->metadata.at("deepseek4.block_count").as_uint(), 43u);
  EXPECT_EQ(h->metadata.at("deepseek4.block_count").as_int(), 43);
  EXPECT_EQ(h->metadata.at("deepseek4.rope.freq_base").as_float(), 10000.0);
  EXPECT_EQ(h->metadata.at("deepseek4.expert_weights_norm").as_bool(), true);
  EXPECT_EQ(*h->metadata.at("deepseek4.attention.compress_ratios").as_int_array(),
            (std::vector<std::int64_t>{0, 0, 4, 128}));
  EXPECT_EQ(h->metadata.at("tokenizer.ggml.tokens").strings,
            (std::vector<std::string>{"a", "bc", ""}));
  EXPECT_EQ(h->metadata.at("tokenizer.ggml.tokens").summary(), "array<string>[3]");
  ASSERT_EQ(h->tensors.size(), 3u);
  const auto& norm = h->tensors[0];
  EXPECT_EQ(norm.type, QuantType::kF32);
  EXPECT_EQ(norm.shape, (Shape{3, 4}));  // GGUF's dims reversed: rows first
  EXPECT_EQ(norm.bytes, 48u);
  const auto& q = h->tensors[1];
  EXPECT_EQ(q.type, QuantType::kQ8_0);
  EXPECT_EQ(q.shape, (Shape{2, 64}));
  EXPECT_EQ(q.bytes, 136u);
  EXPECT_EQ(q.offset % 32, 0u);
  EXPECT_EQ(h->tensors[2].type, QuantType::kI32);

  test::ScratchDir dir;
  test::write_bytes(dir.file("m.gguf"), file);
  auto f = GgufFile::open(dir.file("m.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  const auto v = f->view("output_norm.weight");
  ASSERT_TRUE(v.has_value());
  float x[12];
  std::memcpy(x, v->bytes.data(), sizeof x);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(x[i], static_cast<float>(i));
  const auto qv = f->view("blk.0.attn_q_a.weight");
  ASSERT_TRUE(qv.has_value());
  EXPECT_EQ(qv->bytes[5], 5);
  EXPECT_FALSE(f->view("nope").has_value());
}

TEST(Gguf, AlignmentKeyMovesTheDataSection) {
  auto b = valid_builder();
  b.alignment(256).kv_u32("general.alignment", 256);
  auto h = parse_gguf(b.build());
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->alignment, 256u);
  EXPECT_EQ(h->data_start % 256, 0u);
  for (const auto& t : h->tensors) EXPECT_EQ(t.offset % 256, 0u);

  auto odd = valid_builder();
  odd.kv_u32("general.alignment", 48);
  EXPECT_NE(refusal(odd.build()).find("'general.alignment' = 48 is not a power of two"),
            std::string::npos);
  auto typed = valid_builder();
  typed.kv_string("general.alignment", "32");
  EXPECT_NE(refusal(typed.build()).find("must be a u32"), std::string::npos);
}

TEST(Gguf, EveryTruncationIsRefused) {
  const auto file = valid_builder().build();
  for (std::size_t n = 0; n < file.size(); ++n) {
    const std::vector<std::uint8_t> cut(file.begin(),
                                        file.begin() + static_cast<std::ptrdiff_t>(n));
    auto h = parse_gguf(cut);
    EXPECT_FALSE(h.ok()) << "accepted a file cut to " << n << " of " << file.size() << " bytes";
  }
  const std::vector<std::uint8_t> header_cut(file.begin(), file.begin() + 30);
  EXPECT_NE(refusal(header_cut).find("truncated?"), std::string::npos) << refusal(header_cut);
  const std::vector<std::uint8_t> data_cut(file.begin(), file.end() - 1);
  EXPECT_NE(refusal(data_cut).find("tensor 'blk.0.ffn_gate_tid2eid.weight': bytes"),
            std::string::npos)
      << refusal(data_cut);
}

TEST(Gguf, BadMagicAndVersion) {
  auto file = valid_builder().build();
  file[0] = 'X';
  EXPECT_NE(refusal(file).find("bad magic 'XGUF'"), std::string::npos);
  auto v1 = valid_builder();
  v1.version(1);
  auto st = parse_gguf(v1.build());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(st.status().message().find("GGUF version 1"), std::string::npos);
  auto v2 = valid_builder();
  v2.version(2);
  EXPECT_TRUE(parse_gguf(v2.build()).ok());
}

TEST(Gguf, HugeLengthsAreRefusedBeforeAllocation) {
  auto huge_string = GgufBuilder();
  auto value = GgufBuilder::le(std::uint64_t{1} << 62);  // a string length, then nothing
  huge_string.raw_kv("general.name", 8, value);
  EXPECT_NE(
      refusal(huge_string.build()).find("key 'general.name' length 4611686018427387904 exceeds"),
      std::string::npos)
      << refusal(huge_string.build());

  auto huge_array = GgufBuilder();
  auto arr = GgufBuilder::le(std::uint32_t{5});
  GgufBuilder::append(arr, GgufBuilder::le(std::uint64_t{1} << 60));
  huge_array.raw_kv("tokenizer.ggml.token_type", 9, arr);
  EXPECT_NE(refusal(huge_array.build())
                .find("key 'tokenizer.ggml.token_type': array of 1152921504606846976"),
            std::string::npos)
      << refusal(huge_array.build());

  auto file = GgufBuilder().f32_tensor("a", {2}).build();
  std::uint64_t count = ~std::uint64_t{0};
  std::memcpy(file.data() + 8, &count, 8);  // the tensor count
  EXPECT_NE(refusal(file).find("tensor infos cannot fit"), std::string::npos) << refusal(file);

  auto bad_type = GgufBuilder();
  bad_type.raw_kv("general.x", 13, {});
  EXPECT_NE(refusal(bad_type.build()).find("key 'general.x': unknown value type 13"),
            std::string::npos);
  auto bad_bool = GgufBuilder();
  bad_bool.raw_kv("general.b", 7, {2});
  EXPECT_NE(refusal(bad_bool.build()).find("bool byte 2"), std::string::npos);
}

TEST(Gguf, TensorInfoProblemsAreNamed) {
  auto past_file =
      GgufBuilder()
          .tensor({"blk.1.ffn_down_exps.weight", 0, {4}, std::vector<std::uint8_t>(16), 4096})
          .build();
  past_file.resize(past_file.size() - 4096);  // the data section ends before the tensor starts
  EXPECT_NE(refusal(past_file).find("tensor 'blk.1.ffn_down_exps.weight': bytes [4096, 4112)"),
            std::string::npos)
      << refusal(past_file);

  auto misaligned = GgufBuilder();
  misaligned.f32_tensor("a", {8}).tensor({"b", 0, {2}, std::vector<std::uint8_t>(8), 36});
  EXPECT_NE(refusal(misaligned.build())
                .find("tensor 'b': offset 36 is not a multiple of the alignment 32"),
            std::string::npos)
      << refusal(misaligned.build());

  auto mismatch = GgufBuilder();
  mismatch.tensor(
      {"blk.0.ffn_up_exps.weight", 12, {100, 2}, std::vector<std::uint8_t>(288), std::nullopt});
  const auto why = refusal(mismatch.build());
  EXPECT_NE(why.find("tensor 'blk.0.ffn_up_exps.weight': shape (100, 2) does not fit type Q4_K"),
            std::string::npos)
      << why;

  auto unknown = GgufBuilder();
  unknown.tensor({"x", 4, {32}, std::vector<std::uint8_t>(18), std::nullopt});
  EXPECT_NE(refusal(unknown.build()).find("tensor 'x': unknown ggml type 4"), std::string::npos);

  auto dims = GgufBuilder();
  dims.tensor({"x", 0, {1, 1, 1, 1, 1}, std::vector<std::uint8_t>(4), std::nullopt});
  EXPECT_NE(refusal(dims.build()).find("tensor 'x': 5 dimensions, at most 4"), std::string::npos);

  auto overflow = GgufBuilder();
  overflow.tensor({"x", 0, {std::uint64_t{1} << 40, std::uint64_t{1} << 40}, {}, std::nullopt});
  EXPECT_NE(
      refusal(overflow.build()).find("tensor 'x': shape (1099511627776, 1099511627776) overflows"),
      std::string::npos)
      << refusal(overflow.build());

  auto overlap = GgufBuilder();
  overlap.tensor({"first", 0, {16}, std::vector<std::uint8_t>(64), 0})
      .tensor({"second", 0, {8}, std::vector<std::uint8_t>(32), 32});
  EXPECT_NE(
      refusal(overlap.build()).find("tensors 'first' and 'second' overlap: [0, 64) and [32, 64)"),
      std::string::npos)
      << refusal(overlap.build());

  // An empty tensor still points into the data section: a file cut inside the padding before it
  // (the infos complete) is refused rather than viewed past its end.
  auto empty_file = GgufBuilder().tensor({"e", 0, {0}, {}, std::nullopt}).build();
  ASSERT_TRUE(parse_gguf(empty_file).ok());
  EXPECT_EQ(empty_file.size(), 64u);  // 57 bytes of header and info, padded to 32
  empty_file.resize(60);
  EXPECT_NE(refusal(empty_file)
                .find("the data section would start at byte 64, past the end of the 60-byte file"),
            std::string::npos)
      << refusal(empty_file);

  auto twice = GgufBuilder();
  twice.f32_tensor("a", {2}).f32_tensor("a", {2});
  EXPECT_NE(refusal(twice.build()).find("tensor 'a' appears twice"), std::string::npos);
  auto key_twice = GgufBuilder();
  key_twice.kv_u32("k", 1).kv_u32("k", 2);
  EXPECT_NE(refusal(key_twice.build()).find("key 'k' appears twice"), std::string::npos);
  auto long_name = GgufBuilder();
  long_name.f32_tensor(std::string(64, 'n'), {1});
  EXPECT_NE(refusal(long_name.build()).find("name of 64 bytes exceeds the format's 63"),
            std::string::npos);
}

// Three parts of one model as gguf-split writes them.
void write_split(const test::ScratchDir& dir, int skip = 0, int bad_no = -1,
                 int total_tensors = 3) {
  for (int k = 1; k <= 3; ++k) {
    if (k == skip) continue;
    GgufBuilder b;
    b.kv_u16("split.no", static_cast<std::uint16_t>(k == bad_no ? 0 : k - 1))
        .kv_u16("split.count", 3)
        .kv_i32("split.tensors.count", total_tensors);
    if (k == 1) b.kv_string("general.architecture", "qwen4");
    b.f32_tensor("blk." + std::to_string(k) + ".attn_norm.weight",
                 {static_cast<std::uint64_t>(k) * 4});
    test::write_bytes(gguf_split_path(dir.file("model"), k, 3), b.build());
  }
}

TEST(Gguf, SplitSetOpensAsOneModel) {
  test::ScratchDir dir;
  write_split(dir);
  for (int k = 1; k <= 3; ++k) {
    auto m = GgufModel::open(gguf_split_path(dir.file("model"), k, 3));
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->split_count(), 3u);
    EXPECT_EQ(m->tensors().size(), 3u);
    ASSERT_NE(m->find("general.architecture"), nullptr);
    EXPECT_EQ(m->find("general.architecture")->as_string(), "qwen4");
    const auto v = m->view("blk.3.attn_norm.weight");
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(v->shape, (Shape{12}));
    EXPECT_EQ(m->tensors().at("blk.2.attn_norm.weight").split, 1u);
  }
  const auto name = parse_gguf_split_name("/a/b/DeepSeek-V4-Flash-IQ2XXS-00002-of-00005.gguf");
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->prefix, "/a/b/DeepSeek-V4-Flash-IQ2XXS");
  EXPECT_EQ(name->number, 2);
  EXPECT_EQ(name->count, 5);
  EXPECT_FALSE(parse_gguf_split_name("model.gguf").has_value());
  EXPECT_FALSE(parse_gguf_split_name("m-00006-of-00005.gguf").has_value());
}

TEST(Gguf, BrokenSplitSetsAreRefused) {
  {
    test::ScratchDir dir;
    write_split(dir, /*skip=*/2);
    auto m = GgufModel::open(gguf_split_path(dir.file("model"), 1, 3));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("missing split 2 of 3"), std::string::npos)
        << m.status().message();
  }
  {
    test::ScratchDir dir;
    write_split(dir, 0, /*bad_no=*/3);
    auto m = GgufModel::open(gguf_split_path(dir.file("model"), 1, 3));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("split.no is 0 but the name says part 3"),
              std::string::npos)
        << m.status().message();
  }
  {
    test::ScratchDir dir;
    write_split(dir, 0, -1, /*total_tensors=*/4);
    auto m = GgufModel::open(gguf_split_path(dir.file("model"), 1, 3));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("split.tensors.count is 4 but the 3 files hold 3"),
              std::string::npos)
        << m.status().message();
  }
  {
    // A renamed part: its metadata says split, its name does not.
    test::ScratchDir dir;
    write_split(dir);
    std::filesystem::rename(gguf_split_path(dir.file("model"), 1, 3), dir.file("renamed.gguf"));
    auto m = GgufModel::open(dir.file("renamed.gguf"));
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.status().message().find("split 3 ways"), std::string::npos) << m.status().message();
  }
}

}  // namespace
}  // namespace fs
