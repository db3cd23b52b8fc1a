// Shared helpers for the tests: fixture paths, scratch folders, whole-file reads and writes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace fs::test {

// ../shared/fixtures (or FLASHSERVE_FIXTURES) joined with `rel`.
std::string fixture_path(const std::string& rel);
// The hf-tiny folder of one family: "qwen4_exp", "deepseek_v4", "glm5_next".
std::string hf_tiny(const std::string& family);

// A fresh folder under the system temp dir, removed with its contents on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

std::vector<std::uint8_t> read_bytes(const std::string& path);
// A file holding one JSON array of integers (token ids: the models' parity/tokens.json).
std::vector<std::int32_t> read_json_ids(const std::string& path);
void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes);
void write_text(const std::string& path, const std::string& text);

// Runs a shell command; returns its exit status and fills `output` with stdout+stderr.
int run_command(const std::string& command, std::string* output);

// Paths of the built programs (set by CMake).
std::string flashserve_binary();
std::string watchdog_binary();

}  // namespace fs::test
