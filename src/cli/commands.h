// Subcommands of the flashserve command line. Each registers itself on the CLI11 app and returns
// the process exit code from its run function.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace fs::cli {

// The action to run after parsing; set by whichever subcommand the user chose.
using Action = std::function<int()>;

void add_inspect_command(CLI::App& app, Action& action);
void add_state_command(CLI::App& app, Action& action);
void add_logits_command(CLI::App& app, Action& action);
void add_convert_command(CLI::App& app, Action& action);
void add_generate_command(CLI::App& app, Action& action);
void add_run_command(CLI::App& app, Action& action);
void add_tokenize_command(CLI::App& app, Action& action);
void add_detokenize_command(CLI::App& app, Action& action);
void add_render_command(CLI::App& app, Action& action);
void add_serve_command(CLI::App& app, Action& action);
void add_bench_command(CLI::App& app, Action& action);

}  // namespace fs::cli
