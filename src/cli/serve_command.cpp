// flashserve serve: the OpenAI- and Anthropic-compatible HTTP server (src/server).
#include <iostream>

#include "cli/backend_options.h"
#include "cli/commands.h"
#include "cli/default_model.h"
#include "server/http_server.h"

namespace fs::cli {

void add_serve_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<server::ServerOptions>();
  auto* cmd = app.add_subcommand("serve", "OpenAI- and Anthropic-compatible HTTP server");
  cmd->add_option("--model", o->model_dir,
                  "Model folder (default: the embedded models/qwen4-tiny-code)");
  add_backend_options(cmd, o->load);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port (0: any free port; the bound port is printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require this key (Authorization: Bearer KEY or x-api-key: KEY) on /v1/*");
  cmd->add_flag("--cors", o->cors, "Allow cross-origin requests from any origin");
  cmd->add_option("--mtp-depth", o->mtp_depth,
                  "Drafts per round from the MTP head (default: 3 when the checkpoint has one, "
                  "as `run`; 0: off)")
      ->check(CLI::Range(0, 3));
  cmd->add_option("--log-prompts", o->prompt_log,
                  "Append every prompt, as the model sees it, to this file (JSON lines; for "
                  "debugging what a client's request became)");
  cmd->add_option("--session-dir", o->session_dir,
                  "Folder of the disk session tier (default: none)");
  cmd->add_option("--session-disk-mb", o->session_disk_mb, "Disk tier budget in MiB")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--session-ram-mb", o->session_ram_mb, "RAM session bank budget in MiB")
      ->check(CLI::Range(1, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--responses-store-mb", o->responses_store_mb,
                  "RAM budget of stored /v1/responses (previous_response_id) in MiB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-queue", o->max_queue, "Waiting requests before 503")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body (413 beyond)")
      ->check(CLI::Range(1024, 1 << 30))
      ->capture_default_str();
  cmd->add_option("--max-context", o->max_context,
                  "Context limit in tokens (default: the model's max_position_embeddings)");
  cmd->add_option("--max-tokens-limit", o->limits.max_tokens,
                  "Largest max_tokens a request gets (larger ones are clamped to it)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--generation-config", [o](const std::string& v) { o->generation_config = v == "auto"; },
         "auto: the sampling of requests that leave it unset comes from the model's "
         "generation_config.json (temperature, top_p, top_k, min_p, repetition_penalty, "
         "do_sample), as vLLM does; "
         "none: greedy unless a request sets temperature (default auto)")
      ->check(CLI::IsMember({"auto", "none"}));
  cmd->add_option("--http-threads", o->http_threads,
                  "HTTP worker threads: requests served at once; beyond them 503 + Retry-After")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "Open connections (idle and slow included); beyond them 503")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--read-timeout-ms", o->read_timeout_ms,
                  "A request must arrive whole (headers and body) within this")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  cmd->add_option("--request-timeout-s", o->request_timeout_s,
                  "Deadline of a request from arrival to its last token; then cancelled (504)")
      ->check(CLI::Range(1, 86400))
      ->capture_default_str();
  cmd->callback([o, &action] {
    action = [o]() -> int {
      if (o->model_dir.empty()) {
        auto dir = default_model_dir();
        if (!dir.ok()) {
          std::cerr << "flashserve serve: " << dir.status().to_string() << "\n";
          return 1;
        }
        o->model_dir = *dir;
      }
      const Status s = server::run_server(*o);
      if (!s.ok()) {
        std::cerr << "flashserve serve: " << s.to_string() << "\n";
        return 1;
      }
      return 0;
    };
  });
}

}  // namespace fs::cli
