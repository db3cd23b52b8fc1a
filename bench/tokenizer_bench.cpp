// Encode throughput of the tokenizer on one core: tokenizer_bench TOKENIZER_DIR [FILE] [REPEATS]
// FILE is a text file, or a JSON list of strings (joined by newlines, repeated to 100 KB).
// Without FILE (or with FILE ""), encodes a built-in ~100 KB mix of prose, code and CJK. Prints
// cold (empty piece cache) and warm figures; bench/NOTES.md records them with the command.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer/metadata.h"
#include "util/mapped_file.h"

namespace {

std::string default_text() {
  const std::string block =
      "The quick brown fox jumps over the lazy dog. It's 2026 and tokenizers still matter; "
      "they've got to be fast.\n\n"
      "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in "
      "text.split()]\n\t// 42 + 3.14159\n"
      "机器学习是人工智能的一个分支。日本語のテキストも少し。Привет, мир! مرحبا بالعالم. नमस्ते "
      "दुनिया। สวัสดีครับ 👩‍💻🚀\n";
  std::string text;
  while (text.size() < 100 * 1024) text += block + std::to_string(text.size()) + "\n";
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tokenizer_bench TOKENIZER_DIR [FILE] [REPEATS]\n");
    return 2;
  }
  const auto t_load = std::chrono::steady_clock::now();
  auto bundle = fs::load_tokenizer_dir(argv[1]);
  if (!bundle.ok()) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", bundle.status().to_string().c_str());
    return 1;
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_load).count();
  std::string text = default_text();
  if (argc >= 3 && argv[2][0] != '\0') {
    auto content = fs::read_text_file(argv[2]);
    if (!content.ok()) {
      std::fprintf(stderr, "tokenizer_bench: %s\n", content.status().to_string().c_str());
      return 1;
    }
    text = std::move(*content);
    // A JSON list of strings (the parity corpus) is joined by newlines and repeated to 100 KB.
    if (!text.empty() && text[0] == '[') {
      const auto list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (!list.is_array() || list.empty()) {
        std::fprintf(stderr, "tokenizer_bench: %s is not a JSON list of strings\n", argv[2]);
        return 1;
      }
      text.clear();
      for (std::size_t i = 0; text.size() < 100 * 1024; ++i) {
        text += list[i % list.size()].get<std::string>() + "\n";
      }
    }
  }
  const int repeats = argc >= 4 ? std::stoi(argv[3]) : 20;
  const fs::Tokenizer& tok = bundle->tokenizer;
  auto time_once = [&](std::size_t& n_tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    auto ids = tok.encode(text);
    const auto t1 = std::chrono::steady_clock::now();
    n_tokens = ids.ok() ? ids->size() : 0;
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  };
  std::size_t n_tokens = 0;
  tok.clear_cache();
  const double cold_ms = time_once(n_tokens);
  double best = 1e30, total = 0;
  for (int r = 0; r < repeats; ++r) {
    const double ms = time_once(n_tokens);
    best = std::min(best, ms);
    total += ms;
  }
  const auto stats = tok.cache_stats();
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf(
      "{\"bytes\": %zu, \"tokens\": %zu, \"load_ms\": %.1f, \"cold_ms\": %.3f, \"warm_best_ms\": "
      "%.3f, "
      "\"warm_mean_ms\": %.3f, \"warm_MB_per_s\": %.1f, \"warm_tokens_per_s\": %.0f, "
      "\"cache_entries\": %zu}\n",
      text.size(), n_tokens, load_ms, cold_ms, best, total / repeats, mb / (best / 1e3),
      n_tokens / (best / 1e3), stats.entries);
  return 0;
}
