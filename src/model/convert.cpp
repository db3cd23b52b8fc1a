#include "model/convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "model/deepseek_v4/official_convert.h"
#include "tensor/quant/minifloat.h"
#include "util/progress.h"

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

constexpr std::int64_t kFp8Block = 128;
constexpr float kE4m3Max = 448.0f;

struct Fp8Tensor {
  std::vector<std::uint8_t> weights;  // [.., out, in] e4m3 codes
  std::vector<std::uint8_t> scales;   // [.., ceil(out/128), ceil(in/128)] f32
  Shape scale_shape;
};

// Per matrix of the (possibly stacked, [E, out, in]) tensor, per 128x128 block.
Fp8Tensor quantize_fp8(const TensorView& v) {
  std::vector<float> f(static_cast<std::size_t>(v.numel()));
  convert_to_f32(v.dtype, v.bytes.data(), f.data(), f.size());
  const auto rows = v.shape[v.shape.size() - 2], cols = v.shape.back();
  const auto mats = v.numel() / (rows * cols);
  const auto br = (rows + kFp8Block - 1) / kFp8Block, bc = (cols + kFp8Block - 1) / kFp8Block;
  Fp8Tensor q;
  q.weights.resize(f.size());
  std::vector<float> scale(static_cast<std::size_t>(mats * br * bc));
  for (std::int64_t m = 0; m < mats; ++m) {
    const float* w = f.data() + m * rows * cols;
    std::uint8_t* out = q.weights.data() + m * rows * cols;
    for (std::int64_t bi = 0; bi < br; ++bi) {
      for (std::int64_t bj = 0; bj < bc; ++bj) {
        const auto r1 = std::min(rows, (bi + 1) * kFp8Block);
        const auto c1 = std::min(cols, (bj + 1) * kFp8Block);
        float amax = 0;
        for (auto r = bi * kFp8Block; r < r1; ++r)
          for (auto c = bj * kFp8Block; c < c1; ++c)
            amax = std::max(amax, std::fabs(w[r * cols + c]));
        // An all-zero block keeps scale 1 (any scale dequantises zeros to zero).
        const float s = amax > 0 ? amax / kE4m3Max : 1.0f;
        scale[static_cast<std::size_t>((m * br + bi) * bc + bj)] = s;
        for (auto r = bi * kFp8Block; r < r1; ++r)
          for (auto c = bj * kFp8Block; c < c1; ++c)
            out[r * cols + c] = quant::f32_to_e4m3_saturate(w[r * cols + c] / s);
      }
    }
  }
  q.scales.resize(scale.size() * sizeof(float));
  std::memcpy(q.scales.data(), scale.data(), q.scales.size());
  q.scale_shape = v.shape;
  q.scale_shape[q.scale_shape.size() - 2] = br;
  q.scale_shape.back() = bc;
  return q;
}

}  // namespace

bool fp8_quantises(const std::string& name, std::size_t rank) {
  if (rank == 2)
    return ends_with(name, "_proj.weight") || ends_with(name, "mtp.fc_hidden.weight") ||
           ends_with(name, "mtp.fc_embedding.weight");
  return rank == 3 && ends_with(name, "_proj");  // stacked experts [E, out, in]
}

bool fp8_blocks_fit_groups(const std::string& name, std::int64_t group_rows) {
  return !ends_with(name, "self_attn.o_a_proj.weight") || group_rows % kFp8Block == 0;
}

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
  if (options.quantize_fp4) {
    if (options.quantize_fp8 || options.split_ngram_parts)
      return invalid_argument("convert: --quantize fp4 writes the official layout alone");
    return convert_deepseek_v4_official(*ck, config, out_dir, options.dtype);
  }
  const std::int64_t parts = options.split_ngram_parts.value_or(1);
  if (parts < 1) return invalid_argument("convert: split_ngram_parts must be >= 1");

  std::vector<std::vector<std::uint8_t>> buffers;  // keeps bytes alive until written
  std::vector<TensorToWrite> out;
  buffers.reserve(2 * ck->tensors().size() + static_cast<std::size_t>(parts));
  std::vector<std::string> quantised;
  const auto& text_config = config.contains("text_config") ? config["text_config"] : config;
  const std::int64_t group_rows = text_config.value("o_lora_rank", std::int64_t{0});
  std::uint64_t total = 0;
  for (const auto& [canonical, stored] : ck->tensors()) total += ck->view(canonical)->bytes.size();
  ProgressMeter meter("convert " + in_dir, total);
  for (const auto& [canonical, stored] : ck->tensors()) {
    const auto v = *ck->view(canonical);
    meter.add(v.bytes.size());
    if (options.quantize_fp8 && dtype_is_float(v.dtype) &&
        fp8_quantises(stored.stored_name, v.shape.size()) &&
        fp8_blocks_fit_groups(stored.stored_name, group_rows)) {
      auto q = quantize_fp8(v);
      buffers.push_back(std::move(q.weights));
      out.push_back({stored.stored_name, DType::kF8E4M3, v.shape, buffers.back()});
      buffers.push_back(std::move(q.scales));
      out.push_back(
          {stored.stored_name + "_scale_inv", DType::kF32, q.scale_shape, buffers.back()});
      quantised.push_back(stored.stored_name);
      continue;
    }
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
  if (options.quantize_fp8) {
    if (quantised.empty()) return invalid_argument("convert: no projection to quantise to fp8");
    // The fields the FP8 releases carry (transformers' fine-grained FP8 config).
    config["quantization_config"] = {{"quant_method", "fp8"},
                                     {"fmt", "e4m3"},
                                     {"activation_scheme", "dynamic"},
                                     {"weight_block_size", {kFp8Block, kFp8Block}}};
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
