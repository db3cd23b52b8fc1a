#include "server/sse.h"

namespace fs::server {
namespace {

// Invalid UTF-8 in generated text must not throw in the middle of a stream: replace it.
std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string sse_data(const nlohmann::json& payload) {
  return "data: " + dump(payload) + "\n\n";
}

std::string sse_event(std::string_view name, const nlohmann::json& payload) {
  std::string out = "event: ";
  out.append(name);
  out += "\ndata: " + dump(payload) + "\n\n";
  return out;
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

std::string sse_comment(std::string_view text) {
  std::string out = ": ";
  out.append(text);
  return out + "\n\n";
}

}  // namespace fs::server
