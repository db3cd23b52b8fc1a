// The Responses API endpoints: POST /v1/responses (plain and streamed), GET and DELETE
// /v1/responses/{id}, GET /v1/responses/{id}/input_items, POST /v1/responses/input_tokens. A
// request becomes a chat prompt (responses_request.h), a job on the engine, and a response built
// from the parsed model output (responses_format.h); stored responses (response_store.h) let a
// follow-up name its predecessor with previous_response_id and continue from the very tokens the
// model state covers, so the session bank answers it warm.
#pragma once

#include <httplib.h>

#include <cstdint>
#include <string>

#include "server/engine.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/response_store.h"
#include "tokenizer/chat/chat.h"
#include "tokenizer/tokenizer.h"

namespace fs::server {

// What the endpoints use of the server; the server owns all of it.
struct ResponsesDeps {
  const Tokenizer* tokenizer = nullptr;
  ChatFamily family = ChatFamily::kQwen;
  ChatSpecialTokens special;
  std::string model_id;
  std::int64_t max_context = 0;
  RequestLimits limits;
  std::int64_t request_timeout_s = 600;
  Engine* engine = nullptr;
  Metrics* metrics = nullptr;
  ResponseStore* store = nullptr;
};

void handle_responses_create(const ResponsesDeps& deps, const httplib::Request& req,
                             httplib::Response& res);
// POST /v1/responses/input_tokens: the prompt's token count, nothing generated.
void handle_responses_input_tokens(const ResponsesDeps& deps, const httplib::Request& req,
                                   httplib::Response& res);
void handle_responses_get(const ResponsesDeps& deps, const std::string& id, httplib::Response& res);
// GET /v1/responses/{id}/input_items: the request's own input items, paged as OpenAI pages them.
void handle_responses_input_items(const ResponsesDeps& deps, const std::string& id,
                                  const httplib::Request& req, httplib::Response& res);
void handle_responses_delete(const ResponsesDeps& deps, const std::string& id,
                             httplib::Response& res);

}  // namespace fs::server
