// libFuzzer target: an HTTP request body through the OpenAI chat, OpenAI completions, Anthropic
// messages and OpenAI Responses parsers (the first byte picks which), and a parsed chat (a
// Responses conversation folded into one too) through all three prompt renderers. Any body must
// give a request or an ApiError (400 for malformed input), never a crash, a stack overflow or a
// leak.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server/request.h"
#include "server/responses_request.h"
#include "tokenizer/chat/chat.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const fs::server::RequestLimits limits;
  const int which = data[0] % 4;
  if (which == 3) {
    const auto parsed = fs::server::parse_responses_request(body, limits);
    if (const auto* e = std::get_if<fs::server::ApiError>(&parsed)) {
      if (e->status < 400 || e->status >= 500) __builtin_trap();
      return 0;
    }
    const auto& r = std::get<fs::server::ResponsesRequest>(parsed);
    // The input as its own history too: a stored conversation is folded the same way.
    const fs::ChatRequest chat =
        fs::server::conversation_chat(r.instructions, r.input, r.input, r.tools, r.enable_thinking);
    for (const auto family :
         {fs::ChatFamily::kQwen, fs::ChatFamily::kDeepSeek, fs::ChatFamily::kGlm})
      (void)fs::render_chat(family, chat, fs::ChatSpecialTokens{"<bos>"});
    return 0;
  }
  const auto parsed = which == 0   ? fs::server::parse_openai_chat(body, limits)
                      : which == 1 ? fs::server::parse_openai_completion(body, limits)
                                   : fs::server::parse_anthropic_messages(body, limits);
  if (const auto* e = std::get_if<fs::server::ApiError>(&parsed)) {
    if (e->status < 400 || e->status >= 500) __builtin_trap();
    return 0;
  }
  const auto& r = std::get<fs::server::GenerationRequest>(parsed);
  if (r.kind != fs::server::ApiKind::kCompletion) {
    for (const auto family :
         {fs::ChatFamily::kQwen, fs::ChatFamily::kDeepSeek, fs::ChatFamily::kGlm})
      (void)fs::render_chat(family, r.chat, fs::ChatSpecialTokens{"<bos>"});
  }
  return 0;
}
