// Writes a safetensors file (tests, converters, the embedded model). Tensors are laid out in the
// order given, 8-byte aligned, with the header padded by spaces as the format allows.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor_view.h"
#include "util/status.h"

namespace fs {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::span<const std::uint8_t> bytes;
};

// The complete file contents.
Expected<std::vector<std::uint8_t>> encode_safetensors(
    const std::vector<TensorToWrite>& tensors,
    const std::map<std::string, std::string>& metadata = {});
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace fs
