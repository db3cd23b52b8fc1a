// Tokenizer units on a small synthetic byte-level BPE (the real vocabularies are checked against
// the reference in test_tokenizer_reference.cpp): merges by rank, added tokens and their flags,
// NFC, decoding, the streaming decoder, metadata, and clear errors for bad files.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/metadata.h"
#include "tokenizer/regex.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace fs {
namespace {

using ojson = nlohmann::ordered_json;

// 256 byte tokens (ids 0..255), then merged tokens in merge order, then added tokens at 1000+.
ojson tiny_tokenizer() {
  ojson vocab = ojson::object();
  for (int b = 0; b < 256; ++b)
    vocab[byte_level::bytes_to_token(std::string(1, static_cast<char>(b)))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"l", "l"},  {"h", "e"}, {"he", "ll"},  {"hell", "o"},  {"Ġ", "w"},
      {"Ġw", "o"}, {"r", "l"}, {"Ġwo", "rl"}, {"Ġworl", "d"}, {"a", "a"}};
  ojson merge_list = ojson::array();
  int id = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = id++;
    merge_list.push_back({a, b});
  }
  ojson added = ojson::array();
  added.push_back({{"id", 1000},
                   {"content", "<|end|>"},
                   {"special", true},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"single_word", false}});
  added.push_back({{"id", 1001},
                   {"content", "<mask>"},
                   {"special", false},
                   {"lstrip", true},
                   {"rstrip", true},
                   {"normalized", false},
                   {"single_word", false}});
  added.push_back({{"id", 1002}, {"content", "<|end|>x"}, {"special", false}});
  added.push_back({{"id", 1003}, {"content", "cat"}, {"special", false}, {"single_word", true}});
  ojson j;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", R"( ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}};
  j["added_tokens"] = added;
  return j;
}

Tokenizer load(const ojson& j) {
  auto t = Tokenizer::from_json(j.dump(), "tiny");
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return std::move(t).value();
}

std::vector<TokenId> ids_of(const Tokenizer& t, std::string_view text) {
  auto ids = t.encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<TokenId>{};
}

TokenId id(const Tokenizer& t, const std::string& token) {
  return t.token_to_id(token).value_or(-1);
}

TEST(ByteLevel, MapsEveryByteToOnePrintableCodePointAndBack) {
  EXPECT_EQ(byte_level::char_of_byte(' '), U'\u0120');   // "Ġ"
  EXPECT_EQ(byte_level::char_of_byte('\n'), U'\u010A');  // "Ċ"
  EXPECT_EQ(byte_level::char_of_byte('a'), U'a');
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level::token_to_bytes(byte_level::bytes_to_token(all)), all);
}

TEST(Utf8, RepairReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(utf8::repair("ok"), "ok");
  EXPECT_EQ(utf8::repair("a\xE2\x82"), "a\xEF\xBF\xBD");  // truncated 3-byte sequence: one U+FFFD
  EXPECT_EQ(utf8::repair("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two
  EXPECT_EQ(utf8::repair("\xED\xA0\x80"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: three
  EXPECT_EQ(utf8::incomplete_suffix("a\xF0\x9F\x98"), 3u);
  EXPECT_EQ(utf8::incomplete_suffix("a\xF0\x9F\x98\x80"), 0u);
  EXPECT_EQ(utf8::incomplete_suffix("a\xF0\x28"), 0u);  // already invalid: nothing to wait for
}

TEST(Utf8, TrimUsesJavaScriptWhitespace) {
  EXPECT_EQ(utf8::trim("\n\t x \xE3\x80\x80"), "x");  // U+3000 is whitespace
  EXPECT_EQ(utf8::trim("\xEF\xBB\xBFx"), "x");        // so is U+FEFF
  EXPECT_EQ(utf8::trim("\xC2\x85x"), "\xC2\x85x");    // U+0085 is not
  EXPECT_EQ(utf8::trim_start("  a "), "a ");
  EXPECT_EQ(utf8::trim_end("  a "), "  a");
}

TEST(Regex, RewritesWhitespaceAndCaselessContractionsForJavaScriptMeaning) {
  auto p = translate_js_regex(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\s\p{L}]|\s+(?!\S))");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->find("(?i:"), std::string::npos);
  EXPECT_EQ(p->find("\\s"), std::string::npos);
  auto re = Regex::compile(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|\s+)", "test");
  ASSERT_TRUE(re.ok()) << re.status().to_string();
  std::vector<std::string_view> pieces;
  ASSERT_TRUE(re->split_isolated("it'S a\xEF\xBB\xBF"
                                 "b'\xC5\xBF",
                                 pieces)
                  .ok());
  // 'S matches, U+FEFF is whitespace, and 'ſ (long s) does not match 's.
  EXPECT_EQ(pieces,
            (std::vector<std::string_view>{"it", "'S", " ", "a", "\xEF\xBB\xBF", "b'\xC5\xBF"}));
  EXPECT_FALSE(Regex::compile("(unclosed", "test").ok());
}

TEST(Tokenizer, MergesByRankAndCachesPieces) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_EQ(ids_of(t, "hello world"), (std::vector<TokenId>{id(t, "hello"), id(t, "Ġworld")}));
  // "aaa": the leftmost of equal-rank pairs merges first.
  EXPECT_EQ(ids_of(t, "aaa"), (std::vector<TokenId>{id(t, "aa"), 'a'}));
  // " hello" has no merge with the space, so it is "Ġ" + "hello".
  EXPECT_EQ(ids_of(t, "hello hello"),
            (std::vector<TokenId>{id(t, "hello"), id(t, "Ġ"), id(t, "hello")}));
  const auto before = t.cache_stats();
  EXPECT_EQ(ids_of(t, "hello world"), (std::vector<TokenId>{id(t, "hello"), id(t, "Ġworld")}));
  EXPECT_GT(t.cache_stats().hits, before.hits);
  EXPECT_TRUE(ids_of(t, "").empty());
}

TEST(Tokenizer, AddedTokensMatchLongestFirstBeforeNormalizationAndSplitting) {
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_EQ(ids_of(t, "he<|end|>"), (std::vector<TokenId>{id(t, "he"), 1000}));
  EXPECT_EQ(ids_of(t, "<|end|>x"), (std::vector<TokenId>{1002}));  // the longer token wins
  EXPECT_EQ(ids_of(t, "<|end|><|end|>"), (std::vector<TokenId>{1000, 1000}));
  // lstrip/rstrip swallow the whitespace around <mask>.
  EXPECT_EQ(ids_of(t, "he  <mask>  he"), (std::vector<TokenId>{id(t, "he"), 1001, id(t, "he")}));
  // single_word: "cat" only as a whole word.
  EXPECT_EQ(ids_of(t, "a cat b"), (std::vector<TokenId>{'a', id(t, "Ġ"), 1003, id(t, "Ġ"), 'b'}));
  EXPECT_EQ(ids_of(t, "cats"), (std::vector<TokenId>{'c', 'a', 't', 's'}));
  EXPECT_TRUE(t.is_special(1000));
  EXPECT_FALSE(t.is_special(1001));
}

TEST(Tokenizer, NormalizesToNfcAndRoundTrips) {
  const Tokenizer t = load(tiny_tokenizer());
  // e + COMBINING ACUTE becomes U+00E9 (bytes C3 A9) before BPE.
  EXPECT_EQ(ids_of(t, "e\xCC\x81"), ids_of(t, "\xC3\xA9"));
  for (const std::string s :
       {"hello world", "  tabs\tand\nnewlines\r\n", "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x92\xBB",
        "<mask>x<|end|>", "\xE4\xB8\xAD\xE6\x96\x87 123"}) {
    auto ids = t.encode(s);
    ASSERT_TRUE(ids.ok());
    auto text = t.decode(*ids);
    ASSERT_TRUE(text.ok());
    if (s.find("<mask>") == std::string::npos) {
      EXPECT_EQ(*text, s);
    }
  }
  auto skipped =
      t.decode(std::vector<TokenId>{id(t, "he"), 1000, id(t, "he")}, /*skip_special=*/true);
  ASSERT_TRUE(skipped.ok());
  EXPECT_EQ(*skipped, "hehe");
}

TEST(Tokenizer, DecodeRepairsPartialCharactersAndRejectsUnknownIds) {
  const Tokenizer t = load(tiny_tokenizer());
  auto half = t.decode(std::vector<TokenId>{0xF0, 0x9F});  // the first two bytes of an emoji
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(*half, "\xEF\xBF\xBD");
  EXPECT_FALSE(t.decode(std::vector<TokenId>{5000}).ok());
  EXPECT_FALSE(t.decode(std::vector<TokenId>{-1}).ok());
  EXPECT_FALSE(t.encode("bad \xFF utf8").ok());
}

TEST(StreamDecoder, NeverEmitsHalfACharacter) {
  const Tokenizer t = load(tiny_tokenizer());
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80 \xE4\xB8\xAD!";
  // Byte tokens one at a time: the worst case for a streaming decoder.
  std::vector<TokenId> ids;
  for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
  StreamDecoder stream(t);
  std::string all;
  for (const TokenId i : ids) {
    auto piece = stream.push(i);
    ASSERT_TRUE(piece.ok());
    EXPECT_TRUE(utf8::is_valid(*piece));
    all += *piece;
    EXPECT_EQ(text.compare(0, all.size(), all), 0);
  }
  all += stream.finish();
  EXPECT_EQ(all, text);
  // A character cut short at the end of the stream becomes U+FFFD, like decode().
  StreamDecoder cut(t);
  EXPECT_EQ(*cut.push(0xE4), "");
  EXPECT_EQ(*cut.push(0xB8), "");
  EXPECT_EQ(*cut.push('a'),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_FALSE(cut.push(99999).ok());
}

struct BadCase {
  const char* name;
  std::function<void(ojson&)> edit;
  ErrorCode code;
  const char* message_part;
};

TEST(Tokenizer, MalformedFilesGiveClearErrors) {
  EXPECT_EQ(Tokenizer::from_json("{not json", "t.json").status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(Tokenizer::from_json("{not json", "t.json").status().message().find("t.json"),
            std::string::npos);
  EXPECT_EQ(Tokenizer::from_json("[]", "t.json").status().code(), ErrorCode::kCorrupt);
  auto missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  const std::vector<BadCase> cases = {
      {"no model", [](ojson& j) { j.erase("model"); }, ErrorCode::kCorrupt, "model"},
      {"unigram", [](ojson& j) { j["model"]["type"] = "Unigram"; }, ErrorCode::kUnsupported,
       "Unigram"},
      {"vocab list", [](ojson& j) { j["model"]["vocab"] = ojson::array(); }, ErrorCode::kCorrupt,
       "vocab"},
      {"vocab id", [](ojson& j) { j["model"]["vocab"]["he"] = "x"; }, ErrorCode::kCorrupt, "he"},
      {"no byte token", [](ojson& j) { j["model"]["vocab"].erase("a"); }, ErrorCode::kCorrupt,
       "byte"},
      {"bad merge", [](ojson& j) { j["model"]["merges"].push_back(42); }, ErrorCode::kCorrupt,
       "merge"},
      {"merge oov",
       [](ojson& j) {
         j["model"]["merges"].push_back({"zz", "q"});
       },
       ErrorCode::kCorrupt, "vocabulary"},
      {"bad regex",
       [](ojson& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(["; },
       ErrorCode::kInvalidArgument, "regex"},
      {"normalizer",
       [](ojson& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       ErrorCode::kUnsupported, "Lowercase"},
      {"decoder",
       [](ojson& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       ErrorCode::kUnsupported, "WordPiece"},
      {"added",
       [](ojson& j) {
         j["added_tokens"].push_back({{"content", "x"}});
       },
       ErrorCode::kCorrupt, "added"},
      {"added type", [](ojson& j) { j["added_tokens"][0]["special"] = "yes"; }, ErrorCode::kCorrupt,
       "special"},
  };
  for (const auto& c : cases) {
    ojson j = tiny_tokenizer();
    c.edit(j);
    auto t = Tokenizer::from_json(j.dump(), "tok.json");
    ASSERT_FALSE(t.ok()) << c.name;
    EXPECT_EQ(t.status().code(), c.code) << c.name << ": " << t.status().to_string();
    EXPECT_NE(t.status().message().find(c.message_part), std::string::npos)
        << c.name << ": " << t.status().to_string();
    EXPECT_NE(t.status().message().find("tok.json"), std::string::npos) << c.name;
  }
}

TEST(Tokenizer, TruncatedOrMutatedFilesNeverCrash) {
  const std::string good = tiny_tokenizer().dump();
  std::size_t rejected = 0;
  for (std::size_t cut = 0; cut < good.size(); cut += 97) {
    rejected += !Tokenizer::from_json(good.substr(0, cut), "t.json").ok();
  }
  EXPECT_GT(rejected, 0u);
  // Flip bytes at fixed positions: whatever loads must still encode and decode safely.
  std::uint32_t state = 12345;
  for (int round = 0; round < 200; ++round) {
    std::string bad = good;
    for (int k = 0; k < 3; ++k) {
      state = state * 1664525u + 1013904223u;
      bad[state % bad.size()] = static_cast<char>(state >> 24);
    }
    auto t = Tokenizer::from_json(bad, "t.json");
    if (!t.ok()) {
      EXPECT_FALSE(t.status().message().empty());
      continue;
    }
    auto ids = t->encode("hello world <|end|> \xE4\xB8\xAD");
    if (ids.ok()) {
      EXPECT_TRUE(t->decode(*ids).ok());
    }
  }
}

TEST(TokenizerMetadata, ReadsConfigAndGenerationConfig) {
  test::ScratchDir dir;
  test::write_text(dir.file("tokenizer.json"), tiny_tokenizer().dump());
  test::write_text(
      dir.file("tokenizer_config.json"),
      R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "<|end|>", "add_bos_token": true,
                       "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
                       "added_tokens_decoder": {"1000": {"content": "<|end|>", "special": true},
                                                "1010": {"content": "<extra>", "special": false}}})");
  test::write_text(dir.file("generation_config.json"),
                   R"({"eos_token_id": [7, 1000], "bos_token_id": 3})");
  auto b = load_tokenizer_dir(dir.path().string());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->metadata.bos_token.value_or(""), "<s>");
  EXPECT_EQ(b->metadata.eos_token.value_or(""), "<|end|>");
  EXPECT_TRUE(b->metadata.add_bos_token);
  EXPECT_EQ(b->metadata.chat_template, "D");
  EXPECT_EQ(b->metadata.generation_eos_ids, (std::vector<TokenId>{7, 1000}));
  EXPECT_EQ(b->metadata.generation_bos_id.value_or(-1), 3);
  EXPECT_EQ(stop_token_ids(b->metadata, b->tokenizer), (std::vector<TokenId>{7, 1000}));
  // An added token declared only in tokenizer_config.json is matched too.
  EXPECT_EQ(ids_of(b->tokenizer, "he<extra>"),
            (std::vector<TokenId>{id(b->tokenizer, "he"), 1010}));
  EXPECT_EQ(b->tokenizer.added_tokens().size(), 5u);

  // eos_token_id as a single int; the tokenizer's eos is added to the stop ids.
  test::write_text(dir.file("generation_config.json"), R"({"eos_token_id": 7})");
  auto single = load_tokenizer_dir(dir.path().string());
  ASSERT_TRUE(single.ok());
  EXPECT_EQ(stop_token_ids(single->metadata, single->tokenizer), (std::vector<TokenId>{7, 1000}));

  test::write_text(dir.file("generation_config.json"), R"({"eos_token_id": "x"})");
  auto bad = load_tokenizer_dir(dir.path().string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("eos_token_id"), std::string::npos);
  test::write_text(dir.file("generation_config.json"), "{}");
  test::write_text(dir.file("tokenizer_config.json"),
                   R"({"added_tokens_decoder": {"x": {"content": "a"}}})");
  EXPECT_FALSE(load_tokenizer_dir(dir.path().string()).ok());
  test::write_text(dir.file("tokenizer_config.json"), "{oops");
  auto bad_config = load_tokenizer_dir(dir.path().string());
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(bad_config.status().message().find("tokenizer_config.json"), std::string::npos);
  EXPECT_EQ(load_tokenizer_dir(dir.file("missing")).status().code(), ErrorCode::kNotFound);
}

TEST(TokenizerCli, TokenizeDetokenizeAndErrors) {
  test::ScratchDir dir;
  test::write_text(dir.file("tokenizer.json"), tiny_tokenizer().dump());
  test::write_text(dir.file("list.json"), R"(["hello world", "", "<|end|>"])");
  const std::string bin = test::flashserve_binary();
  std::string out;
  ASSERT_EQ(test::run_command(
                bin + " tokenize --tokenizer " + dir.path().string() + " --text 'hello world' 2>&1",
                &out),
            0);
  const Tokenizer t = load(tiny_tokenizer());
  EXPECT_EQ(out,
            nlohmann::json(std::vector<TokenId>{id(t, "hello"), id(t, "Ġworld")}).dump() + "\n");
  ASSERT_EQ(test::run_command(bin + " tokenize --tokenizer " + dir.path().string() + " --file " +
                                  dir.file("list.json"),
                              &out),
            0);
  auto parsed = nlohmann::json::parse(out);
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[2], nlohmann::json::array({1000}));
  ASSERT_EQ(
      test::run_command(
          bin + " detokenize --tokenizer " + dir.path().string() + " --ids 104,101,1000", &out),
      0);
  EXPECT_EQ(out, "he<|end|>");
  EXPECT_EQ(test::run_command(
                bin + " detokenize --tokenizer " + dir.path().string() + " --ids 1,x 2>&1", &out),
            1);
  EXPECT_NE(out.find("not a token id"), std::string::npos);
  EXPECT_EQ(
      test::run_command(bin + " tokenize --tokenizer " + dir.file("nope") + " --text a 2>&1", &out),
      1);
  EXPECT_NE(out.find("does not exist"), std::string::npos);
  test::write_text(dir.file("tokenizer.json"), "{\"model\": 1}");
  EXPECT_EQ(test::run_command(
                bin + " tokenize --tokenizer " + dir.path().string() + " --text a 2>&1", &out),
            1);
  EXPECT_NE(out.find("tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace fs
