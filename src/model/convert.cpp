#include "model/convert.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "format/safetensors.h"
#include "format/safetensors_writer.h"

namespace fs {
namespace {

constexpr std::string_view kTableSuffix = "ple_embedding.ngram_embedding.weight";

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::uint8_t> converted(const TensorView& v, DType to) {
  std::vector<std::uint8_t> out;
  if (!dtype_is_float(v.dtype) || v.dtype == to) {
    out.assign(v.bytes.begin(), v.bytes.end());
    return out;
  }
  std::vector<float> f(static_cast<std::size_t>(v.numel()));
  convert_to_f32(v.dtype, v.bytes.data(), f.data(), f.size());
  if (to == DType::kF32) {
    out.resize(f.size() * sizeof(float));
    std::memcpy(out.data(), f.data(), out.size());
  } else {
    out.resize(f.size() * 2);
    for (std::size_t i = 0; i < f.size(); ++i) {
      const auto h = f32_to_bf16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

}  // namespace

Status convert_checkpoint(const std::string& in_dir, const std::string& out_dir,
                          const ConvertOptions& options) {
  if (options.dtype && *options.dtype != DType::kF32 && *options.dtype != DType::kBF16)
    return invalid_argument("convert: only F32 and BF16 targets are supported");
  auto ck = Checkpoint::open(in_dir);
  if (!ck.ok()) return ck.status();
  std::ifstream cf(std::filesystem::path(in_dir) / "config.json");
  if (!cf) return not_found(in_dir + "/config.json: cannot open");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(cf);
  } catch (const nlohmann::json::exception& e) {
    return corrupt(in_dir + "/config.json: " + e.what());
  }
  const std::int64_t parts = options.split_ngram_parts.value_or(1);
  if (parts < 1) return invalid_argument("convert: split_ngram_parts must be >= 1");

  std::vector<std::vector<std::uint8_t>> buffers;  // keeps bytes alive until written
  std::vector<TensorToWrite> out;
  buffers.reserve(ck->tensors().size() + static_cast<std::size_t>(parts));
  for (const auto& [canonical, stored] : ck->tensors()) {
    const auto v = *ck->view(canonical);
    const DType to = (options.dtype && dtype_is_float(v.dtype)) ? *options.dtype : v.dtype;
    buffers.push_back(converted(v, to));
    const auto& bytes = buffers.back();
    if (options.split_ngram_parts && ends_with(stored.stored_name, kTableSuffix)) {
      const auto rows = v.dim(0);
      if (rows % parts != 0)
        return invalid_argument("convert: " + stored.stored_name + " has " + std::to_string(rows) +
                                " rows, not divisible into " + std::to_string(parts) + " parts");
      const auto base =
          stored.stored_name.substr(0, stored.stored_name.size() - std::string("weight").size());
      const auto per = rows / parts;
      const auto row_bytes = static_cast<std::size_t>(v.dim(1)) * dtype_size(to);
      for (std::int64_t p = 0; p < parts; ++p) {
        out.push_back({base + "shard_" + std::to_string(p) + ".weight",
                       to,
                       {per, v.dim(1)},
                       std::span(bytes).subspan(static_cast<std::size_t>(p * per) * row_bytes,
                                                static_cast<std::size_t>(per) * row_bytes)});
      }
      continue;
    }
    out.push_back({stored.stored_name, to, v.shape, bytes});
  }
  if (options.split_ngram_parts) {
    auto& text = config.contains("text_config") ? config["text_config"] : config;
    text["split_ngram_parts"] = parts;
  }
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return io_error("convert: cannot create " + out_dir + ": " + ec.message());
  if (auto s =
          write_safetensors((std::filesystem::path(out_dir) / "model.safetensors").string(), out);
      !s.ok())
    return s;
  std::ofstream of(std::filesystem::path(out_dir) / "config.json");
  of << config.dump(2) << "\n";
  if (!of) return io_error("convert: cannot write " + out_dir + "/config.json");
  return {};
}

}  // namespace fs
