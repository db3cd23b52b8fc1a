// Products on quantised weights as stored (backend/weight.h, issue 15): FP8 E4M3 with E8M0
// 128x128 scales, FP4 E2M1 with E8M0 per-32 scales, and the GGUF block types.
// - The CPU (the reference): `linear`, `moe_experts` and `embedding` on a packed weight equal the
//   f32 op on the weight dequantised whole, bit for bit; on ggml's own blocks
//   (tests/fixtures/quant/ggml_known_answers.safetensors) they equal the f32 op on ggml's
//   dequantisation, so the whole chain answers to an independent implementation.
// - Every backend (QuantOps, instantiated Cpu/ and Cuda/: FLASHSERVE_TEST_BACKEND is not needed,
//   the Cuda/ cases skip without a GPU): the backend's op against the CPU's f32 op on the
//   dequantised weight, within the parity suite's product bound; and the formats an op cannot
//   read are refused with an error that names them.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/weight.h"
#include "format/safetensors.h"
#include "tensor/quant/quant_type.h"
#include "tensor/tensor.h"

namespace fs {
namespace {

using quant::QuantType;

// An f16's bits for 2^e * (1 + m/1024), e in the normal range.
std::uint16_t f16_bits(int e, int m) {
  return static_cast<std::uint16_t>(((e + 15) << 10) | (m & 1023));
}

// Where a GGUF type's f16 factors sit in its block, and the largest |scale * quant| they multiply
// (so that d = 1 / (span * sqrt(in)) keeps weights near the usual 1/sqrt(in)).
struct BlockFactors {
  std::vector<int> offsets;
  double span;
};
BlockFactors factors(QuantType t) {
  switch (t) {
    case QuantType::kQ8_0:
      return {{0}, 128};
    case QuantType::kQ2_K:
      return {{80, 82}, 45};
    case QuantType::kQ4_K:
      return {{0, 2}, 945};
    case QuantType::kQ5_K:
      return {{0, 2}, 1953};
    case QuantType::kQ6_K:
      return {{208}, 4096};
    case QuantType::kIQ2_XXS:
      return {{0}, 170};
    default:
      return {{}, 1};
  }
}

// A packed (or FP8 E8M0-scaled) weight in host memory: random codes, with finite factors of a
// size that keeps products O(1).
struct HostQuant {
  QuantType type = QuantType::kQ8_0;
  Shape shape;
  std::vector<std::uint8_t> bytes, scales;

  Weight view() const {
    Weight w{DType::kU8, shape, bytes.data()};
    if (type == QuantType::kF8E4M3) {
      w.dtype = DType::kF8E4M3;
      w.scales = {scales.data(), quant::ScaleFormat::kE8M0, 128, 128};
      return w;
    }
    w.packed = type;
    if (type == QuantType::kF4E2M1x2) w.scales = {scales.data(), quant::ScaleFormat::kE8M0, 1, 32};
    return w;
  }
  std::vector<float> dequantized() const {
    const Weight w = view();
    std::vector<float> out(static_cast<std::size_t>(w.numel()));
    for (std::int64_t r = 0; r < w.rows(); ++r) {
      auto st = w.dequantize_row(r, std::span(out).subspan(static_cast<std::size_t>(r * w.cols()),
                                                           static_cast<std::size_t>(w.cols())));
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    return out;
  }
};

HostQuant random_quant(QuantType t, Shape shape, std::mt19937& g) {
  HostQuant h{t, std::move(shape), {}, {}};
  const std::int64_t cols = h.shape.back();
  const std::int64_t rows = shape_numel(h.shape) / cols;
  const double target = 1.0 / std::sqrt(static_cast<double>(cols));
  std::uniform_int_distribution<int> byte(0, 255), mant(0, 1023), wobble(-1, 1);
  const auto e_for = [&](double v) { return static_cast<int>(std::floor(std::log2(v))); };
  if (t == QuantType::kF8E4M3) {
    h.bytes.resize(static_cast<std::size_t>(rows * cols));
    for (auto& b : h.bytes) {
      b = static_cast<std::uint8_t>(byte(g));
      if ((b & 0x7f) == 0x7f) b &= 0xfe;  // not NaN
    }
    const std::int64_t per = h.shape.size() == 3 ? h.shape[1] : rows;
    const std::int64_t matrices = rows / per;
    h.scales.resize(
        static_cast<std::size_t>(matrices * ((per + 127) / 128) * ((cols + 127) / 128)));
    for (auto& s : h.scales) s = static_cast<std::uint8_t>(127 + e_for(target / 448) + wobble(g));
    return h;
  }
  const auto& info = quant::quant_info(t);
  const auto per_row = static_cast<std::size_t>(cols / info.block_elements * info.block_bytes);
  h.bytes.resize(per_row * static_cast<std::size_t>(rows));
  for (auto& b : h.bytes) b = static_cast<std::uint8_t>(byte(g));
  if (t == QuantType::kF4E2M1x2) {
    h.scales.resize(static_cast<std::size_t>(rows * ((cols + 31) / 32)));
    for (auto& s : h.scales) s = static_cast<std::uint8_t>(127 + e_for(target / 6) + wobble(g));
    return h;
  }
  const auto f = factors(t);
  const int e = e_for(target / f.span);
  for (std::size_t b = 0; b < h.bytes.size(); b += static_cast<std::size_t>(info.block_bytes))
    for (const int off : f.offsets) {
      // f16 normals only (exponents -14..15): a smaller target just gives larger weights.
      const auto bits = f16_bits(std::clamp(e + wobble(g), -14, 15), mant(g));
      std::memcpy(&h.bytes[b + static_cast<std::size_t>(off)], &bits, 2);
    }
  return h;
}

Tensor random_x(Shape shape, std::mt19937& g) {
  Tensor t(std::move(shape));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] = d(g);
  return t;
}

// An f32 weight over `values` one byte off alignment, so the CPU's linear takes its tile path (as
// every decoded format does): both then run sgemm over the same tiles and agree bit for bit.
struct UnalignedF32 {
  std::vector<std::uint8_t> buf;
  Shape shape;
  UnalignedF32(const std::vector<float>& values, Shape s)
      : buf(values.size() * sizeof(float) + 1), shape(std::move(s)) {
    std::memcpy(buf.data() + 1, values.data(), values.size() * sizeof(float));
  }
  Weight view() const { return {DType::kF32, shape, buf.data() + 1}; }
};

Weight f32_view(const std::vector<float>& v, Shape shape) {
  return {DType::kF32, std::move(shape), reinterpret_cast<const std::uint8_t*>(v.data())};
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a.data()[i]) - b.data()[i]));
  return m;
}

std::pair<Tensor, Tensor> routing(std::int64_t S, std::int64_t E, std::int64_t k, std::mt19937& g) {
  Tensor ids(host_memory(), {S, k}, DType::kI32), w({S, k});
  std::vector<std::int32_t> all(static_cast<std::size_t>(E));
  for (std::int64_t s = 0; s < S; ++s) {
    for (std::int64_t e = 0; e < E; ++e) all[static_cast<std::size_t>(e)] = static_cast<int>(e);
    std::shuffle(all.begin(), all.end(), g);
    for (std::int64_t j = 0; j < k; ++j) {
      ids.data_as<std::int32_t>()[s * k + j] = all[static_cast<std::size_t>(j)];
      w.data()[s * k + j] = 1.0f / static_cast<float>(k + j);
    }
  }
  return {std::move(ids), std::move(w)};
}

const std::vector<QuantType> kPackedTypes = {
    QuantType::kQ8_0, QuantType::kQ2_K,    QuantType::kQ4_K,    QuantType::kQ5_K,
    QuantType::kQ6_K, QuantType::kIQ2_XXS, QuantType::kF4E2M1x2};

// ---------------------------------------------------------------------------------------------
// The CPU against the dequantised f32 ops.

TEST(CpuQuantOps, LinearEqualsDequantisedF32BitForBit) {
  auto be = make_cpu_backend();
  std::mt19937 g(21);
  std::vector<QuantType> types = kPackedTypes;
  types.push_back(QuantType::kF8E4M3);
  for (const auto t : types) {
    for (const auto& [S, in, out] :
         std::vector<std::array<std::int64_t, 3>>{{1, 512, 300}, {70, 256, 130}}) {
      SCOPED_TRACE(std::string(quant::quant_name(t)) + " S " + std::to_string(S) + " in " +
                   std::to_string(in) + " out " + std::to_string(out));
      const auto w = random_quant(t, {out, in}, g);
      auto up = be->upload(w.view(), DType::kBF16);
      ASSERT_TRUE(up.ok()) << up.status().to_string();
      EXPECT_EQ(up->data, w.bytes.data()) << "the CPU computes on the stored bytes in place";
      EXPECT_EQ(up->storage(), t);
      const UnalignedF32 ref(w.dequantized(), {out, in});
      const auto x = random_x({S, in}, g);
      Tensor yq, yf;
      be->linear(x, *up, yq);
      be->linear(x, ref.view(), yf);
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      EXPECT_TRUE(same_bits(yq, yf)) << "max |d| " << max_abs_diff(yq, yf);
      // A prefix of the rows (first_rows) is the same product's first columns.
      Tensor yn, yfn;
      be->linear(x, up->first_rows(7), yn);
      be->linear(x, ref.view().first_rows(7), yfn);
      EXPECT_TRUE(same_bits(yn, yfn));
    }
  }
}

TEST(CpuQuantOps, MoeExpertsAndEmbeddingEqualDequantisedF32) {
  auto be = make_cpu_backend();
  std::mt19937 g(22);
  const std::int64_t H = 256, I = 256, E = 5, S = 6, k = 2;
  for (const auto t : {QuantType::kF4E2M1x2, QuantType::kQ4_K, QuantType::kQ8_0,
                       QuantType::kIQ2_XXS, QuantType::kF8E4M3}) {
    SCOPED_TRACE(std::string(quant::quant_name(t)));
    const auto gate_up = random_quant(t, {E, 2 * I, H}, g);
    const auto down = random_quant(t, {E, H, I}, g);
    const auto gu = gate_up.dequantized(), dn = down.dequantized();
    const auto x = random_x({S, H}, g);
    auto [experts, weights] = routing(S, E, k, g);
    Tensor yq, yf;
    be->moe_experts(x, gate_up.view(), down.view(), experts, weights, 7.0f, yq);
    const UnalignedF32 guf(gu, {E, 2 * I, H}), dnf(dn, {E, H, I});
    be->moe_experts(x, guf.view(), dnf.view(), experts, weights, 7.0f, yf);
    ASSERT_TRUE(be->status().ok()) << be->status().to_string();
    EXPECT_TRUE(same_bits(yq, yf)) << "max |d| " << max_abs_diff(yq, yf);
    // expert(e) addresses expert e's rows (and scales): its row 3 is the stacked row E*2I + 3.
    std::vector<float> row(static_cast<std::size_t>(H));
    ASSERT_TRUE(gate_up.view().expert(4).dequantize_row(3, row).ok());
    EXPECT_EQ(std::memcmp(row.data(), gu.data() + (4 * 2 * I + 3) * H, row.size() * sizeof(float)),
              0);
    // embedding: rows of a packed table (two row shards) are its dequantised rows.
    const auto table = random_quant(t, {12, H}, g);
    const auto dq = table.dequantized();
    const Weight full = table.view();
    Weight shards[2] = {full.first_rows(6), full.first_rows(6)};
    shards[1].data += 6 * full.row_bytes();
    if (full.block_scaled()) shards[1].scales.data += full.scales.grid_bytes(6, H);
    if (t == QuantType::kF8E4M3) continue;  // 128-row scale blocks do not split at row 6
    const std::vector<std::int64_t> ids = {11, 0, 6, 5};
    Tensor emb;
    be->embedding(shards, ids, emb);
    ASSERT_TRUE(be->status().ok()) << be->status().to_string();
    for (std::size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(std::memcmp(emb.row(static_cast<std::int64_t>(i)), dq.data() + ids[i] * H,
                            static_cast<std::size_t>(H) * 4),
                0)
          << "id " << ids[i];
  }
}

// ggml's own blocks (quantised by ggml) as a weight: the CPU's product equals the f32 product on
// ggml's dequantisation of them, bit for bit.
TEST(CpuQuantOps, LinearOnGgmlBlocksEqualsGgmlDequantisation) {
  auto f = SafetensorsFile::open(std::string(QUANT_FIXTURES) + "/ggml_known_answers.safetensors");
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto be = make_cpu_backend();
  std::mt19937 g(23);
  for (const auto t : {QuantType::kQ8_0, QuantType::kQ2_K, QuantType::kQ4_K, QuantType::kQ5_K,
                       QuantType::kQ6_K, QuantType::kIQ2_XXS}) {
    const std::string name(quant::quant_name(t));
    SCOPED_TRACE(name);
    const auto blocks = f->view(name + ".quantized.blocks");
    const auto want = f->view(name + ".quantized.f32");
    ASSERT_TRUE(blocks && want);
    const std::int64_t rows = want->dim(0), cols = want->dim(1);
    Weight w{DType::kU8, {rows, cols}, blocks->bytes.data()};
    w.packed = t;
    ASSERT_TRUE(w.check_storage().ok()) << w.check_storage().to_string();
    ASSERT_EQ(w.bytes(), blocks->bytes.size());
    std::vector<float> answer(static_cast<std::size_t>(rows * cols));
    std::memcpy(answer.data(), want->bytes.data(), answer.size() * 4);
    const UnalignedF32 ref(answer, {rows, cols});
    const auto x = random_x({3, cols}, g);
    Tensor yq, yf;
    be->linear(x, w, yq);
    be->linear(x, ref.view(), yf);
    ASSERT_TRUE(be->status().ok()) << be->status().to_string();
    EXPECT_TRUE(same_bits(yq, yf)) << "max |d| " << max_abs_diff(yq, yf);
  }
}

TEST(CpuQuantOps, FormatsAreNamedAndCheckedAgainstTheirShape) {
  std::mt19937 g(24);
  const auto q4 = random_quant(QuantType::kQ4_K, {4, 512}, g);
  EXPECT_EQ(q4.view().format_name(), "Q4_K");
  EXPECT_EQ(q4.view().dtype, DType::kU8);
  EXPECT_EQ(q4.view().bytes(), 4u * 2 * 144);
  const auto fp4 = random_quant(QuantType::kF4E2M1x2, {4, 64}, g);
  EXPECT_EQ(fp4.view().format_name(), "F4_E2M1 with 1x32 E8M0 scales");
  EXPECT_EQ(fp4.view().bytes(), 4u * 32);
  EXPECT_EQ(fp4.view().scale_bytes(), 4u * 2);
  const auto fp8 = random_quant(QuantType::kF8E4M3, {130, 200}, g);
  EXPECT_EQ(fp8.view().format_name(), "F8_E4M3 with 128x128 E8M0 scales");
  EXPECT_EQ(fp8.view().scale_at(129, 199), std::ldexp(1.0f, fp8.scales[3] - 127));
  // A Q4_K row must be whole 256-weight blocks; FP4 needs its scales.
  Weight bad = q4.view();
  bad.shape = {8, 256 + 32};
  EXPECT_NE(bad.check_storage().to_string().find("Q4_K"), std::string::npos);
  Weight bare = fp4.view();
  bare.scales = {};
  EXPECT_NE(bare.check_storage().to_string().find("no scales"), std::string::npos);
  auto be = make_cpu_backend();
  Weight vec = q4.view();
  vec.shape = {512};
  auto up = be->upload(vec, DType::kF32);
  ASSERT_FALSE(up.ok());
  EXPECT_NE(up.status().to_string().find("Q4_K"), std::string::npos) << up.status().to_string();
}

// ---------------------------------------------------------------------------------------------
// Every backend against the CPU's f32 ops on the dequantised weights.

std::unique_ptr<Backend> backend_named(const std::string& name, std::string* why) {
  if (name == "cpu") return make_cpu_backend();
  if (!cuda_available()) {
    *why = "no CUDA device: this build has no CUDA backend or the machine has no GPU";
    return nullptr;
  }
  auto be = make_cuda_backend();
  if (!be.ok()) {
    *why = "no CUDA device: " + be.status().to_string();
    return nullptr;
  }
  return std::move(*be);
}

// The parity suite's bound for products: max |got - ref| / max(1, max |ref|).
constexpr double kProduct = 1e-4;

::testing::AssertionResult close(const Tensor& got, const Tensor& ref) {
  if (got.shape() != ref.shape()) return ::testing::AssertionFailure() << "shapes differ";
  const auto g = got.to_host_vector();
  double max_ref = 0, max_err = 0;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    if (std::isnan(g[static_cast<std::size_t>(i)]))
      return ::testing::AssertionFailure() << "NaN at " << i;
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref.data()[i])));
    max_err = std::max(
        max_err, std::fabs(static_cast<double>(g[static_cast<std::size_t>(i)]) - ref.data()[i]));
  }
  const double err = max_err / std::max(1.0, max_ref);
  if (err <= kProduct) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "normalised max error " << err;
}

class QuantOps : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be_ = backend_named(GetParam(), &why);
    if (!be_) GTEST_SKIP() << why;
  }
  Weight up(const HostQuant& h) {
    auto w = be_->upload(h.view(), DType::kBF16);
    EXPECT_TRUE(w.ok()) << be_->name() << " upload: " << w.status().to_string();
    EXPECT_TRUE(!w.ok() || w->is_packed() == h.view().is_packed()) << "upload changed the format";
    return w.ok() ? *w : Weight{};
  }
  // The backend's linear on a random [out, in] weight of type t against the CPU's f32 linear on
  // the weight dequantised, within the product bound.
  void expect_linear_matches(QuantType t, std::int64_t S, std::int64_t in, std::int64_t out,
                             std::mt19937& g) {
    const auto w = random_quant(t, {out, in}, g);
    const auto dq = w.dequantized();
    const auto x = random_x({S, in}, g);
    Tensor ref, y;
    cpu_->linear(x, f32_view(dq, {out, in}), ref);
    be_->linear(x.to(be_->memory()), up(w), y);
    be_->synchronize();
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
    EXPECT_TRUE(close(y, ref));
  }
  // The same for moe_experts: E experts with gate_up [E, 2I, H] of type tg and down [E, H, I] of
  // type td, S tokens routed to k each, the SwiGLU clamped at 7.
  void expect_moe_matches(QuantType tg, QuantType td, std::int64_t S, std::int64_t E,
                          std::int64_t k, std::int64_t H, std::int64_t I, std::mt19937& g) {
    const auto gate_up = random_quant(tg, {E, 2 * I, H}, g);
    const auto down = random_quant(td, {E, H, I}, g);
    const auto gu = gate_up.dequantized(), dn = down.dequantized();
    const auto x = random_x({S, H}, g);
    auto [experts, weights] = routing(S, E, k, g);
    Tensor ref, y;
    cpu_->moe_experts(x, f32_view(gu, {E, 2 * I, H}), f32_view(dn, {E, H, I}), experts, weights,
                      7.0f, ref);
    be_->moe_experts(x.to(be_->memory()), up(gate_up), up(down), experts.to(be_->memory()),
                     weights.to(be_->memory()), 7.0f, y);
    be_->synchronize();
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
    EXPECT_TRUE(close(y, ref));
  }
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Backend> cpu_ = make_cpu_backend();
};

// The formats the CUDA kernels decode: all of them.
const std::vector<QuantType> kDeviceTypes = {
    QuantType::kF4E2M1x2, QuantType::kF8E4M3, QuantType::kQ8_0, QuantType::kQ4_K,
    QuantType::kQ6_K,     QuantType::kQ5_K,   QuantType::kQ2_K, QuantType::kIQ2_XXS};

// The GEMV at 1-4 rows (8-lane groups for short rows, warps for long ones) and the dequantised
// tiles + sgemm beyond.
TEST_P(QuantOps, LinearMatchesDequantisedF32) {
  std::mt19937 g(31);
  for (const auto t : kDeviceTypes)
    for (const auto& [S, in, out] : std::vector<std::array<std::int64_t, 3>>{
             {1, 2560, 1000}, {4, 512, 300}, {2, 8192, 64}, {3, 1024, 257}, {9, 512, 300}}) {
      SCOPED_TRACE(std::string(quant::quant_name(t)) + " S " + std::to_string(S) + " in " +
                   std::to_string(in) + " out " + std::to_string(out));
      expect_linear_matches(t, S, in, out, g);
    }
}

// The pair path on packed experts (a token's routed experts only), FP8 E8M0 through the FP8
// kernels (its scales widened at upload), with the clamped SwiGLU.
TEST_P(QuantOps, MoeExpertsMatchDequantisedF32) {
  std::mt19937 g(32);
  const std::int64_t E = 8, k = 3;
  for (const auto t : {QuantType::kF4E2M1x2, QuantType::kQ4_K, QuantType::kQ8_0, QuantType::kQ6_K,
                       QuantType::kQ2_K, QuantType::kIQ2_XXS, QuantType::kF8E4M3})
    for (const auto& [S, H, I] :
         std::vector<std::array<std::int64_t, 3>>{{1, 512, 256}, {3, 256, 512}}) {
      SCOPED_TRACE(std::string(quant::quant_name(t)) + " S " + std::to_string(S));
      expect_moe_matches(t, t, S, E, k, H, I, g);
    }
}

// The packed GEMVs and the routed-expert pair kernels of 1-4 tokens (decode, an MTP verify) give
// each token the bits it gets alone: greedy MTP on packed weights equals autoregressive decoding
// only while they do. 2,560 -> 10,240 takes x staged past 48 KB at four tokens for the formats of
// 64-weight chunks (Q4_K, Q5_K, Q6_K: rows padded to 64 chunks a warp), and unstaged where a
// launch cannot have it; either way the same sums.
TEST_P(QuantOps, PackedDecodeTokensGetTheirOneTokenBits) {
  if (GetParam() != "cuda") GTEST_SKIP() << "a property of the CUDA kernels";
  std::mt19937 g(38);
  const auto alone = [&](const Tensor& x, std::int64_t s) {
    Tensor row({1, x.cols()});
    std::memcpy(row.data(), x.data() + s * x.cols(), static_cast<std::size_t>(x.cols()) * 4);
    return row;
  };
  for (const auto t : kDeviceTypes) {
    if (t == QuantType::kF8E4M3) continue;
    SCOPED_TRACE(std::string(quant::quant_name(t)));
    const std::int64_t in = 2560, out = 10240;
    const auto w = random_quant(t, {out, in}, g);
    const Weight wd = up(w);
    const auto x = random_x({4, in}, g);
    std::vector<std::vector<float>> one(4);
    for (std::int64_t s = 0; s < 4; ++s) {
      Tensor y1;
      be_->linear(alone(x, s).to(be_->memory()), wd, y1);
      one[static_cast<std::size_t>(s)] = y1.to_host_vector();
    }
    for (std::int64_t S = 2; S <= 4; ++S) {
      Tensor xs({S, in});
      std::memcpy(xs.data(), x.data(), static_cast<std::size_t>(S * in) * 4);
      Tensor y;
      be_->linear(xs.to(be_->memory()), wd, y);
      const auto all = y.to_host_vector();
      for (std::int64_t s = 0; s < S; ++s)
        EXPECT_EQ(std::memcmp(one[static_cast<std::size_t>(s)].data(), all.data() + s * out,
                              static_cast<std::size_t>(out) * sizeof(float)),
                  0)
            << "token " << s << " of " << S << " differs from its one-token product";
    }
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
  }
  // The routed experts: 3 tokens' 3 of 8 experts, gate/up in Q4_K and down in Q6_K, then both in
  // IQ2_XXS.
  for (const auto& [tg, td] : std::vector<std::pair<QuantType, QuantType>>{
           {QuantType::kQ4_K, QuantType::kQ6_K}, {QuantType::kIQ2_XXS, QuantType::kIQ2_XXS}}) {
    SCOPED_TRACE(std::string(quant::quant_name(tg)) + " / " + std::string(quant::quant_name(td)));
    const std::int64_t E = 8, k = 3, S = 3, H = 512, I = 512;
    const auto gate_up = random_quant(tg, {E, 2 * I, H}, g);
    const auto down = random_quant(td, {E, H, I}, g);
    const Weight gu = up(gate_up), dn = up(down);
    const auto x = random_x({S, H}, g);
    auto [experts, weights] = routing(S, E, k, g);
    Tensor y;
    be_->moe_experts(x.to(be_->memory()), gu, dn, experts.to(be_->memory()),
                     weights.to(be_->memory()), 7.0f, y);
    const auto all = y.to_host_vector();
    for (std::int64_t s = 0; s < S; ++s) {
      Tensor ids(host_memory(), {1, k}, DType::kI32);
      std::memcpy(ids.raw(), experts.data_as<std::int32_t>() + s * k,
                  static_cast<std::size_t>(k) * 4);
      Tensor y1;
      be_->moe_experts(alone(x, s).to(be_->memory()), gu, dn, ids.to(be_->memory()),
                       alone(weights, s).to(be_->memory()), 7.0f, y1);
      const auto one = y1.to_host_vector();
      EXPECT_EQ(std::memcmp(one.data(), all.data() + s * H, one.size() * sizeof(float)), 0)
          << "token " << s << " of 3 differs from its one-token experts";
    }
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
  }
}

// The one-token packed GEMV with its rows streamed through resident warps (the default since
// session 32: the next row's loads before the current row's decoding) gives
// every row the bits of the kernel that takes one row a warp, so a decode step and an MTP verify
// (whose 2-4 tokens take that kernel's sums, the test above) still agree. Rows of 1-4 rounds of a
// warp's chunks (2,560 to 8,192 wide), row counts off the grid's warps, and 6,144 columns of the
// 32-weight formats (six rounds: the one-row kernel either way).
TEST_P(QuantOps, StreamedPackedRowsGiveTheOneRowAWarpBits) {
  if (GetParam() != "cuda") GTEST_SKIP() << "a property of the CUDA kernels";
  for (const char* v : {"FLASHSERVE_CUDA_PACKED_STREAM", "FLASHSERVE_CUDA_FP8_EXPERT_STREAM",
                        "FLASHSERVE_CUDA_PACKED_TAIL", "FLASHSERVE_CUDA_PACKED_TAIL_ROWS",
                        "FLASHSERVE_CUDA_PACKED_STREAM_TOKENS"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << "a streaming switch is set: " << v;
  std::mt19937 g(39);
  // The streamed forms against one row a warp: rows streamed one at a time (PACKED_TAIL=0), and
  // where a row is one round and a quarter (2,560 columns of a 64-weight format, 1,280 of a
  // 32-weight one) two or three rows sharing their last round, with row counts that leave a
  // short last group.
  const std::vector<std::array<const char*, 2>> forms = {{"FLASHSERVE_CUDA_PACKED_TAIL", "0"},
                                                         {"FLASHSERVE_CUDA_PACKED_TAIL_ROWS", "2"},
                                                         {"FLASHSERVE_CUDA_PACKED_TAIL_ROWS", "3"}};
  for (const auto t : kDeviceTypes) {
    if (t == QuantType::kF8E4M3) continue;
    for (const auto& [in, out] : std::vector<std::array<std::int64_t, 2>>{{2560, 10240},
                                                                          {2560, 301},
                                                                          {1280, 77},
                                                                          {4096, 300},
                                                                          {6144, 2560},
                                                                          {8192, 77},
                                                                          {2048, 4099}}) {
      const Weight wd = up(random_quant(t, {out, in}, g));
      const Tensor x = random_x({1, in}, g).to(be_->memory());
      Tensor one_row_a_warp;
      setenv("FLASHSERVE_CUDA_PACKED_STREAM", "0", 1);
      be_->linear(x, wd, one_row_a_warp);
      unsetenv("FLASHSERVE_CUDA_PACKED_STREAM");
      const auto b = one_row_a_warp.to_host_vector();
      for (const auto& [var, value] : forms) {
        SCOPED_TRACE(std::string(quant::quant_name(t)) + " in " + std::to_string(in) + " out " +
                     std::to_string(out) + " " + var + "=" + value);
        Tensor streamed;
        setenv(var, value, 1);
        be_->linear(x, wd, streamed);
        unsetenv(var);
        ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
        const auto a = streamed.to_host_vector();
        ASSERT_EQ(a.size(), static_cast<std::size_t>(out));
        ASSERT_EQ(b.size(), a.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      }
    }
  }
  // The routed experts' gate/up (the streamed (pair, row) items): Qwen 3.8's shape (10 of 32
  // experts here, H 2560, I 640) and a DeepSeek V4-like one (H 4096), with a pair routed nowhere
  // (-1); FP8 E4M3 experts too (their own kernel). One token, and an MTP verify's 3 (session 37:
  // each token's x staged as its one-token x, past 48 KB for Q4_K at 2,560).
  for (const auto t : {QuantType::kQ4_K, QuantType::kQ6_K, QuantType::kQ2_K, QuantType::kIQ2_XXS,
                       QuantType::kQ8_0, QuantType::kF4E2M1x2, QuantType::kF8E4M3}) {
    for (const auto& [E, k, H, I, S] : std::vector<std::array<std::int64_t, 5>>{
             {32, 10, 2560, 640, 1}, {16, 6, 4096, 384, 1}, {32, 10, 2560, 640, 3}}) {
      const bool fp8 = t == QuantType::kF8E4M3;
      if (fp8 && S > 1) continue;  // the FP8 experts stream one token only
      SCOPED_TRACE(std::string(quant::quant_name(t)) + " experts H " + std::to_string(H) + " S " +
                   std::to_string(S));
      // The down in Q8_0 where its rows are not whole blocks of t (640 of a K-quant's 256).
      const bool whole = fp8 || t == QuantType::kF4E2M1x2 || t == QuantType::kQ8_0 || I % 256 == 0;
      const Weight gu = up(random_quant(t, {E, 2 * I, H}, g));
      const Weight dn = up(random_quant(whole ? t : QuantType::kQ8_0, {E, H, I}, g));
      auto [experts, weights] = routing(S, E, k, g);
      // FP8 E4M3 experts take the FP8 kernels (FLASHSERVE_CUDA_FP8_EXPERT_STREAM), which skip a
      // pair routed nowhere as a whole block; the packed ones zero it.
      if (!fp8) experts.data_as<std::int32_t>()[S * k - 1] = -1;
      const char* flag =
          fp8 ? "FLASHSERVE_CUDA_FP8_EXPERT_STREAM" : "FLASHSERVE_CUDA_PACKED_STREAM";
      const Tensor x = random_x({S, H}, g).to(be_->memory());
      const Tensor ids = experts.to(be_->memory()), wts = weights.to(be_->memory());
      Tensor one_row_a_warp;
      setenv(flag, "0", 1);
      be_->moe_experts(x, gu, dn, ids, wts, 7.0f, one_row_a_warp);
      unsetenv(flag);
      const auto b = one_row_a_warp.to_host_vector();
      // Streamed with an item's gate and up rows sharing their last round where they are one
      // round and a quarter (Q4_K at 2,560), and one row at a time (PACKED_TAIL=0).
      for (const char* tail : {"1", "0"}) {
        SCOPED_TRACE(std::string("FLASHSERVE_CUDA_PACKED_TAIL=") + tail);
        Tensor streamed;
        setenv(flag, "1", 1);
        setenv("FLASHSERVE_CUDA_PACKED_TAIL", tail, 1);
        be_->moe_experts(x, gu, dn, ids, wts, 7.0f, streamed);
        unsetenv(flag);
        unsetenv("FLASHSERVE_CUDA_PACKED_TAIL");
        ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
        const auto a = streamed.to_host_vector();
        ASSERT_EQ(a.size(), static_cast<std::size_t>(S * H));
        ASSERT_EQ(b.size(), a.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      }
    }
  }
}

// The fused decode ops over packed projections (the GGUF mixes; cuda_fused_packed.cu, session 34)
// give the unfused sequence's bits: a GatedDeltaNet decode step's two ops against the four a
// verify runs (the in-projections, the conv, the recurrence, the gated norm), the in-projections
// and QSA's projections of 1-4 tokens and the shared expert of 1 and 3 against
// FLASHSERVE_CUDA_PACKED_FUSED=0 (the op's sequence), and each of 3 tokens against itself alone.
// Qwen 3.8's width (2,560: Q4_K's rows share their last round) with fewer heads, every format; the
// released head counts in Q4_K.
TEST_P(QuantOps, PackedFusedProjectionsEqualTheSequenceBitForBit) {
  if (GetParam() != "cuda") GTEST_SKIP() << "a property of the CUDA kernels";
  for (const char* v : {"FLASHSERVE_CUDA_PACKED_FUSED", "FLASHSERVE_CUDA_GDN_UNFUSED",
                        "FLASHSERVE_CUDA_QSA_UNFUSED"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << "a fusion switch is set: " << v;
  std::mt19937 g(40);
  const auto dev = [&](const Tensor& t) { return t.to(be_->memory()); };
  const auto f32_weight = [&](std::vector<float>& keep, Shape shape, float scale) {
    std::uniform_real_distribution<float> d(-scale, scale);
    keep.resize(static_cast<std::size_t>(shape_numel(shape)));
    for (auto& v : keep) v = d(g);
    auto w = be_->upload(f32_view(keep, std::move(shape)), DType::kF32);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    return w.ok() ? *w : Weight{};
  };
  const auto same = [&](const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                        const char* what) {
    be_->synchronize();
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t o = 0; o < a.size(); ++o) {
      const Tensor ha = a[o].to(host_memory()), hb = b[o].to(host_memory());
      EXPECT_TRUE(same_bits(ha, hb)) << what << ": output " << o;
    }
  };
  struct Shape5 {
    QuantType t;
    std::int64_t Hk, Hv, d;
  };
  std::vector<Shape5> cases;
  for (const auto t : kDeviceTypes)
    if (t != QuantType::kF8E4M3) cases.push_back({t, 2, 4, 128});
  cases.push_back({QuantType::kQ4_K, 16, 48, 128});
  const std::int64_t in = 2560, K = 4;
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(quant::quant_name(c.t)) + " Hk " + std::to_string(c.Hk) + " Hv " +
                 std::to_string(c.Hv));
    const std::int64_t key_dim = c.Hk * c.d, value_dim = c.Hv * c.d;
    const std::int64_t C = 2 * key_dim + value_dim;
    const Weight wq = up(random_quant(c.t, {C, in}, g)),
                 wz = up(random_quant(c.t, {value_dim, in}, g)),
                 wb = up(random_quant(c.t, {c.Hv, in}, g)),
                 wa = up(random_quant(c.t, {c.Hv, in}, g));
    std::vector<float> dt_v, decay_v, conv_v, norm_v;
    const Weight dt = f32_weight(dt_v, {c.Hv}, 1.0f), conv = f32_weight(conv_v, {C, K}, 0.5f),
                 norm = f32_weight(norm_v, {c.d}, 1.0f);
    Weight decay = f32_weight(decay_v, {c.Hv}, 1.0f);
    for (auto& v : decay_v) v = -0.1f - std::fabs(v);  // a log decay
    decay = *be_->upload(f32_view(decay_v, {c.Hv}), DType::kF32);
    const Tensor x = random_x({3, in}, g);
    Tensor x1({1, in});
    std::memcpy(x1.data(), x.data(), static_cast<std::size_t>(in) * 4);
    const Tensor tail0 = random_x({K - 1, C}, g), state0 = random_x({c.Hv, c.d, c.d}, g);
    // The decode step's two ops against the verify's four.
    const auto step = [&](bool sequence) {
      Tensor t = dev(tail0), st = dev(state0), z, beta, gg, normed;
      const Tensor xd = dev(x1);
      if (!sequence) {
        Tensor mixed;
        be_->gated_delta_net_in_proj_conv(xd, wq, wz, wb, wa, dt, decay, conv, t, mixed, z, beta,
                                          gg);
        be_->gated_delta_net_core(mixed, z, beta, gg, c.Hk, c.d, norm, 1e-6f, Activation::kSilu, st,
                                  normed);
        return std::vector<Tensor>{normed, z, beta, gg, t, st};
      }
      setenv("FLASHSERVE_CUDA_PACKED_FUSED", "0", 1);
      Tensor qkv, q, k, v, core;
      be_->gated_delta_net_in_proj(xd, wq, wz, wb, wa, dt, decay, qkv, z, beta, gg);
      be_->gated_delta_net_conv(qkv, conv, t, key_dim, c.d, q, k, v);
      be_->gated_delta_rule_recurrent(q, k, v, gg, beta, c.Hk, st, core);
      core.reshape({c.Hv, c.d});
      be_->rms_norm_gated(core, norm, z, 1e-6f, Activation::kSilu, normed);
      normed.reshape({1, value_dim});
      unsetenv("FLASHSERVE_CUDA_PACKED_FUSED");
      return std::vector<Tensor>{normed, z, beta, gg, t, st};
    };
    same(step(false), step(true), "decode step");
    // The in-projections of 1-3 tokens, fused and not; and each token alone.
    const auto in_proj = [&](const Tensor& xs, bool fused) {
      if (!fused) setenv("FLASHSERVE_CUDA_PACKED_FUSED", "0", 1);
      Tensor qkv, z, beta, gg;
      be_->gated_delta_net_in_proj(dev(xs), wq, wz, wb, wa, dt, decay, qkv, z, beta, gg);
      unsetenv("FLASHSERVE_CUDA_PACKED_FUSED");
      return std::vector<Tensor>{qkv, z, beta, gg};
    };
    for (std::int64_t S = 1; S <= 3; ++S) {
      Tensor xs({S, in});
      std::memcpy(xs.data(), x.data(), static_cast<std::size_t>(S * in) * 4);
      same(in_proj(xs, true), in_proj(xs, false),
           ("in-projections S " + std::to_string(S)).c_str());
    }
    const auto all = in_proj(x, true);
    be_->synchronize();
    for (std::int64_t s = 0; s < 3; ++s) {
      Tensor xs({1, in});
      std::memcpy(xs.data(), x.data() + s * in, static_cast<std::size_t>(in) * 4);
      const auto one = in_proj(xs, true);
      be_->synchronize();
      for (std::size_t o = 0; o < one.size(); ++o) {
        const auto a = one[o].to_host_vector(), b = all[o].to_host_vector();
        ASSERT_EQ(b.size(), 3 * a.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data() + s * a.size(), a.size() * sizeof(float)), 0)
            << "token " << s << " of 3, output " << o;
      }
    }
    // QSA's projections (q and gate, k, v with biases; the indexer's), 1 and 4 tokens.
    std::vector<float> qb_v, kb_v, vb_v;
    const std::int64_t qr = 2 * key_dim, kr = 256, vr = 256, ir = 128;
    const Weight qw = up(random_quant(c.t, {qr, in}, g)), kw = up(random_quant(c.t, {kr, in}, g)),
                 vw = up(random_quant(c.t, {vr, in}, g)), iw = up(random_quant(c.t, {ir, in}, g));
    const Weight qb = f32_weight(qb_v, {qr}, 1.0f), kb = f32_weight(kb_v, {kr}, 1.0f),
                 vb = f32_weight(vb_v, {vr}, 1.0f);
    const auto qsa = [&](const Tensor& xs, bool fused) {
      if (!fused) setenv("FLASHSERVE_CUDA_PACKED_FUSED", "0", 1);
      Tensor qg, k, v, idx;
      be_->qsa_projections(dev(xs), qw, kw, vw, iw, qb, kb, vb, qg, k, v, idx);
      unsetenv("FLASHSERVE_CUDA_PACKED_FUSED");
      return std::vector<Tensor>{qg, k, v, idx};
    };
    for (const std::int64_t S : {1, 4}) {
      const Tensor xs = random_x({S, in}, g);
      same(qsa(xs, true), qsa(xs, false), ("QSA S " + std::to_string(S)).c_str());
    }
    // The shared expert (gate and up of the format, the down of 640 in Q8_0 where its rows are
    // not whole blocks of it; an f32 expert gate), accumulated into y, at 1 and 3 tokens.
    const std::int64_t I = 640;
    const bool whole = c.t == QuantType::kQ8_0 || c.t == QuantType::kF4E2M1x2;
    std::vector<float> eg_v;
    const Weight sg = up(random_quant(c.t, {I, in}, g)), su = up(random_quant(c.t, {I, in}, g)),
                 sd = up(random_quant(whole ? c.t : QuantType::kQ8_0, {in, I}, g)),
                 eg = f32_weight(eg_v, {1, in}, 0.05f);
    const auto shared = [&](const Tensor& xs, const Tensor& y0, bool fused) {
      if (!fused) setenv("FLASHSERVE_CUDA_PACKED_FUSED", "0", 1);
      Tensor y = dev(y0);
      be_->shared_expert(dev(xs), sg, su, sd, eg, y);
      unsetenv("FLASHSERVE_CUDA_PACKED_FUSED");
      return std::vector<Tensor>{y};
    };
    for (const std::int64_t S : {1, 3}) {
      const Tensor xs = random_x({S, in}, g), y0 = random_x({S, in}, g);
      same(shared(xs, y0, true), shared(xs, y0, false),
           ("shared expert S " + std::to_string(S)).c_str());
    }
  }
}

// One token of Qwen's MoE block on packed weights takes four kernels (cuda_moe_block_packed.cu,
// session 35): the routing beside the shared expert's gate/up and the expert gate's logit, the
// routed gate/up, then the routed and shared downs with the combine and the write. It must give
// the ten-kernel sequence's bits (FLASHSERVE_CUDA_PACKED_MOE_BLOCK=0): the picks, their weights,
// y, and the streams it writes into. An MTP verify's 2-4 tokens run the sequence (its routed
// gate/up streamed since session 37), and each of its tokens must get the one-token block's bits
// (what greedy MTP on these weights needs). The down + combine's two forms give the same bits.
// The mixes the bench runs (Q4_K and IQ2_XXS experts, Q8_0 downs), every routed format with its
// Q8_0 down, a bf16 expert gate and an f32 one, top-k 10 and 6 (blocks of 11 and 18 columns: a
// short last block), and Qwen's 2,560 x 640 experts.
TEST_P(QuantOps, PackedMoeBlockEqualsItsSequenceBitForBit) {
  if (GetParam() != "cuda") GTEST_SKIP() << "a property of the CUDA kernels";
  for (const char* v : {"FLASHSERVE_CUDA_PACKED_MOE_BLOCK", "FLASHSERVE_CUDA_MOE_BLOCK",
                        "FLASHSERVE_CUDA_PACKED_STREAM", "FLASHSERVE_CUDA_PACKED_STREAM_TOKENS",
                        "FLASHSERVE_CUDA_PACKED_DOWN_TWO_BLOCKS"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << "a fusion switch is set: " << v;
  std::mt19937 g(41);
  const auto dev = [&](const Tensor& t) { return t.to(be_->memory()); };
  const auto float_weight = [&](std::vector<float>& keep, Shape shape, float scale, DType dtype) {
    std::uniform_real_distribution<float> d(-scale, scale);
    keep.resize(static_cast<std::size_t>(shape_numel(shape)));
    for (auto& v : keep) v = d(g);
    auto w = be_->upload(f32_view(keep, std::move(shape)), dtype);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    return w.ok() ? *w : Weight{};
  };
  struct Mix {
    QuantType experts, shared;
    std::int64_t E, k;
    DType gate;
  };
  std::vector<Mix> mixes = {{QuantType::kQ4_K, QuantType::kQ4_K, 64, 10, DType::kBF16},
                            {QuantType::kIQ2_XXS, QuantType::kQ8_0, 64, 10, DType::kBF16},
                            {QuantType::kQ4_K, QuantType::kQ4_K, 32, 6, DType::kF32}};
  for (const auto t : kDeviceTypes)
    if (t != QuantType::kF8E4M3) mixes.push_back({t, t, 32, 10, DType::kBF16});
  const std::int64_t H = 2560, I = 640;
  for (const auto& m : mixes) {
    SCOPED_TRACE(std::string(quant::quant_name(m.experts)) + " experts, " +
                 std::string(quant::quant_name(m.shared)) + " shared, E " + std::to_string(m.E) +
                 " k " + std::to_string(m.k));
    // The downs in Q8_0 where 640 is not whole blocks of the format (a K-quant's 256).
    const auto down_type = [](QuantType t) {
      return t == QuantType::kQ8_0 || t == QuantType::kF4E2M1x2 ? t : QuantType::kQ8_0;
    };
    const Weight gu = up(random_quant(m.experts, {m.E, 2 * I, H}, g)),
                 dn = up(random_quant(down_type(m.experts), {m.E, H, I}, g)),
                 sg = up(random_quant(m.shared, {I, H}, g)),
                 su = up(random_quant(m.shared, {I, H}, g)),
                 sd = up(random_quant(down_type(m.experts), {H, I}, g));
    std::vector<float> router_v, gate_v;
    const Weight router = float_weight(router_v, {m.E, H}, 0.06f, DType::kBF16),
                 eg = float_weight(gate_v, {1, H}, 0.05f, m.gate);
    constexpr std::int64_t kTokens = 4;
    const Tensor xs = random_x({kTokens, H}, g), hs = random_x({kTokens, 4 * H}, g),
                 gs = random_x({kTokens, 4}, g);
    // Rows s0 .. s0 + S - 1 of t.
    const auto rows = [](const Tensor& t, std::int64_t s0, std::int64_t S) {
      Tensor r({S, t.cols()});
      std::memcpy(r.data(), t.data() + s0 * t.cols(),
                  static_cast<std::size_t>(S * t.cols()) * sizeof(float));
      return r;
    };
    // The block's outputs for tokens s0 .. s0 + S - 1: the picks, their weights, y, the streams.
    const auto run = [&](bool fused, std::int64_t s0, std::int64_t S) {
      if (!fused) setenv("FLASHSERVE_CUDA_PACKED_MOE_BLOCK", "0", 1);
      const Tensor x = dev(rows(xs, s0, S));
      Tensor experts, weights, y, e2, w2, h = dev(rows(hs, s0, S));
      be_->moe_block(x, router, m.k, true, gu, dn, sg, su, sd, eg, experts, weights, y);
      be_->moe_block_into_streams(x, router, m.k, true, gu, dn, sg, su, sd, eg, e2, w2,
                                  {h, dev(rows(gs, s0, S))});
      unsetenv("FLASHSERVE_CUDA_PACKED_MOE_BLOCK");
      be_->synchronize();
      EXPECT_TRUE(be_->status().ok()) << be_->status().to_string();
      return std::vector<Tensor>{experts.to(host_memory()), weights.to(host_memory()),
                                 y.to(host_memory()), h.to(host_memory())};
    };
    const auto equal = [](const Tensor& a, const Tensor& b) {
      return a.dtype() == b.dtype() && a.shape() == b.shape() &&
             std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
    };
    // Row s of a host tensor's bytes.
    const auto row_bytes = [](const Tensor& t, std::int64_t s) {
      const auto n = t.bytes() / static_cast<std::size_t>(t.rows());
      const auto* p = static_cast<const std::uint8_t*>(t.raw());
      return std::vector<std::uint8_t>(p + s * n, p + (s + 1) * n);
    };
    std::vector<std::vector<Tensor>> one;
    for (std::int64_t s = 0; s < kTokens; ++s) one.push_back(run(true, s, 1));
    // One token: the block against its sequence.
    const auto fused = run(true, 0, 1), sequence = run(false, 0, 1);
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
    for (std::size_t o = 0; o < fused.size(); ++o)
      EXPECT_TRUE(equal(fused[o], sequence[o])) << "output " << o;
    // The streams moved: the block wrote into them.
    EXPECT_FALSE(equal(fused[3], rows(hs, 0, 1)));
    // The down + combine's two forms (two blocks a multiprocessor where they fit, session 38; one
    // block with every item's first round before the wait): the same bits.
    setenv("FLASHSERVE_CUDA_PACKED_DOWN_TWO_BLOCKS", "0", 1);
    const auto one_block = run(true, 0, 1);
    unsetenv("FLASHSERVE_CUDA_PACKED_DOWN_TWO_BLOCKS");
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
    for (std::size_t o = 0; o < fused.size(); ++o)
      EXPECT_TRUE(equal(one_block[o], fused[o])) << "output " << o << ", the one-block form";
    // A verify's 2-4 tokens (the sequence, its routed gate/up streamed): each token the one-token
    // block's bits.
    for (const std::int64_t S : {2, 3, 4}) {
      const auto verify = run(true, 0, S);
      ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
      for (std::int64_t s = 0; s < S; ++s)
        for (std::size_t o = 0; o < verify.size(); ++o)
          EXPECT_EQ(row_bytes(verify[o], s), row_bytes(one[static_cast<std::size_t>(s)][o], 0))
              << "output " << o << ": token " << s << " of " << S
              << " differs from the one-token block";
    }
  }
}

// A prefill's products (more than 4 rows): on CUDA the tensor-core tiles that decode the blocks
// into shared memory (cuda_grouped_packed.cu). Row tiles of 64 with a short last one, output
// widths off the 128-column tile, K split into ranges of 128 for a narrow output (20 x 4096 ->
// 200 makes 2 tiles), and K off the 128-column step (5 and 13 blocks of 32 for the formats whose
// rows are blocks of 32).
TEST_P(QuantOps, PrefillLinearMatchesDequantisedF32) {
  std::mt19937 g(36);
  for (const auto t : kDeviceTypes) {
    std::vector<std::array<std::int64_t, 3>> shapes = {
        {70, 1024, 257}, {20, 4096, 200}, {130, 768, 136}, {5, 256, 64}};
    if (t == QuantType::kQ8_0 || t == QuantType::kF4E2M1x2) {
      shapes.push_back({33, 160, 100});
      shapes.push_back({9, 416, 64});
    }
    for (const auto& [S, in, out] : shapes) {
      SCOPED_TRACE(std::string(quant::quant_name(t)) + " S " + std::to_string(S) + " in " +
                   std::to_string(in) + " out " + std::to_string(out));
      expect_linear_matches(t, S, in, out, g);
    }
  }
}

// A prefill's routed experts (more than 4 tokens): on CUDA the pairs sorted by expert and each
// expert's blocks decoded once a tile of its pairs (tiles of 32 rows at 9 tokens, of 64 at 150,
// an expert over two tiles there), gate_up and down in different formats as ds4's and
// llama.cpp's mixes store them, the clamped SwiGLU.
TEST_P(QuantOps, PrefillMoeExpertsMatchDequantisedF32) {
  std::mt19937 g(37);
  const std::int64_t E = 8, k = 3, H = 256, I = 512;
  const std::vector<std::pair<QuantType, QuantType>> mixes = {
      {QuantType::kQ4_K, QuantType::kQ6_K},         {QuantType::kIQ2_XXS, QuantType::kQ4_K},
      {QuantType::kQ2_K, QuantType::kQ5_K},         {QuantType::kQ8_0, QuantType::kQ8_0},
      {QuantType::kF4E2M1x2, QuantType::kF4E2M1x2}, {QuantType::kQ6_K, QuantType::kIQ2_XXS},
      {QuantType::kQ5_K, QuantType::kQ2_K}};
  for (const auto& [tg, td] : mixes)
    for (const std::int64_t S : {9, 150}) {
      SCOPED_TRACE(std::string(quant::quant_name(tg)) + " / " + std::string(quant::quant_name(td)) +
                   " S " + std::to_string(S));
      expect_moe_matches(tg, td, S, E, k, H, I, g);
    }
}

// grouped_linear (DeepSeek V4's grouped output projection) on each format: a group's rows are a
// weight of their own (weight_rows), FP8 groups of whole 128-row blocks.
TEST_P(QuantOps, GroupedLinearMatchesDequantisedF32) {
  std::mt19937 g(35);
  const std::int64_t groups = 3, in = 256, out = 128;
  for (const auto t : {QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kF4E2M1x2,
                       QuantType::kIQ2_XXS, QuantType::kF8E4M3})
    for (const std::int64_t S : {1, 6}) {
      SCOPED_TRACE(std::string(quant::quant_name(t)) + " S " + std::to_string(S));
      const auto w = random_quant(t, {groups * out, in}, g);
      const auto dq = w.dequantized();
      const auto x = random_x({S, groups * in}, g);
      Tensor ref, y;
      cpu_->grouped_linear(x, f32_view(dq, {groups * out, in}), groups, ref);
      be_->grouped_linear(x.to(be_->memory()), up(w), groups, y);
      be_->synchronize();
      ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
      EXPECT_TRUE(close(y, ref));
    }
}

// A packed table on the host (the PLE table memory-mapped): each backend's embedding gives its
// dequantised rows exactly (the CUDA backend dequantises host rows into its staging).
TEST_P(QuantOps, EmbeddingOfAHostPackedTable) {
  std::mt19937 g(34);
  for (const auto t : {QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kF4E2M1x2}) {
    SCOPED_TRACE(std::string(quant::quant_name(t)));
    const auto table = random_quant(t, {10, 512}, g);
    const auto dq = table.dequantized();
    const Weight shard = table.view();
    const std::vector<std::int64_t> ids = {9, 0, 3, 3};
    Tensor emb;
    be_->embedding({&shard, 1}, ids, emb);
    be_->synchronize();
    ASSERT_TRUE(be_->status().ok()) << be_->status().to_string();
    const auto got = emb.to_host_vector();
    for (std::size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(std::memcmp(got.data() + i * 512, dq.data() + ids[i] * 512, 512 * 4), 0)
          << "id " << ids[i];
  }
}

// An op that cannot read a format fails naming it (never reads the bytes as something else).
TEST_P(QuantOps, RefusesFormatsItCannotReadByName) {
  std::mt19937 g(33);
  const auto q4 = random_quant(QuantType::kQ4_K, {1, 256}, g);
  const auto x = random_x({2, 256}, g);
  Tensor y;
  be_->rms_norm(x.to(be_->memory()), up(q4), 256, 1e-6f, false, y);
  EXPECT_FALSE(be_->status().ok());
  EXPECT_NE(be_->status().to_string().find("Q4_K"), std::string::npos) << be_->status().to_string();
  if (GetParam() == "cuda") {
    // FP4 rows that end in a partial 32-block: the CPU reads them, the CUDA decoder does not.
    std::string why;
    auto fresh = backend_named("cuda", &why);
    ASSERT_TRUE(fresh);
    const auto fp4 = random_quant(QuantType::kF4E2M1x2, {8, 48}, g);
    const auto x48 = random_x({2, 48}, g);
    auto w = fresh->upload(fp4.view(), DType::kBF16);
    ASSERT_TRUE(w.ok()) << w.status().to_string();
    fresh->linear(x48.to(fresh->memory()), *w, y);
    EXPECT_NE(fresh->status().to_string().find("F4_E2M1"), std::string::npos)
        << fresh->status().to_string();
    // A packed table on the device is refused by embedding (host tables are read).
    auto fresh2 = backend_named("cuda", &why);
    ASSERT_TRUE(fresh2);
    auto table = fresh2->upload(q4.view(), DType::kBF16);
    ASSERT_TRUE(table.ok()) << table.status().to_string();
    const std::vector<std::int64_t> ids = {1};
    fresh2->embedding({&*table, 1}, ids, y);
    EXPECT_NE(fresh2->status().to_string().find("Q4_K"), std::string::npos)
        << fresh2->status().to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, QuantOps, ::testing::Values(std::string("cpu")));
INSTANTIATE_TEST_SUITE_P(Cuda, QuantOps, ::testing::Values(std::string("cuda")));

}  // namespace
}  // namespace fs
