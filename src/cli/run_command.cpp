// flashserve run [--model DIR] [PROMPT]: one-shot completion of PROMPT, or, without one, an
// interactive chat whose turns reuse the warm session state. Without --model, the embedded
// default model (models/qwen4-tiny-code) answers.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "decode/generator.h"
#include "decode/sampling_defaults.h"
#include "decode/stop_tokens.h"
#include "model/gguf_config.h"
#include "model/loader.h"
#include "session/live_session.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/chat/output_parser.h"
#include "tokenizer/metadata.h"
#include "tokenizer/stream_decoder.h"

namespace fs::cli {
namespace {

struct RunOptions {
  std::string model, prompt;
  LoadOptions load;
  std::int64_t max_tokens = 128;
  int mtp_depth = -1;  // -1: 3 when the model has an MTP head, else 0
  // run's own defaults, under the model's generation_config.json (unless --generation-config
  // none), under the flags given.
  SamplerConfig sampler{.temperature = 0.6, .top_k = 20, .top_p = 0.95};
  SamplingDefaults flags;  // what the command line set
  bool generation_config = true;
  std::uint64_t seed = 0;
  bool chat = false;
  bool quiet = false;
};

int fail(const Status& s) {
  std::cerr << "flashserve run: " << s.to_string() << "\n";
  return 1;
}

// One turn: restore/prefill through the bank, generate while streaming text to stdout, bank the
// final state. Prints a stats line to stderr unless quiet.
Expected<std::vector<TokenId>> turn(Model& model, const TokenizerBundle& tok,
                                    const SessionTiers& tiers, std::span<const TokenId> prompt,
                                    const RunOptions& o, const std::vector<TokenId>& stops) {
  const auto t0 = std::chrono::steady_clock::now();
  auto prepared = prepare_session(model, tiers, prompt);
  if (!prepared.ok()) return prepared.status();
  const auto t1 = std::chrono::steady_clock::now();
  StreamDecoder stream(tok.tokenizer, /*skip_special=*/true);
  GenerateOptions g;
  g.max_tokens = o.max_tokens;
  g.mtp_depth = o.mtp_depth;
  g.sampler = o.sampler;
  g.seed = o.seed;
  g.stop_tokens = stops;
  Status stream_error;
  g.on_token = [&](TokenId id) {
    auto text = stream.push(id);
    if (!text.ok()) {
      stream_error = text.status();
      return;
    }
    std::fwrite(text->data(), 1, text->size(), stdout);
    std::fflush(stdout);
  };
  const auto r = generate(model, prepared->state, g);
  const std::string tail = stream.finish();
  std::fwrite(tail.data(), 1, tail.size(), stdout);
  std::fflush(stdout);
  if (!r.error.ok()) return r.error;
  if (!stream_error.ok()) return stream_error;
  commit_session(tiers, prepared->state, r.state_complete);
  const auto t2 = std::chrono::steady_clock::now();
  if (!o.quiet) {
    const double prefill_s = std::chrono::duration<double>(t1 - t0).count();
    const double decode_s = std::chrono::duration<double>(t2 - t1).count();
    std::string accept;
    for (int d = 0; d < o.mtp_depth; ++d) {
      accept += " " + std::to_string(r.stats.accepted[static_cast<std::size_t>(d)]) + "/" +
                std::to_string(r.stats.drafted[static_cast<std::size_t>(d)]);
    }
    std::fprintf(stderr,
                 "\n[%s prompt %zu tokens (%zu reused) %.0f ms; %zu tokens in %.0f ms, %.1f tok/s; "
                 "%s%s%s]\n",
                 prepared->tier.c_str(), prompt.size(), prepared->reused_tokens, prefill_s * 1e3,
                 r.tokens.size(), decode_s * 1e3,
                 static_cast<double>(r.tokens.size()) / std::max(decode_s, 1e-9),
                 o.mtp_depth > 0
                     ? ("MTP depth " + std::to_string(o.mtp_depth) + " accepted/drafted").c_str()
                     : "autoregressive",
                 accept.c_str(), r.finish_reason == FinishReason::kStop ? ", stop" : "");
  }
  return r.tokens;
}

int run(RunOptions o) {
  if (o.model.empty()) {
    auto dir = default_model_dir();
    if (!dir.ok()) return fail(dir.status());
    o.model = *dir;
  }
  if (o.generation_config) {
    auto defaults = read_sampling_defaults(o.model);
    if (!defaults.ok()) return fail(defaults.status());
    o.sampler = defaults->over(o.sampler);
  }
  o.sampler = o.flags.over(o.sampler);
  if (Status s = o.sampler.validate(); !s.ok()) return fail(s);
  auto model = load_model(o.model, o.load);
  if (!model.ok()) return fail(model.status());
  auto tok = load_tokenizer_dir(o.model);
  if (!tok.ok()) return fail(tok.status());
  if (o.mtp_depth < 0) o.mtp_depth = (*model)->info().has_mtp ? kDefaultMtpDepth : 0;
  if (o.mtp_depth > 0 && !(*model)->info().has_mtp) {
    return fail(failed_precondition("this checkpoint has no MTP head; use --mtp-depth 0"));
  }
  const auto stops = turn_stop_tokens(*tok, (*model)->info());
  SessionBank bank;
  const SessionTiers tiers{&bank, nullptr};

  if (!o.prompt.empty() && !o.chat) {
    // One-shot completion: the prompt is raw text (the embedded model is a base code model).
    auto ids = tok->tokenizer.encode(o.prompt);
    if (!ids.ok()) return fail(ids.status());
    std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
    auto out = turn(**model, *tok, tiers, *ids, o, stops);
    if (!out.ok()) return fail(out.status());
    std::printf("\n");
    return 0;
  }

  const auto gguf = gguf_hf_config(o.model);
  auto family = detect_chat_family(o.model, tok->metadata.chat_template,
                                   gguf ? gguf->value("model_type", "") : "");
  if (!family.ok()) return fail(family.status());
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
  auto chat_turn = [&](const std::string& user) -> Status {
    conversation.push_back({{"role", "user"}, {"content", user}});
    auto request = parse_chat_request(nlohmann::ordered_json{{"messages", conversation}});
    if (!request.ok()) return request.status();
    request->add_generation_prompt = true;
    auto text =
        render_chat(*family, *request, ChatSpecialTokens{tok->metadata.bos_token.value_or("")});
    if (!text.ok()) return text.status();
    auto ids = tok->tokenizer.encode(*text);
    if (!ids.ok()) return ids.status();
    auto out = turn(**model, *tok, tiers, *ids, o, stops);
    if (!out.ok()) return out.status();
    auto reply = tok->tokenizer.decode(*out, /*skip_special=*/true);
    if (!reply.ok()) return reply.status();
    // The reply as the next turn's template renders what was generated, so that the next turn
    // continues the banked state: as written when the model opened any think block itself (the
    // templates split <think>...</think> out of the content), split into reasoning and content
    // when the prompt opened it (GLM 5.3, DeepSeek V4 thinking: the reply starts inside it).
    nlohmann::ordered_json message = {{"role", "assistant"}, {"content", *reply}};
    if (prompt_opens_reasoning(*text)) {
      OutputParserOptions parse;
      parse.family = *family;
      parse.parse_tool_calls = false;
      parse.starts_in_reasoning = true;
      ParsedOutput parsed = parse_chat_output(*reply, parse);
      message["content"] = parsed.content;
      message["reasoning_content"] = parsed.reasoning;
    }
    conversation.push_back(std::move(message));
    std::printf("\n");
    return {};
  };
  if (!o.prompt.empty()) {
    const Status s = chat_turn(o.prompt);
    return s.ok() ? 0 : fail(s);
  }
  std::fprintf(stderr, "flashserve chat with %s (empty line or Ctrl-D to quit)\n", o.model.c_str());
  std::string line;
  while (true) {
    std::fprintf(stderr, "> ");
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (const Status s = chat_turn(line); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace

void add_run_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run",
                                 "Complete PROMPT with a model (default: the embedded one), or "
                                 "chat interactively without PROMPT");
  cmd->add_option("prompt", o->prompt, "Text to continue (with --chat: a user message)");
  cmd->add_option("--model", o->model,
                  "Model folder or GGUF file (default: the embedded models/qwen4-tiny-code)");
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens to generate at most")
      ->check(CLI::Range(1, 1 << 20));
  add_backend_options(cmd, o->load);
  cmd->add_option("--mtp-depth", o->mtp_depth,
                  "Drafts per round (default 3 with an MTP head, else 0)")
      ->check(CLI::Range(0, kMaxMtpDepth));
  // Unset flags leave the model's generation_config.json values, else run's own.
  cmd->add_option_function<double>(
      "--temperature", [o](double v) { o->flags.temperature = v; },
      "0: greedy (default: the model's generation_config.json, else 0.6)");
  cmd->add_option_function<double>(
      "--top-p", [o](double v) { o->flags.top_p = v; },
      "default: the model's generation_config.json, else 0.95");
  cmd->add_option_function<std::int32_t>(
      "--top-k", [o](std::int32_t v) { o->flags.top_k = v; },
      "default: the model's generation_config.json, else 20");
  cmd->add_option_function<double>(
      "--min-p", [o](double v) { o->flags.min_p = v; },
      "default: the model's generation_config.json, else 0");
  cmd->add_option_function<double>(
      "--repetition-penalty", [o](double v) { o->flags.repetition_penalty = v; },
      "over the prompt and the completion, in (0, 2] (default: the model's "
      "generation_config.json, else 1: off)");
  cmd->add_option_function<std::string>(
         "--generation-config", [o](const std::string& v) { o->generation_config = v == "auto"; },
         "auto: unset sampling flags take the model's generation_config.json (temperature, "
         "top_p, top_k, min_p, repetition_penalty, do_sample); none: run's own defaults (default "
         "auto)")
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_option("--seed", o->seed, "default 0");
  cmd->add_flag("--chat", o->chat, "Render PROMPT as a user message with the chat template");
  cmd->add_flag("--quiet", o->quiet, "No stats line on stderr");
  cmd->callback([o, &action] { action = [o] { return run(*o); }; });
}

}  // namespace fs::cli
