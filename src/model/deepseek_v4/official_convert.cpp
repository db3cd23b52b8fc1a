#include "model/deepseek_v4/official_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "format/safetensors_writer.h"
#include "model/convert.h"
#include "model/deepseek_v4/official_names.h"
#include "tensor/quant/minifloat.h"
#include "util/progress.h"

namespace fs {
namespace {

constexpr std::int64_t kFp8Block = 128;
constexpr std::int64_t kFp4Block = 32;
constexpr float kE4m3Max = 448.0f;
constexpr float kE2m1Max = 6.0f;

// The E8M0 byte of the power of two 2^ceil(log2(amax / max_code)): the smallest scale that
// brings the block within the element type's range. 127 (scale 1) for an all-zero block.
std::uint8_t e8m0_scale_for(float amax, float max_code) {
  if (!(amax > 0)) return 127;
  int e = 0;
  const float m = std::frexp(amax / max_code, &e);  // amax / max = m 2^e, m in [0.5, 1)
  const int exponent = m == 0.5f ? e - 1 : e;       // ceil(log2(.)), exact powers stay
  return static_cast<std::uint8_t>(std::clamp(exponent + 127, 0, 254));
}

std::vector<float> widened(const TensorView& v) {
  std::vector<float> f(static_cast<std::size_t>(v.numel()));
  convert_to_f32(v.dtype, v.bytes.data(), f.data(), f.size());
  return f;
}

struct Quantised {
  std::vector<std::uint8_t> codes, scales;
  Shape code_shape, scale_shape;
};

// A [rows, cols] matrix to F8_E4M3 with an E8M0 scale per 128x128 block.
Quantised fp8_blocks(const float* w, std::int64_t rows, std::int64_t cols) {
  const auto br = (rows + kFp8Block - 1) / kFp8Block, bc = (cols + kFp8Block - 1) / kFp8Block;
  Quantised q;
  q.codes.resize(static_cast<std::size_t>(rows * cols));
  q.scales.resize(static_cast<std::size_t>(br * bc));
  q.code_shape = {rows, cols};
  q.scale_shape = {br, bc};
  for (std::int64_t bi = 0; bi < br; ++bi) {
    for (std::int64_t bj = 0; bj < bc; ++bj) {
      const auto r1 = std::min(rows, (bi + 1) * kFp8Block);
      const auto c1 = std::min(cols, (bj + 1) * kFp8Block);
      float amax = 0;
      for (auto r = bi * kFp8Block; r < r1; ++r)
        for (auto c = bj * kFp8Block; c < c1; ++c)
          amax = std::max(amax, std::fabs(w[r * cols + c]));
      const auto e = e8m0_scale_for(amax, kE4m3Max);
      q.scales[static_cast<std::size_t>(bi * bc + bj)] = e;
      const float scale = quant::e8m0_to_f32(e);
      for (auto r = bi * kFp8Block; r < r1; ++r)
        for (auto c = bj * kFp8Block; c < c1; ++c)
          q.codes[static_cast<std::size_t>(r * cols + c)] =
              quant::f32_to_e4m3_saturate(w[r * cols + c] / scale);
    }
  }
  return q;
}

// A [rows, cols] matrix to FP4 E2M1 (two codes a byte, the first in the low nibble) with an
// E8M0 scale per 32 inputs of a row.
Quantised fp4_rows(const float* w, std::int64_t rows, std::int64_t cols) {
  Quantised q;
  const auto groups = cols / kFp4Block;
  q.codes.resize(static_cast<std::size_t>(rows * cols / 2));
  q.scales.resize(static_cast<std::size_t>(rows * groups));
  q.code_shape = {rows, cols / 2};
  q.scale_shape = {rows, groups};
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      const float* x = w + r * cols + g * kFp4Block;
      float amax = 0;
      for (std::int64_t i = 0; i < kFp4Block; ++i) amax = std::max(amax, std::fabs(x[i]));
      const auto e = e8m0_scale_for(amax, kE2m1Max);
      q.scales[static_cast<std::size_t>(r * groups + g)] = e;
      const float scale = quant::e8m0_to_f32(e);
      std::uint8_t* out = q.codes.data() + (r * cols + g * kFp4Block) / 2;
      for (std::int64_t i = 0; i < kFp4Block; i += 2) {
        const auto lo = quant::f32_to_e2m1(x[i] / scale);
        const auto hi = quant::f32_to_e2m1(x[i + 1] / scale);
        out[i / 2] = static_cast<std::uint8_t>((lo & 0xf) | (hi << 4));
      }
    }
  }
  return q;
}

// The release keeps these projections in BF16 (HF _keep_in_fp32_modules of DeepseekV4).
bool kept_in_float(const std::string& hf) {
  for (const char* s :
       {"self_attn.compressor.kv_proj.weight", "self_attn.compressor.gate_proj.weight",
        "compressor.indexer.kv_proj.weight", "compressor.indexer.gate_proj.weight",
        "compressor.indexer.scorer.weights_proj.weight"})
    if (hf.ends_with(s)) return true;
  return false;
}

std::vector<std::uint8_t> float_bytes(const TensorView& v, std::optional<DType> to) {
  if (!dtype_is_float(v.dtype) || !to || *to == v.dtype) return {v.bytes.begin(), v.bytes.end()};
  const auto f = widened(v);
  std::vector<std::uint8_t> out(f.size() * dtype_size(*to));
  if (*to == DType::kF32) {
    std::memcpy(out.data(), f.data(), out.size());
  } else {
    for (std::size_t i = 0; i < f.size(); ++i) {
      const auto h = f32_to_bf16(f[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

constexpr std::string_view kGateUp = "mlp.experts.gate_up_proj";
constexpr std::string_view kDown = "mlp.experts.down_proj";

}  // namespace

Status convert_deepseek_v4_official(const Checkpoint& ck, nlohmann::json& config,
                                    const std::string& out_dir, std::optional<DType> dtype) {
  if (config.value("model_type", std::string()) != "deepseek_v4")
    return invalid_argument("convert --quantize fp4: the official FP4 layout is DeepSeek V4's; " +
                            config.value("model_type", std::string("this model")) + " has none");
  if (deepseek_v4_official_names(ck))
    return invalid_argument("convert --quantize fp4: the folder is already in the official layout");
  // Each tensor's bytes, owned apart so that the spans `out` holds stay valid until written.
  std::vector<std::unique_ptr<std::vector<std::uint8_t>>> keep;
  std::vector<TensorToWrite> out;
  auto add = [&](std::string name, DType t, Shape shape, std::vector<std::uint8_t> bytes) {
    keep.push_back(std::make_unique<std::vector<std::uint8_t>>(std::move(bytes)));
    out.push_back({std::move(name), t, std::move(shape), *keep.back()});
  };
  auto add_quantised = [&](const std::string& weight_name, DType code_dtype, Quantised q) {
    add(weight_name + ".weight", code_dtype, q.code_shape, std::move(q.codes));
    add(weight_name + ".scale", DType::kF8E8M0, q.scale_shape, std::move(q.scales));
  };
  const std::int64_t group_rows = config.value("o_lora_rank", std::int64_t{0});
  std::uint64_t total = 0;
  for (const auto& [name, stored] : ck.tensors()) total += ck.view(name)->bytes.size();
  ProgressMeter meter("convert to the official FP4 layout", total);
  for (const auto& [name, stored] : ck.tensors()) {
    const auto v = *ck.view(name);
    meter.add(v.bytes.size());
    if (name.ends_with(kGateUp) || name.ends_with(kDown)) {
      // [E, out, in] -> per expert: gate_up's first half of rows is w1 (gate), the rest w3 (up).
      const bool gate_up = name.ends_with(kGateUp);
      const auto prefix = name.substr(0, name.size() - (gate_up ? kGateUp : kDown).size());
      if (!dtype_is_float(v.dtype) || v.shape.size() != 3)
        return invalid_argument("convert --quantize fp4: " + name + " is not a float [E, out, in]");
      const auto E = v.dim(0), rows = v.dim(1), cols = v.dim(2);
      if (cols % kFp4Block != 0 || (gate_up && rows % 2 != 0))
        return invalid_argument("convert --quantize fp4: " + name + " " + shape_to_string(v.shape) +
                                ": FP4 rows need a multiple of 32 inputs");
      const auto f = widened(v);
      for (std::int64_t e = 0; e < E; ++e) {
        const float* m = f.data() + e * rows * cols;
        if (gate_up) {
          const auto I = rows / 2;
          add_quantised(official_expert_name(prefix, e, DsExpertProjection::kGate), DType::kI8,
                        fp4_rows(m, I, cols));
          add_quantised(official_expert_name(prefix, e, DsExpertProjection::kUp), DType::kI8,
                        fp4_rows(m + I * cols, I, cols));
        } else {
          add_quantised(official_expert_name(prefix, e, DsExpertProjection::kDown), DType::kI8,
                        fp4_rows(m, rows, cols));
        }
      }
      continue;
    }
    const auto official = deepseek_v4_official_name(name);
    if (!official)
      return invalid_argument("convert --quantize fp4: tensor " + name +
                              " has no name in the official layout");
    if (dtype_is_float(v.dtype) && v.shape.size() == 2 && fp8_quantises(name, 2) &&
        !kept_in_float(name) && fp8_blocks_fit_groups(name, group_rows)) {
      const auto f = widened(v);
      const auto base = official->substr(0, official->size() - std::string(".weight").size());
      add_quantised(base, DType::kF8E4M3, fp8_blocks(f.data(), v.dim(0), v.dim(1)));
      continue;
    }
    add(*official, dtype_is_float(v.dtype) && dtype ? *dtype : v.dtype, v.shape,
        float_bytes(v, dtype));
  }
  // The fields of the release's config (transformers' fine-grained FP8 with E8M0 scales).
  config["quantization_config"] = {{"quant_method", "fp8"},
                                   {"fmt", "e4m3"},
                                   {"scale_fmt", "ue8m0"},
                                   {"activation_scheme", "dynamic"},
                                   {"weight_block_size", {kFp8Block, kFp8Block}}};
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
