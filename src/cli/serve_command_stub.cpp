// flashserve serve, in a build without cpp-httplib: the command exists and says why it cannot run.
#include <iostream>

#include "cli/commands.h"

namespace fs::cli {

void add_serve_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("serve", "HTTP server (not built: cpp-httplib was not found)");
  cmd->allow_extras();
  cmd->callback([&action] {
    action = []() -> int {
      std::cerr << "flashserve serve: this build has no HTTP server (cpp-httplib was not found "
                   "at configure time; install libcpp-httplib-dev and reconfigure)\n";
      return 2;
    };
  });
}

}  // namespace fs::cli
