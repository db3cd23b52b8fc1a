// flashserve logits --model DIR --tokens 1,2,3 [--splits 37,1,3] [--backend cpu|cuda] --out F
// Writes float32 little-endian [n_tokens x vocab] logits (one row per position) and prints one
// JSON line {"n_tokens", "vocab", "backend", "ms"}.
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/backend_options.h"
#include "cli/commands.h"
#include "model/loader.h"

namespace fs::cli {
namespace {

int fail(const Status& s) {
  std::cerr << "flashserve logits: " << s.to_string() << "\n";
  return 1;
}

}  // namespace

void add_logits_command(CLI::App& app, Action& action) {
  struct Options {
    std::string model, tokens, splits, out;
    LoadOptions load;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("logits", "Write the logits of a token sequence (float32 [n x vocab])");
  cmd->add_option("--model", opt->model, "Model folder, or a GGUF file (ds4's DeepSeek V4)")
      ->required();
  cmd->add_option("--tokens", opt->tokens, "Comma-separated token ids")->required();
  cmd->add_option("--splits", opt->splits, "Sizes of consecutive calls through the cache");
  add_backend_options(cmd, opt->load);
  cmd->add_option("--out", opt->out, "Output file")->required();
  cmd->callback([opt, &action] {
    action = [opt]() -> int {
      auto ids = parse_list(opt->tokens, "--tokens");
      if (!ids.ok()) return fail(ids.status());
      std::vector<std::int64_t> splits{static_cast<std::int64_t>(ids->size())};
      if (!opt->splits.empty()) {
        auto s = parse_list(opt->splits, "--splits");
        if (!s.ok()) return fail(s.status());
        splits = *s;
        std::int64_t sum = 0;
        for (const auto v : splits) sum += v;
        if (sum != static_cast<std::int64_t>(ids->size()))
          return fail(invalid_argument("--splits sum to " + std::to_string(sum) +
                                       ", but there are " + std::to_string(ids->size()) +
                                       " tokens"));
      }
      auto model = load_model(opt->model, opt->load);
      if (!model.ok()) return fail(model.status());
      const auto vocab = (*model)->info().vocab_size;
      std::vector<TokenId> tokens;
      for (const auto v : *ids) {
        if (v >= vocab)
          return fail(invalid_argument("token id " + std::to_string(v) + " >= vocab size " +
                                       std::to_string(vocab)));
        tokens.push_back(static_cast<TokenId>(v));
      }
      auto state = (*model)->new_state();
      std::vector<float> logits;
      const auto t0 = std::chrono::steady_clock::now();
      std::size_t at = 0;
      for (const auto n : splits) {
        ForwardOutput out;
        const std::span<const TokenId> part(tokens.data() + at, static_cast<std::size_t>(n));
        if (auto s = (*model)->forward(*state, part, LogitsRows::kAll, out); !s.ok())
          return fail(s);
        logits.insert(logits.end(), out.logits.begin(), out.logits.end());
        at += static_cast<std::size_t>(n);
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::ofstream f(opt->out, std::ios::binary);
      f.write(reinterpret_cast<const char*>(logits.data()),
              static_cast<std::streamsize>(logits.size() * sizeof(float)));
      if (!f) return fail(io_error("cannot write " + opt->out));
      std::cout << nlohmann::json{{"n_tokens", tokens.size()},
                                  {"vocab", vocab},
                                  {"backend", (*model)->info().backend},
                                  {"ms", ms}}
                       .dump()
                << std::endl;
      return 0;
    };
  });
}

}  // namespace fs::cli
