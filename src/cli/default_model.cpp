// Where the embedded default model lives, for commands run without --model.
#include <filesystem>
#include <system_error>
#include <vector>

#include "cli/commands.h"

namespace fs::cli {

std::string default_model_dir() {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  const stdfs::path exe = stdfs::read_symlink("/proc/self/exe", ec);
  std::vector<stdfs::path> candidates;
  if (!ec) {
    // build/src/flashserve in a checkout; bin/flashserve in an install.
    candidates.push_back(exe.parent_path() / "../../models/qwen4-tiny-code");
    candidates.push_back(exe.parent_path() / "../share/flashserve/models/qwen4-tiny-code");
  }
  // The source tree this binary was built from (set by CMake).
  candidates.emplace_back(FLASHSERVE_SOURCE_MODEL_DIR);
  for (const auto& c : candidates)
    if (stdfs::exists(c / "config.json", ec)) return stdfs::weakly_canonical(c, ec).string();
  return {};
}

}  // namespace fs::cli
