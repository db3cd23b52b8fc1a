// Crash-safe file replacement: the bytes go to a temporary file in the destination's folder,
// which is fsynced, renamed over the destination, and the folder fsynced. A reader sees the old
// file or the whole new one, never a mix, whenever the writer dies.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "util/status.h"

namespace fs {

// Writes the concatenation of `parts` to `path` atomically.
Status write_file_atomically(const std::string& path,
                             std::span<const std::span<const std::uint8_t>> parts);

// Temporary files of interrupted writes carry this suffix; a store may delete them at start.
inline constexpr const char* kTempSuffix = ".partial";

}  // namespace fs
