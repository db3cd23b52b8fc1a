// Argument parsing shared by the subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace fs::cli {

// "1,2,3" -> {1,2,3}; every item must be a non-negative decimal integer. `what` names the option.
Expected<std::vector<std::int64_t>> parse_list(const std::string& text, const char* what);

}  // namespace fs::cli
