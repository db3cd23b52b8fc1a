// flashserve: the command line. Subcommands are in their own files (cli/*_command.cpp).
#include <CLI/CLI.hpp>
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "flashserve: inference for MTP Flash models (Qwen 3.8 Flash Next, DeepSeek V4 Flash, GLM 5.3 "
      "Flash)"};
  app.require_subcommand(1);
  fs::cli::Action action;
  fs::cli::add_inspect_command(app, action);
  fs::cli::add_state_command(app, action);
  fs::cli::add_logits_command(app, action);
  fs::cli::add_convert_command(app, action);
  fs::cli::add_generate_command(app, action);
  fs::cli::add_run_command(app, action);
  fs::cli::add_tokenize_command(app, action);
  fs::cli::add_detokenize_command(app, action);
  fs::cli::add_render_command(app, action);
  fs::cli::add_serve_command(app, action);
  fs::cli::add_bench_command(app, action);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return action ? action() : 0;
}
