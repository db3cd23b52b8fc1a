// Content hashes (xxh3, 64-bit) for checkpoint integrity and model fingerprints. Not
// cryptographic: they catch corruption and mix-ups, not tampering.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace fs {

std::uint64_t xxh3_64(std::span<const std::uint8_t> bytes);
std::uint64_t xxh3_64(std::string_view text);
std::string hex64(std::uint64_t v);  // 16 lowercase hex digits

}  // namespace fs
