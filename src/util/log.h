// Operational log lines (stderr, via spdlog): things an operator should see, such as a refused
// session checkpoint. Never used for control flow.
#pragma once

#include <string_view>

namespace fs {

void log_info(std::string_view message);
void log_warning(std::string_view message);

}  // namespace fs
