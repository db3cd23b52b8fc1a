// The tokenizer a GGUF file carries (tokenizer/gguf_tokenizer.h): a tokenizer.json written into
// tokenizer.ggml.* arrays as convert_hf_to_gguf lays them out (tokens by id, padding ids unused,
// added tokens control or user-defined, merges "left right") must tokenize exactly as the
// tokenizer.json does, for every embedded model; the pre-tokenizer names must select their
// families' splits; and every inconsistency is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "gguf_test_writer.h"
#include "gguf_tokenizer_writer.h"
#include "model/gguf_inspect.h"
#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/metadata.h"
#include "util/mapped_file.h"

namespace fs {
namespace {

using json = nlohmann::json;
using test::GgufBuilder;
using test::GgufVocab;
using test::put_vocab;
using test::vocab_of;

std::string model_dir(const std::string& name) {
  return std::string(FLASHSERVE_SOURCE_DIR) + "/models/" + name;
}

std::map<std::string, GgufValue> metadata_of(const GgufBuilder& g) {
  const auto bytes = g.build();
  auto header = parse_gguf(bytes);
  EXPECT_TRUE(header.ok()) << header.status().message();
  return header.ok() ? header->metadata : std::map<std::string, GgufValue>{};
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> texts = {
      "Hello, world! I'm sure they'll say we've done it.",
      "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\n",
      "The year 2026 had 12345678 tokens; 3.14159 and -42.",
      "你好，世界！日本語のテキストとカタカナ。한국어",
      "emoji 😀👍🏽 and tabs\t\tand  double  spaces   end   ",
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
      "Ünïcödé: e\xcc\x81 (e + combining acute) vs \xc3\xa9",
      "   leading spaces and trailing newline\n",
      "",
  };
  return texts;
}

class GgufTokenizerModels : public ::testing::TestWithParam<const char*> {};

// The three embedded models' tokenizers (all Qwen2's split and NFC, as their tokenizer.json
// say): the GGUF form encodes and decodes the corpus exactly as the tokenizer.json does.
TEST_P(GgufTokenizerModels, EncodesAsTheTokenizerJson) {
  const std::string dir = model_dir(GetParam());
  auto reference = load_tokenizer_dir(dir);
  ASSERT_TRUE(reference.ok()) << reference.status().message();
  GgufBuilder g;
  put_vocab(g, vocab_of(dir + "/tokenizer.json"), "qwen2");
  auto from_gguf = tokenizer_from_gguf(metadata_of(g), "test.gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  const Tokenizer& a = reference->tokenizer;
  const Tokenizer& b = from_gguf->tokenizer;
  EXPECT_EQ(a.id_space(), b.id_space());
  std::size_t tokens = 0;
  for (const auto& text : corpus()) {
    auto ea = a.encode(text), eb = b.encode(text);
    ASSERT_TRUE(ea.ok() && eb.ok()) << text;
    EXPECT_EQ(*ea, *eb) << text;
    tokens += ea->size();
    auto da = a.decode(*ea), db = b.decode(*eb);
    ASSERT_TRUE(da.ok() && db.ok());
    EXPECT_EQ(*da, *db);
  }
  EXPECT_GT(tokens, 100u);
  for (const auto& t : a.added_tokens()) {
    EXPECT_EQ(b.token_to_id(t.content), t.id) << t.content;
    EXPECT_EQ(b.is_special(t.id), t.special) << t.content;
  }
}

INSTANTIATE_TEST_SUITE_P(Embedded, GgufTokenizerModels,
                         ::testing::Values("qwen4-tiny-code", "deepseek-v4-tiny", "glm5-tiny"));

// A GGUF file with no tokenizer.json beside it tokenizes with its own arrays; the ids, the chat
// template and the stop tokens come from its keys.
TEST(GgufTokenizer, ModelFileWithoutTokenizerJsonUsesItsOwn) {
  const std::string dir = model_dir("qwen4-tiny-code");
  auto reference = load_tokenizer_dir(dir);
  ASSERT_TRUE(reference.ok());
  const auto eos = reference->tokenizer.token_to_id("<|im_end|>");
  const auto bos = reference->tokenizer.token_to_id("<|endoftext|>");
  ASSERT_TRUE(eos && bos);
  GgufBuilder g;
  put_vocab(g, vocab_of(dir + "/tokenizer.json"), "qwen2");
  g.kv_u32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(*eos));
  g.kv_u32("tokenizer.ggml.bos_token_id", static_cast<std::uint32_t>(*bos));
  g.kv_u32("tokenizer.ggml.eot_token_id", static_cast<std::uint32_t>(*bos));
  g.kv_bool("tokenizer.ggml.add_bos_token", false);
  g.kv_string("tokenizer.chat_template", reference->metadata.chat_template);
  test::ScratchDir scratch;
  const auto path = scratch.file("model.gguf");
  test::write_bytes(path, g.build());
  auto bundle = load_tokenizer_dir(path);
  ASSERT_TRUE(bundle.ok()) << bundle.status().message();
  EXPECT_EQ(*bundle->tokenizer.encode(corpus()[1]), *reference->tokenizer.encode(corpus()[1]));
  EXPECT_EQ(bundle->metadata.eos_token, std::optional<std::string>("<|im_end|>"));
  EXPECT_EQ(bundle->metadata.generation_eos_ids, (std::vector<TokenId>{*eos, *bos}));
  EXPECT_EQ(bundle->metadata.chat_template, reference->metadata.chat_template);
  EXPECT_FALSE(bundle->metadata.chat_template.empty());
  // A tokenizer.json beside the file wins over the file's own arrays.
  std::filesystem::copy_file(dir + "/tokenizer.json", scratch.file("tokenizer.json"));
  auto beside = load_tokenizer_dir(path);
  ASSERT_TRUE(beside.ok()) << beside.status().message();
  EXPECT_TRUE(beside->metadata.generation_eos_ids.empty());  // no generation_config.json there
}

// tokenizer.huggingface.json (the whole tokenizer.json as one string) is used as is.
TEST(GgufTokenizer, EmbeddedHuggingfaceJson) {
  const std::string dir = model_dir("glm5-tiny");
  auto reference = load_tokenizer_dir(dir);
  ASSERT_TRUE(reference.ok());
  GgufBuilder g;
  g.kv_string("general.architecture", "glm5");
  g.kv_string("tokenizer.huggingface.json", *read_text_file(dir + "/tokenizer.json"));
  auto b = tokenizer_from_gguf(metadata_of(g), "hf.gguf");
  ASSERT_TRUE(b.ok()) << b.status().message();
  for (const auto& text : corpus())
    EXPECT_EQ(*b->tokenizer.encode(text), *reference->tokenizer.encode(text)) << text;
}

// A byte-level vocabulary with merges that join digits and CJK characters, so each
// pre-tokenizer's split shows in the ids: Qwen2 splits digits one by one, GLM-4 and DeepSeek V3
// in runs of up to three; DeepSeek V3 also isolates CJK runs from the letters before them.
GgufVocab split_probe_vocab() {
  GgufVocab v;
  for (const auto& s : byte_level::byte_strings()) {
    v.tokens.push_back(s);
    v.types.push_back(1);
  }
  auto merge = [&](const std::string& a, const std::string& b) {
    v.merges.push_back(a + " " + b);
    v.tokens.push_back(a + b);
    v.types.push_back(1);
  };
  merge("1", "2");
  merge("12", "3");
  merge("4", "5");
  merge("a", byte_level::bytes_to_token("\xe4"));  // "a" + the first byte of 你
  return v;
}

TEST(GgufTokenizer, PreTokenizerNamesSelectTheirSplits) {
  const GgufVocab v = split_probe_vocab();
  const auto id = [&](const std::string& s) {
    return static_cast<TokenId>(std::find(v.tokens.begin(), v.tokens.end(), s) - v.tokens.begin());
  };
  auto encode = [&](const std::string& pre, const std::string& text) {
    GgufBuilder g;
    put_vocab(g, v, pre);
    auto t = tokenizer_from_gguf(metadata_of(g), pre + ".gguf");
    EXPECT_TRUE(t.ok()) << t.status().message();
    return t.ok() ? *t->tokenizer.encode(text) : std::vector<TokenId>{};
  };
  // "12345": Qwen2 never joins digits; the others split "123" + "45" and merge both.
  EXPECT_EQ(encode("qwen2", "12345"),
            (std::vector<TokenId>{id("1"), id("2"), id("3"), id("4"), id("5")}));
  for (const char* pre : {"glm4", "chatglm-bpe", "deepseek-v3"})
    EXPECT_EQ(encode(pre, "12345"), (std::vector<TokenId>{id("123"), id("45")})) << pre;
  // "a你": Qwen2 and GLM-4 keep letters together (one piece: "a" + the first byte merge),
  // DeepSeek V3 puts the CJK run in a piece of its own.
  const std::string first_byte = byte_level::bytes_to_token("\xe4");
  const auto joined = encode("qwen2", "a\xe4\xbd\xa0");
  ASSERT_FALSE(joined.empty());
  EXPECT_EQ(joined.front(), id("a" + first_byte));
  EXPECT_EQ(encode("glm4", "a\xe4\xbd\xa0"), joined);
  const auto apart = encode("deepseek-v3", "a\xe4\xbd\xa0");
  ASSERT_FALSE(apart.empty());
  EXPECT_EQ(apart.front(), id("a"));
  EXPECT_EQ(apart.size(), 4u);  // a, then the three bytes of 你
}

// `flashserve inspect` says whether the file's tokenizer can be used, and why not.
TEST(GgufTokenizer, InspectReportsTheTokenizer) {
  const GgufVocab v = vocab_of(model_dir("qwen4-tiny-code") + "/tokenizer.json");
  test::ScratchDir scratch;
  auto inspect = [&](GgufBuilder g, const std::string& name) {
    g.kv_string("general.architecture", "qwen4");
    test::write_bytes(scratch.file(name), g.build());
    auto r = inspect_gguf_path(scratch.file(name));
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? r->tokenizer : GgufInspectReport::Tokenizer{};
  };
  GgufBuilder good;
  put_vocab(good, v, "qwen2");
  const auto t = inspect(good, "good.gguf");
  EXPECT_TRUE(t.usable) << t.problem;
  EXPECT_EQ(t.source, "tokenizer.ggml.* (gpt2, pre qwen2)");
  EXPECT_EQ(t.tokens, v.tokens.size());
  GgufBuilder unknown;
  put_vocab(unknown, v, "qwen35");
  const auto u = inspect(unknown, "unknown.gguf");
  EXPECT_FALSE(u.usable);
  EXPECT_NE(u.problem.find("'qwen35' has no split known here"), std::string::npos) << u.problem;
  const auto none = inspect(GgufBuilder{}, "none.gguf");
  EXPECT_FALSE(none.usable);
  EXPECT_EQ(none.source, "none");
}

TEST(GgufTokenizer, InconsistentArraysAreRefusedByName) {
  const GgufVocab good = vocab_of(model_dir("qwen4-tiny-code") + "/tokenizer.json");
  auto refused = [&](GgufBuilder g) {
    auto t = tokenizer_from_gguf(metadata_of(g), "bad.gguf");
    EXPECT_FALSE(t.ok());
    return t.ok() ? std::string() : t.status().message();
  };
  auto contains = [](const std::string& s, const std::string& what) {
    return s.find(what) != std::string::npos;
  };
  {  // no tokenizer at all: not_found, which load_tokenizer_dir turns into "put one beside it"
    GgufBuilder g;
    g.kv_string("general.architecture", "qwen4");
    auto t = tokenizer_from_gguf(metadata_of(g), "none.gguf");
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), ErrorCode::kNotFound);
  }
  {
    GgufBuilder g;
    g.kv_string("tokenizer.ggml.model", "llama");  // SentencePiece
    EXPECT_TRUE(contains(refused(g), "'llama' is not supported")) << refused(g);
  }
  {
    GgufBuilder g;
    put_vocab(g, good, "some-new-model");
    const auto m = refused(g);
    EXPECT_TRUE(contains(m, "'some-new-model' has no split known here")) << m;
    EXPECT_TRUE(contains(m, "deepseek-v3")) << m;
  }
  {
    GgufBuilder g;
    put_vocab(g, good, "");
    EXPECT_TRUE(contains(refused(g), "no tokenizer.ggml.pre")) << refused(g);
  }
  {
    GgufVocab v = good;
    v.types.pop_back();
    GgufBuilder g;
    put_vocab(g, v, "qwen2");
    EXPECT_TRUE(contains(refused(g), "one type per token")) << refused(g);
  }
  {
    GgufVocab v = good;
    v.types[7] = 9;
    GgufBuilder g;
    put_vocab(g, v, "qwen2");
    EXPECT_TRUE(contains(refused(g), "token 7 has type 9")) << refused(g);
  }
  {
    GgufVocab v = good;
    v.tokens[9] = v.tokens[8];
    GgufBuilder g;
    put_vocab(g, v, "qwen2");
    EXPECT_TRUE(contains(refused(g), "is both id 8 and id 9")) << refused(g);
  }
  {
    GgufVocab v = good;
    v.merges[3] = "nospace";
    GgufBuilder g;
    put_vocab(g, v, "qwen2");
    EXPECT_TRUE(contains(refused(g), "merge 3 'nospace' is not two tokens")) << refused(g);
  }
  {
    GgufBuilder g;
    put_vocab(g, good, "qwen2")
        .kv_u32("tokenizer.ggml.eos_token_id", static_cast<std::uint32_t>(good.tokens.size()));
    EXPECT_TRUE(contains(refused(g), "tokenizer.ggml.eos_token_id")) << refused(g);
  }
}

}  // namespace
}  // namespace fs
