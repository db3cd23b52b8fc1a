// Server-sent events framing (text/event-stream): one event is optional "event:" and "data:"
// lines ended by a blank line. JSON payloads are single-line, so one data line suffices.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace fs::server {

// "data: {json}\n\n" (OpenAI's chunks).
std::string sse_data(const nlohmann::json& payload);
// "event: NAME\ndata: {json}\n\n" (Anthropic's events).
std::string sse_event(std::string_view name, const nlohmann::json& payload);
// OpenAI's end-of-stream marker "data: [DONE]\n\n".
std::string sse_done();
// ": TEXT\n\n", a comment: SSE clients ignore it (a keep-alive while a long prompt is prefilled).
std::string sse_comment(std::string_view text);

}  // namespace fs::server
