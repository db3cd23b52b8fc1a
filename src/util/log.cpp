#include "util/log.h"

#include <spdlog/spdlog.h>

namespace fs {

void log_info(std::string_view message) {
  spdlog::info("{}", message);
}
void log_warning(std::string_view message) {
  spdlog::warn("{}", message);
}

}  // namespace fs
