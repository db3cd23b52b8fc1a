#include "cli/default_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace fs::cli {

Expected<std::string> default_model_dir() {
  namespace stdfs = std::filesystem;
  if (const char* env = std::getenv("FLASHSERVE_MODEL"); env && *env) return std::string(env);
  std::error_code ec;
  const auto exe = stdfs::read_symlink("/proc/self/exe", ec);
  const std::string name = "models/qwen4-tiny-code";
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (stdfs::exists(dir / name / "config.json", ec)) return (dir / name).string();
    }
  }
  const stdfs::path built_from = stdfs::path(FLASHSERVE_SOURCE_DIR) / name;
  if (stdfs::exists(built_from / "config.json", ec)) return built_from.string();
  return not_found("no embedded model found (looked beside " + exe.string() + " and in " +
                   built_from.string() + "); pass --model DIR or set FLASHSERVE_MODEL");
}

}  // namespace fs::cli
