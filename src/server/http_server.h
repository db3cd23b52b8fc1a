// `flashserve serve`: the HTTP front end (cpp-httplib). Routes requests to the OpenAI and
// Anthropic handlers, checks the API key, answers CORS preflights, and serves /health and
// /metrics. Generation runs on the engine worker (engine.h).
#pragma once

#include "model/loader.h"

#include <cstdint>
#include <string>

#include "server/request.h"
#include "util/status.h"

namespace fs::server {

struct ServerOptions {
  std::string model_dir;
  LoadOptions load;  // backend and dtype
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (the bound port is printed)
  std::string api_key;  // empty: no authentication
  bool cors = false;
  int mtp_depth = -1;  // -1: 3 when the checkpoint has an MTP head, else 0 (as `run`)
  std::string session_dir;
  std::uint64_t session_disk_mb = 4096;
  std::size_t session_ram_mb = 1024;
  std::size_t responses_store_mb = 256;  // stored /v1/responses (previous_response_id)
  std::size_t max_queue = 64;
  std::size_t max_body_bytes = std::size_t{8} << 20;
  std::int64_t max_context = 0;          // 0: the model's max_position_embeddings
  int http_threads = 16;                 // requests served at once (the rest: 503 + Retry-After)
  std::size_t max_connections = 512;     // open connections, idle and slow ones included
  std::int64_t read_timeout_ms = 10000;  // a request's first byte to its last
  std::int64_t request_timeout_s = 600;  // arrival to the end of its generation
  RequestLimits limits;
  // --generation-config auto: the model's generation_config.json gives the sampling of requests
  // that leave it unset (limits.sampling_defaults); none: greedy unless a request says otherwise.
  bool generation_config = true;
  std::string prompt_log;  // --log-prompts: append each prompt as a JSON line (debugging)
};

// Loads the model and serves until SIGINT or SIGTERM. Prints
// "flashserve: listening on http://HOST:PORT" on stderr once the socket is bound.
Status run_server(const ServerOptions& options);

}  // namespace fs::server
