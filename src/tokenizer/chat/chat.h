// Chat prompts for the three families, written in C++ rather than interpreted from Jinja: one
// file per family reproduces its template's output byte for byte (tests compare against the
// reference Jinja renderer on the real templates).
//
// Input is the OpenAI message list: {role, content} where content is a string, null, or a list
// of {type: "text", text} parts (joined without separators); assistant messages may carry
// tool_calls [{id, type, function: {name, arguments}}] and reasoning_content; tool messages
// carry tool_call_id.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace fs {

struct ChatToolCall {
  std::string type = "function";
  std::string name;
  // A JSON string as OpenAI sends it, or an object; rendered as the template renders each.
  nlohmann::ordered_json arguments;
  std::string id;  // the call's id when the client sent one (DeepSeek V4 orders results by it)
};

struct ChatMessage {
  std::string role;                    // system, user, assistant or tool
  std::optional<std::string> content;  // nullopt: content was null or absent
  std::optional<std::string> reasoning_content;
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;

  // The content as templates concatenate it (null reads as empty).
  const std::string& text() const {
    static const std::string kEmpty;
    return content ? *content : kEmpty;
  }
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools =
      nlohmann::ordered_json::array();  // OpenAI tool definitions, as given
  bool add_generation_prompt = false;
  std::optional<bool> enable_thinking;  // nullopt: the template's default
  // The client's reasoning effort as given (OpenAI reasoning_effort, Responses reasoning.effort);
  // GLM 5.3's template writes it into the prompt. nullopt: none given.
  std::optional<std::string> reasoning_effort;
};

// Parses a message list and the tool list (null: none), taking both by value so that a caller
// can move client JSON in: nothing of it is copied.
Expected<ChatRequest> parse_chat_messages(nlohmann::ordered_json messages,
                                          nlohmann::ordered_json tools);
// Parses a message list, or an object {"messages": [...], "tools": [...]} (copies it).
Expected<ChatRequest> parse_chat_request(const nlohmann::ordered_json& j);
Expected<ChatRequest> parse_chat_request_file(const std::string& path);

// kDeepSeek is DeepSeek V3's Jinja template, kDeepSeekV4 the V4 encoding (deepseek_v4.cpp), kGlm
// GLM 5.3's template (glm.cpp).
enum class ChatFamily { kQwen, kDeepSeek, kGlm, kDeepSeekV4 };
std::string_view chat_family_name(ChatFamily f);
Expected<ChatFamily> chat_family_from_name(std::string_view name);

// Picks the family of a tokenizer folder: config.json's model_type when present (deepseek_v4:
// kDeepSeekV4, other deepseek*: kDeepSeek), else the template's marker tokens (<|im_start|>,
// <｜User｜>, [gMASK]) in the chat template. `model_type`, when given, stands for config.json's
// (a GGUF model's, from its metadata).
Expected<ChatFamily> detect_chat_family(const std::string& dir, const std::string& chat_template,
                                        const std::string& model_type = "");

struct ChatSpecialTokens {
  std::string bos;  // DeepSeek's template starts with it
};

// The prompt text for `request` in `family`'s format.
Expected<std::string> render_chat(ChatFamily family, const ChatRequest& request,
                                  const ChatSpecialTokens& tokens);

// The family renderers (one file each).
Expected<std::string> render_qwen3(const ChatRequest& request);
Expected<std::string> render_deepseek_v3(const ChatRequest& request,
                                         const ChatSpecialTokens& tokens);
Expected<std::string> render_deepseek_v4(const ChatRequest& request,
                                         const ChatSpecialTokens& tokens);
Expected<std::string> render_glm(const ChatRequest& request);

// Appends each part in order (the renderers' string building).
inline void append_all(std::string& out, std::initializer_list<std::string_view> parts) {
  for (const std::string_view p : parts) out.append(p);
}

// JSON text as the reference Jinja's `tojson` writes it: keys in input order, ", " and ": "
// separators, non-ASCII kept, strings escaped like JavaScript's JSON.stringify.
std::string to_json_text(const nlohmann::ordered_json& j);

}  // namespace fs
