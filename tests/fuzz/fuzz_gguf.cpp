// libFuzzer target: a whole GGUF file in memory through the reader's validation. Any input must
// give a header or an error, never a crash, an out-of-bounds read, a huge allocation or a leak.
#include <cstddef>
#include <cstdint>
#include <span>

#include "format/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto header = fs::parse_gguf(std::span<const std::uint8_t>(data, size));
  if (header.ok()) {
    for (const auto& t : header->tensors) {
      // What the validator accepted lies inside the file and is aligned.
      if (header->data_start + t.offset + t.bytes > size) __builtin_trap();
      if (t.offset % header->alignment != 0) __builtin_trap();
    }
  }
  return 0;
}
