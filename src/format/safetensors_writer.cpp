#include "format/safetensors_writer.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace fs {

Expected<std::vector<std::uint8_t>> encode_safetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const auto need = static_cast<std::uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
    if (need != t.bytes.size()) {
      return invalid_argument("tensor '" + t.name + "': shape " + shape_to_string(t.shape) +
                              " needs " + std::to_string(need) + " bytes, got " +
                              std::to_string(t.bytes.size()));
    }
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + need}}};
    offset += need;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8 != 0) text.push_back(' ');
  std::vector<std::uint8_t> out;
  out.reserve(8 + text.size() + offset);
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(n >> (8 * i)));
  out.insert(out.end(), text.begin(), text.end());
  for (const auto& t : tensors) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  auto bytes = encode_safetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot write " + path);
  out.write(reinterpret_cast<const char*>(bytes->data()),
            static_cast<std::streamsize>(bytes->size()));
  if (!out) return io_error("short write to " + path);
  return {};
}

}  // namespace fs
