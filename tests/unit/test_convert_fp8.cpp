// `convert --quantize fp8` (issue 15): the embedded model's projections become F8_E4M3 with
// 128x128 f32 `_scale_inv` blocks, exactly the layout quant/block_scaled.h reads; every weight
// dequantises to within E4M3's rounding of the original; everything else is copied byte for byte;
// the loader accepts the result (tests/unit/test_qwen_fp8.cpp computes with it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/safetensors.h"
#include "model/convert.h"
#include "model/loader.h"
#include "tensor/quant/block_scaled.h"
#include "test_support.h"

namespace fs {
namespace {

const std::string kModel = std::string(FLASHSERVE_SOURCE_DIR) + "/models/qwen4-tiny-code";

TEST(ConvertFp8, ProjectionsBecomeBlockScaledE4m3WithinItsRounding) {
  test::ScratchDir dir;
  const auto out_dir = dir.file("fp8");
  ConvertOptions o;
  o.quantize_fp8 = true;
  ASSERT_TRUE(convert_checkpoint(kModel, out_dir, o).ok());
  auto in = Checkpoint::open(kModel);
  auto out = Checkpoint::open(out_dir);
  ASSERT_TRUE(in.ok() && out.ok());
  int quantised = 0, experts = 0, copied = 0;
  double worst = 0;  // max |dq - w| / (|w| 2^-4 + scale 2^-10): the E4M3 rounding bound
  for (const auto& [name, stored] : in->tensors()) {
    const auto v = *in->view(name);
    const auto q = out->view(name);
    ASSERT_TRUE(q.has_value()) << name;
    if (!fp8_quantises(stored.stored_name, v.shape.size())) {
      EXPECT_EQ(q->dtype, v.dtype) << name;
      ASSERT_EQ(q->bytes.size(), v.bytes.size()) << name;
      EXPECT_EQ(std::memcmp(q->bytes.data(), v.bytes.data(), v.bytes.size()), 0) << name;
      ++copied;
      continue;
    }
    ASSERT_EQ(q->dtype, DType::kF8E4M3) << name;
    ASSERT_EQ(q->shape, v.shape) << name;
    const auto s = out->view(name + "_scale_inv");
    ASSERT_TRUE(s.has_value()) << name;
    const auto rows = v.shape[v.shape.size() - 2], cols = v.shape.back();
    const auto br = (rows + 127) / 128, bc = (cols + 127) / 128;
    Shape want = v.shape;
    want[want.size() - 2] = br;
    want.back() = bc;
    ASSERT_EQ(s->shape, want) << name;
    ASSERT_EQ(s->dtype, DType::kF32);
    std::vector<float> w(static_cast<std::size_t>(v.numel()));
    convert_to_f32(v.dtype, v.bytes.data(), w.data(), w.size());
    const auto mats = v.numel() / (rows * cols);
    for (std::int64_t m = 0; m < mats; ++m) {
      quant::ScaledMatrix sm;
      sm.element = quant::QuantType::kF8E4M3;
      sm.rows = rows;
      sm.cols = cols;
      sm.weights = q->bytes.subspan(static_cast<std::size_t>(m * rows * cols),
                                    static_cast<std::size_t>(rows * cols));
      sm.scales.bytes = s->bytes.subspan(static_cast<std::size_t>(m * br * bc) * sizeof(float),
                                         static_cast<std::size_t>(br * bc) * sizeof(float));
      auto dq = quant::dequantize(sm);
      ASSERT_TRUE(dq.ok()) << name << ": " << dq.status().to_string();
      for (std::int64_t r = 0; r < rows; ++r) {
        for (std::int64_t c = 0; c < cols; ++c) {
          float scale;
          std::memcpy(&scale, s->bytes.data() + ((m * br + r / 128) * bc + c / 128) * sizeof(float),
                      sizeof scale);
          const double orig = w[static_cast<std::size_t>((m * rows + r) * cols + c)];
          const double got = (*dq)[static_cast<std::size_t>(r * cols + c)];
          const double bound = std::fabs(orig) / 16 + scale / 1024.0 + 1e-7 * std::fabs(orig);
          worst = std::max(worst, std::fabs(got - orig) / bound);
        }
      }
    }
    ++quantised;
    experts += v.shape.size() == 3;
  }
  std::printf(
      "%d tensors quantised (%d stacked experts), %d copied, worst error %.3f of the bound\n",
      quantised, experts, copied, worst);
  EXPECT_GT(quantised, 20);
  EXPECT_GT(experts, 0);
  EXPECT_GT(copied, 20);
  EXPECT_LE(worst, 1.0);
  EXPECT_GT(worst, 0.1);  // the rounding is really there: not a copy

  std::ifstream cf(out_dir + "/config.json");
  const auto config = nlohmann::json::parse(cf);
  ASSERT_TRUE(config.contains("quantization_config"));
  EXPECT_EQ(config["quantization_config"]["quant_method"], "fp8");
  EXPECT_EQ(config["quantization_config"]["weight_block_size"], nlohmann::json({128, 128}));

  // Loadable as published (test_qwen_fp8 computes with it).
  auto loaded = load_model(out_dir, {.backend = "cpu"});
  EXPECT_TRUE(loaded.ok()) << loaded.status().to_string();
}

}  // namespace
}  // namespace fs
