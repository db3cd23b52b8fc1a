// An API error as the HTTP layer answers it: a status, a type, the offending field and a message.
// OpenAI and Anthropic clients parse different shapes; both are rendered from this one value.
#pragma once

#include <string>

namespace fs::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // the field at fault; empty when none
  std::string code;   // a machine-readable code (OpenAI's "code"); empty when none

  static ApiError invalid(std::string param, std::string message, std::string code = {});
};

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
std::string openai_error_body(const ApiError& e);
// {"type": "error", "error": {"type", "message"}} with Anthropic's type for the status.
std::string anthropic_error_body(const ApiError& e);
// Anthropic's error type for an HTTP status (400 invalid_request_error, 401
// authentication_error, ...).
std::string anthropic_error_type(int status);

}  // namespace fs::server
