// Known answers from implementations that are not ours:
// - ggml (tests/fixtures/quant/ggml_known_answers.safetensors, tools/quant/README.md): blocks
//   quantised by ggml's quantisers and random blocks, with ggml's own dequantisation. Ours must
//   equal it bit for bit.
// - the OCP definitions in exact arithmetic (definition_known_answers.safetensors) and PyTorch's
//   float8 types on the GPU machine (torch_known_answers.safetensors, once the lead has run
//   tools/quant/torch_known_answers.py there): E4M3/E8M0/E2M1 decode and encode, and the
//   block-scaled FP8/FP4 layouts. Bitwise too; NaN matches any NaN (payloads are not part of
//   the formats' values).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "gguf_test_writer.h"
#include "tensor/quant/block_scaled.h"
#include "tensor/quant/dequantize.h"
#include "tensor/quant/minifloat.h"
#include "tensor/quant/quant_type.h"
#include "test_support.h"

namespace fs::quant {
namespace {

const std::string kDir = QUANT_FIXTURES;

std::vector<float> floats(const TensorView& v) {
  std::vector<float> out(v.bytes.size() / 4);
  std::memcpy(out.data(), v.bytes.data(), out.size() * 4);
  return out;
}

std::uint32_t bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Counts the elements that differ bitwise (NaN equal to NaN) and reports the first.
::testing::AssertionResult same_floats(const std::vector<float>& got,
                                       const std::vector<float>& want) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool same = (std::isnan(got[i]) && std::isnan(want[i])) || bits(got[i]) == bits(want[i]);
    if (!same && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.size() << " differ; first at "
                                       << first << ": " << got[first] << " vs " << want[first];
}

class GgmlKnownAnswers : public ::testing::TestWithParam<const char*> {
 protected:
  static void SetUpTestSuite() {
    auto f = SafetensorsFile::open(kDir + "/ggml_known_answers.safetensors");
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    file_ = new SafetensorsFile(std::move(f).value());
  }
  static void TearDownTestSuite() {
    delete file_;
    file_ = nullptr;
  }
  static SafetensorsFile* file_;
};
SafetensorsFile* GgmlKnownAnswers::file_ = nullptr;

TEST_P(GgmlKnownAnswers, DequantisationEqualsGgmlBitwise) {
  const std::string name = GetParam();
  const auto type = quant_type_from_name(name);
  ASSERT_TRUE(type.has_value());
  for (const char* kind : {"quantized", "random"}) {
    SCOPED_TRACE(kind);
    const auto blocks = file_->view(name + "." + kind + ".blocks");
    const auto want = file_->view(name + "." + kind + ".f32");
    ASSERT_TRUE(blocks && want);
    const std::int64_t rows = want->dim(0), cols = want->dim(1);
    auto got = dequantize_tensor(*type, {rows, cols}, blocks->bytes);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(same_floats(*got, floats(*want)));
    // Row by row (the GEMV reference) gives the same.
    std::vector<float> row(static_cast<std::size_t>(cols));
    const auto all = floats(*want);
    for (std::int64_t r = 0; r < rows; ++r) {
      ASSERT_TRUE(dequantize_row(*type, blocks->bytes, cols, r, row).ok());
      EXPECT_TRUE(same_floats(
          row, std::vector<float>(all.begin() + r * cols, all.begin() + (r + 1) * cols)));
    }
  }
}

// The same blocks stored in a GGUF file: the reader's view of each tensor dequantises to ggml's
// answer (the reader's shape and byte span agree with the type's geometry).
TEST_P(GgmlKnownAnswers, ThroughAGgufFile) {
  const std::string name = GetParam();
  const auto type = quant_type_from_name(name);
  ASSERT_TRUE(type.has_value());
  const auto blocks = file_->view(name + ".random.blocks");
  const auto want = file_->view(name + ".random.f32");
  ASSERT_TRUE(blocks && want);
  test::GgufBuilder b;
  b.tensor({"blk.0.ffn_down_exps.weight",
            static_cast<std::uint32_t>(quant_info(*type).ggml_id),
            {static_cast<std::uint64_t>(want->dim(1)), static_cast<std::uint64_t>(want->dim(0))},
            std::vector<std::uint8_t>(blocks->bytes.begin(), blocks->bytes.end()),
            std::nullopt});
  test::ScratchDir dir;
  test::write_bytes(dir.file("t.gguf"), b.build());
  auto m = GgufModel::open(dir.file("t.gguf"));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const auto v = m->view("blk.0.ffn_down_exps.weight");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->type, *type);
  auto got = dequantize_tensor(v->type, v->shape, v->bytes);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_TRUE(same_floats(*got, floats(*want)));
}

INSTANTIATE_TEST_SUITE_P(Types, GgmlKnownAnswers,
                         ::testing::Values("F16", "BF16", "Q8_0", "Q2_K", "Q4_K", "Q5_K", "Q6_K",
                                           "IQ2_XXS"));

TEST(GgmlGeometry, TableAgreesWithGgmlTypeTraits) {
  auto f = SafetensorsFile::open(kDir + "/ggml_known_answers.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  std::istringstream in(f->metadata().at("ggml_geometry"));
  std::string entry;
  int checked = 0;
  while (std::getline(in, entry, ';')) {
    std::istringstream e(entry);
    std::string name;
    int id = 0;
    std::int64_t elements = 0, bytes = 0;
    e >> name >> id >> elements >> bytes;
    const auto t = quant_type_from_ggml(static_cast<std::uint32_t>(id));
    ASSERT_TRUE(t.has_value()) << "ggml type " << name << " (" << id << ") is not in our table";
    EXPECT_EQ(quant_name(*t), name);
    EXPECT_EQ(quant_info(*t).block_elements, elements) << name;
    EXPECT_EQ(quant_info(*t).block_bytes, bytes) << name;
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

// One file of FP8/FP4 known answers (tools/quant/torch_known_answers.py).
void check_minifloat_answers(const std::string& path) {
  auto opened = SafetensorsFile::open(path);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  const SafetensorsFile& f = *opened;
  auto get = [&](const std::string& n) {
    auto v = f.view(n);
    EXPECT_TRUE(v.has_value()) << n;
    return *v;
  };
  auto decoded = [](int n, auto fn) {
    std::vector<float> out;
    for (int c = 0; c < n; ++c) out.push_back(fn(static_cast<std::uint8_t>(c)));
    return out;
  };
  EXPECT_TRUE(same_floats(decoded(256, e4m3_to_f32), floats(get("e4m3.decode")))) << "E4M3 decode";
  EXPECT_TRUE(same_floats(decoded(256, e8m0_to_f32), floats(get("e8m0.decode")))) << "E8M0 decode";
  EXPECT_TRUE(same_floats(decoded(16, e2m1_to_f32), floats(get("e2m1.decode")))) << "E2M1 decode";

  auto check_encode = [&](const std::string& n, auto fn) {
    const auto in = floats(get(n + ".input"));
    const auto want = get(n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (fn(in[i]) != want.bytes[i] && bad++ < 5)
        ADD_FAILURE() << n << "(" << in[i] << ") = " << int(fn(in[i])) << ", want "
                      << int(want.bytes[i]);
    }
    EXPECT_EQ(bad, 0u) << n;
  };
  check_encode("e4m3.encode", f32_to_e4m3);
  check_encode("e2m1.encode", f32_to_e2m1);

  const auto w = get("fp8.weights");
  for (const char* kind : {"scale_inv", "e8m0"}) {
    SCOPED_TRACE(kind);
    const bool f32_scales = std::string(kind) == "scale_inv";
    const auto s = get(f32_scales ? "fp8.scale_inv" : "fp8.scale_e8m0");
    ScaledMatrix m{QuantType::kF8E4M3,
                   w.dim(0),
                   w.dim(1),
                   w.bytes,
                   {f32_scales ? ScaleFormat::kF32 : ScaleFormat::kE8M0, 128, 128, s.bytes}};
    auto got = dequantize(m);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(same_floats(*got, floats(get(std::string("fp8_") + kind + ".dequant"))));
  }
  const auto w4 = get("fp4.weights");
  const auto s4 = get("fp4.scales");
  ScaledMatrix m4{QuantType::kF4E2M1x2,
                  w4.dim(0),
                  2 * w4.dim(1),
                  w4.bytes,
                  {ScaleFormat::kE8M0, 1, 32, s4.bytes}};
  auto got4 = dequantize(m4);
  ASSERT_TRUE(got4.ok()) << got4.status().to_string();
  EXPECT_TRUE(same_floats(*got4, floats(get("fp4.dequant"))));
}

TEST(MinifloatKnownAnswers, OcpDefinitions) {
  check_minifloat_answers(kDir + "/definition_known_answers.safetensors");
}

TEST(MinifloatKnownAnswers, PyTorch) {
  const std::string path = kDir + "/torch_known_answers.safetensors";
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << path << " is not there yet: run tools/quant/torch_known_answers.py --backend "
                 << "torch on a machine with PyTorch (tools/quant/README.md)";
  }
  check_minifloat_answers(path);
}

}  // namespace
}  // namespace fs::quant
