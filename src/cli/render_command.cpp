// flashserve render --tokenizer DIR --messages F [--add-generation-prompt]
//                   [--enable-thinking true|false] [--family qwen|deepseek|glm]
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/metadata.h"

namespace fs::cli {

void add_render_command(CLI::App& app, Action& action) {
  struct Options {
    std::string tokenizer, messages, family, thinking;
    bool generation_prompt = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "render", "The chat prompt the family's template makes of an OpenAI message list");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "Model or tokenizer folder (tokenizer_config.json)")
      ->required();
  cmd->add_option("--messages", opts->messages,
                  "JSON file: a message list, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_flag("--add-generation-prompt", opts->generation_prompt,
                "End with the assistant turn's opening");
  cmd->add_option("--enable-thinking", opts->thinking, "true or false (default: the template's)")
      ->check(CLI::IsMember({"true", "false"}));
  cmd->add_option("--family", opts->family,
                  "qwen, deepseek or glm (default: detected from the folder)");
  cmd->callback([opts, &action] {
    action = [opts] {
      auto fail = [](const Status& s) {
        std::cerr << "flashserve render: " << s.to_string() << "\n";
        return 1;
      };
      auto meta = load_tokenizer_metadata(opts->tokenizer);
      if (!meta.ok()) return fail(meta.status());
      auto family = opts->family.empty() ? detect_chat_family(opts->tokenizer, meta->chat_template)
                                         : chat_family_from_name(opts->family);
      if (!family.ok()) return fail(family.status());
      auto request = parse_chat_request_file(opts->messages);
      if (!request.ok()) return fail(request.status());
      request->add_generation_prompt = opts->generation_prompt;
      if (!opts->thinking.empty()) request->enable_thinking = opts->thinking == "true";
      auto text = render_chat(*family, *request, ChatSpecialTokens{meta->bos_token.value_or("")});
      if (!text.ok()) return fail(text.status());
      std::cout << *text;
      return 0;
    };
  });
}

}  // namespace fs::cli
