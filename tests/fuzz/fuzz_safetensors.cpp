// libFuzzer target: a whole safetensors file in memory through the header validator. Any input
// must give a header or an error, never a crash, an out-of-bounds read or a leak.
#include <cstddef>
#include <cstdint>
#include <span>

#include "format/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto header = fs::parse_safetensors_header(std::span<const std::uint8_t>(data, size));
  if (header.ok()) {
    for (const auto& [name, t] : header->tensors) {
      // Offsets the validator accepted lie inside the data section.
      if (header->data_start + t.end > size) __builtin_trap();
    }
  }
  return 0;
}
