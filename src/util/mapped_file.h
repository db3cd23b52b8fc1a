// Read-only memory map of a whole file. Checkpoints are mapped, never read whole, so a tensor that
// is never touched (most rows of a 30 GiB n-gram table) is never paged in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "util/status.h"

namespace fs {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;

  static Expected<MappedFile> open(const std::string& path);

  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) file, e.g. config.json. Bounded so a wrong path to a huge file fails fast.
Expected<std::string> read_text_file(const std::string& path, std::size_t max_bytes = 64u << 20);

}  // namespace fs
