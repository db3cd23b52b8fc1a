#include "test_support.h"

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>

namespace fs::test {

std::string fixture_path(const std::string& rel) {
  const auto root = std::filesystem::path(FLASHSERVE_FIXTURES);
  if (!std::filesystem::exists(root)) {
    throw std::runtime_error("test fixtures not found at " + root.string() +
                             " (configure with -DFLASHSERVE_FIXTURES=DIR)");
  }
  return (root / rel).string();
}

std::string hf_tiny(const std::string& family) {
  return fixture_path("hf-tiny/" + family);
}

ScratchDir::ScratchDir() {
  std::random_device rd;
  const auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto p = base / ("flashserve-test-" + std::to_string(rd()));
    if (std::filesystem::create_directory(p)) {
      path_ = p;
      return;
    }
  }
  throw std::runtime_error("cannot create a scratch folder");
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::int32_t> read_json_ids(const std::string& path) {
  const auto bytes = read_bytes(path);
  return nlohmann::json::parse(std::string(bytes.begin(), bytes.end()))
      .get<std::vector<std::int32_t>>();
}

void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_text(const std::string& path, const std::string& text) {
  write_bytes(path, std::vector<std::uint8_t>(text.begin(), text.end()));
}

int run_command(const std::string& command, std::string* output) {
  const std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed");
  std::array<char, 4096> buf{};
  std::string out;
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  if (output) *output = out;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string flashserve_binary() {
  // FLASHSERVE_TEST_BINARY runs the CLI tests against another build's binary (the device checks
  // carry the test binaries and flashserve away from the build folder they were configured in).
  const char* other = std::getenv("FLASHSERVE_TEST_BINARY");
  return other != nullptr && *other != '\0' ? other : FLASHSERVE_BINARY;
}
std::string watchdog_binary() {
  return FLASHSERVE_WATCHDOG_BINARY;
}

}  // namespace fs::test
