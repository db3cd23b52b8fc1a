// flashserve generate | prefill: one turn of decoding (autoregressive or MTP) from token ids, and
// the cold teacher-forced state of a token sequence, optionally saved as a session checkpoint.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/args.h"
#include "cli/backend_options.h"
#include "cli/commands.h"
#include "decode/generator.h"
#include "model/loader.h"
#include "session/checkpoint.h"
#include "tokenizer/metadata.h"

namespace fs::cli {
namespace {

int fail(const char* command, const Status& s) {
  std::cerr << "flashserve " << command << ": " << s.to_string() << "\n";
  return 1;
}

Expected<std::vector<TokenId>> token_ids(const std::string& text, const Model& model) {
  auto ids = parse_list(text, "--tokens");
  if (!ids.ok()) return ids.status();
  std::vector<TokenId> out;
  for (const auto v : *ids) {
    if (v >= model.info().vocab_size) {
      return invalid_argument("--tokens: id " + std::to_string(v) + " >= vocab size " +
                              std::to_string(model.info().vocab_size));
    }
    out.push_back(static_cast<TokenId>(v));
  }
  if (out.empty()) return invalid_argument("--tokens: no tokens");
  return out;
}

Status save_state(const std::string& path, const std::string& model_dir, const Model& model,
                  const DecodeState& state) {
  auto fingerprint = state_fingerprint(model_dir, model.info());
  if (!fingerprint.ok()) return fingerprint.status();
  return save_checkpoint(path, state, {model.info().family, *fingerprint});
}

}  // namespace

void add_generate_command(CLI::App& app, Action& action) {
  struct Options {
    std::string model, tokens, prompt, save_state;
    LoadOptions load;
    std::int64_t max_tokens = 32;
    int mtp_depth = 0;
    SamplerConfig sampler;
    std::uint64_t seed = 0;
    std::vector<std::int64_t> stop_tokens;
    std::int64_t prefill_chunk = 2048;  // as PrepareOptions (session/live_session.h)
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("generate", "Generate from token ids (autoregressive or MTP speculative)");
  cmd->add_option("--model", o->model, "Model folder, or a GGUF file (ds4's DeepSeek V4)")
      ->required();
  auto* tokens_opt = cmd->add_option("--tokens", o->tokens, "Prompt token ids, comma-separated");
  auto* prompt_opt = cmd->add_option("--prompt", o->prompt,
                                     "Prompt text (raw, encoded with the model's tokenizer)");
  tokens_opt->excludes(prompt_opt);
  cmd->require_option(1, 0);
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--mtp-depth", o->mtp_depth,
                  "Drafts per round from the MTP head (0: autoregressive)")
      ->check(CLI::Range(0, kMaxMtpDepth));
  cmd->add_option("--temperature", o->sampler.temperature, "0: greedy");
  cmd->add_option("--top-p", o->sampler.top_p);
  cmd->add_option("--top-k", o->sampler.top_k);
  cmd->add_option("--min-p", o->sampler.min_p);
  cmd->add_option("--presence-penalty", o->sampler.presence_penalty);
  cmd->add_option("--frequency-penalty", o->sampler.frequency_penalty);
  cmd->add_option("--repetition-penalty", o->sampler.repetition_penalty);
  cmd->add_option("--seed", o->seed);
  cmd->add_option("--stop-token", o->stop_tokens, "Stop after emitting this id (repeatable)");
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prompt tokens per forward call");
  cmd->add_option("--save-state", o->save_state, "Write the session checkpoint after the turn");
  add_backend_options(cmd, o->load);
  cmd->add_flag("--json", o->json, "Print one JSON object");
  cmd->callback([o, &action] {
    action = [o]() -> int {
      auto model = load_model(o->model, o->load);
      if (!model.ok()) return fail("generate", model.status());
      Model& m = **model;
      // Text in (or out) needs the folder's tokenizer; token ids alone do not.
      std::optional<TokenizerBundle> tok;
      if (!o->prompt.empty()) {
        auto loaded = load_tokenizer_dir(o->model);
        if (!loaded.ok()) return fail("generate", loaded.status());
        tok.emplace(std::move(loaded).value());
      }
      Expected<std::vector<TokenId>> prompt = invalid_argument("give --tokens or --prompt");
      if (tok) {
        prompt = tok->tokenizer.encode(o->prompt);
      } else if (!o->tokens.empty()) {
        prompt = token_ids(o->tokens, m);
      }
      if (!prompt.ok()) return fail("generate", prompt.status());
      if (prompt->empty()) return fail("generate", invalid_argument("the prompt has no tokens"));
      DecodeState state = new_decode_state(m);
      using Clock = std::chrono::steady_clock;
      const auto t0 = Clock::now();
      if (auto s = extend(m, state, *prompt, o->prefill_chunk); !s.ok()) return fail("generate", s);
      const auto t1 = Clock::now();
      GenerateOptions g;
      g.max_tokens = o->max_tokens;
      g.mtp_depth = o->mtp_depth;
      g.sampler = o->sampler;
      g.seed = o->seed;
      for (const auto t : o->stop_tokens) g.stop_tokens.push_back(static_cast<TokenId>(t));
      const auto r = generate(m, state, g);
      const auto t2 = Clock::now();
      if (!r.error.ok()) return fail("generate", r.error);
      const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
      if (!o->save_state.empty()) {
        if (!r.state_complete)
          return fail("generate", internal_error("the turn's state is incomplete; not saved"));
        if (auto s = save_state(o->save_state, o->model, m, state); !s.ok())
          return fail("generate", s);
      }
      nlohmann::json j;
      j["tokens"] = r.tokens;
      j["text"] = nullptr;  // token ids in, token ids out: no tokenizer involved
      if (tok) {
        auto text = tok->tokenizer.decode(r.tokens, /*skip_special=*/true);
        if (!text.ok()) return fail("generate", text.status());
        j["text"] = *text;
      }
      j["finish_reason"] = finish_reason_name(r.finish_reason);
      j["stats"] = {
          {"rounds", r.stats.rounds},
          {"drafted", std::vector<std::int64_t>(r.stats.drafted.begin(),
                                                r.stats.drafted.begin() + o->mtp_depth)},
          {"accepted", std::vector<std::int64_t>(r.stats.accepted.begin(),
                                                 r.stats.accepted.begin() + o->mtp_depth)},
          {"exit", exit_path_name(r.exit_path)},
          {"state_complete", r.state_complete},
          {"backend", m.info().backend},
          {"prompt_tokens", prompt->size()},
          {"prefill_ms", ms(t1 - t0)},
          {"decode_ms", ms(t2 - t1)}};
      if (o->json) {
        std::cout << j.dump() << "\n";
      } else {
        for (std::size_t i = 0; i < r.tokens.size(); ++i)
          std::cout << (i ? "," : "") << r.tokens[i];
        std::cout << "\n" << j["stats"].dump() << "\n";
      }
      return 0;
    };
  });

  struct PrefillOptions {
    std::string model, tokens, save_state;
    LoadOptions load;
    std::int64_t prefill_chunk = 2048;  // as PrepareOptions (session/live_session.h)
  };
  auto p = std::make_shared<PrefillOptions>();
  auto* pre =
      app.add_subcommand("prefill", "Save the cold, teacher-forced state of a token sequence");
  pre->add_option("--model", p->model, "Model folder, or a GGUF file")->required();
  pre->add_option("--tokens", p->tokens, "Token ids, comma-separated")->required();
  pre->add_option("--save-state", p->save_state, "Checkpoint file to write")->required();
  pre->add_option("--prefill-chunk", p->prefill_chunk, "Tokens per forward call");
  add_backend_options(pre, p->load);
  pre->callback([p, &action] {
    action = [p]() -> int {
      auto model = load_model(p->model, p->load);
      if (!model.ok()) return fail("prefill", model.status());
      auto tokens = token_ids(p->tokens, **model);
      if (!tokens.ok()) return fail("prefill", tokens.status());
      DecodeState state = new_decode_state(**model);
      if (auto s = extend(**model, state, *tokens, p->prefill_chunk); !s.ok())
        return fail("prefill", s);
      if (auto s = save_state(p->save_state, p->model, **model, state); !s.ok())
        return fail("prefill", s);
      std::cout << nlohmann::json({{"tokens", state.tokens.size()}, {"file", p->save_state}}).dump()
                << "\n";
      return 0;
    };
  });
}

}  // namespace fs::cli
