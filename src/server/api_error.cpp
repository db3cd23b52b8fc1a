#include "server/api_error.h"

#include <nlohmann/json.hpp>

namespace fs::server {

ApiError ApiError::invalid(std::string param, std::string message, std::string code) {
  ApiError e;
  e.status = 400;
  e.type = "invalid_request_error";
  e.param = std::move(param);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

std::string openai_error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return nlohmann::json({{"error", err}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

std::string anthropic_error_body(const ApiError& e) {
  // Anthropic has no param field: the message names the field instead.
  const std::string message = e.param.empty() || e.message.find(e.param) != std::string::npos
                                  ? e.message
                                  : e.param + ": " + e.message;
  return nlohmann::json(
             {{"type", "error"},
              {"error", {{"type", anthropic_error_type(e.status)}, {"message", message}}}})
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace fs::server
