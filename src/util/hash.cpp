#include "util/hash.h"

#include <xxhash.h>

#include <cstdio>

namespace fs {

std::uint64_t xxh3_64(std::span<const std::uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

std::uint64_t xxh3_64(std::string_view text) {
  return XXH3_64bits(text.data(), text.size());
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace fs
