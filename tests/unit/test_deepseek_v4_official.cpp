// DeepSeek V4 as officially released (issue 15): `convert --quantize fp4` writes the hf-tiny
// fixture and models/deepseek-v4-tiny in the release's layout (its tensor names, FP8 E4M3
// projections with E8M0 128x128 `.scale` blocks, FP4 E2M1 routed experts one tensor per expert
// with E8M0 per-32 scales), the loader maps the names and stacks the experts as stored, and the
// model runs on the test's backend: logits within measured bounds of the unquantised model's,
// greedy MTP equal to autoregressive decoding on the quantised weights, inconsistent folders
// refused by name, `inspect` reporting each tensor's storage and the bytes a token reads. The
// HF-named FP8 layout (`convert --quantize fp8`) loads for this family too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>

#include "decode/generator.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "model/convert.h"
#include "model/deepseek_v4/official_experts.h"
#include "model/deepseek_v4/official_names.h"
#include "model/deepseek_v4/schema.h"
#include "model/deepseek_v4/weights.h"
#include "model/family.h"
#include "model/inspect.h"
#include "model/loader.h"
#include "model/weight_upload.h"
#include "qwen_fixture.h"
#include "recording_device.h"
#include "tensor/quant/block_scaled.h"
#include "test_backend.h"
#include "test_support.h"

namespace fs {
namespace {

const std::string kTinyServable = FLASHSERVE_SOURCE_DIR "/models/deepseek-v4-tiny";

// Bounds, measured on the CPU with a margin of about 1.5x (the figures are printed), against the
// hf-tiny fixture's float64 reference logits. The fixture's random weights make it very
// sensitive: logits up to about 4.4 with near-ties everywhere, the routed top-2 and the
// indexer's top-4 picks flip under small changes (the official numerics' KV rounding alone
// moves them by 2.5, argmax 64%; test_deepseek_v4.cpp). FP4 keeps one mantissa bit, E4M3 three.
// Measured (CPU, 2026-12-02), official FP4 layout: L=64 max 3.03, median row 1.61, argmax 37.5%;
// L=160 max 3.86, median row 1.68, argmax 33.8% (chance is 1/256).
constexpr double kFixtureMax = 6.0;
constexpr double kFixtureMedianRow = 2.5;
constexpr double kFixtureArgmax = 0.2;
// HF-named FP8 (`convert --quantize fp8`, F32 scales): L=64 max 2.56, median row 0.833, argmax
// 67.2%; L=160 max 3.62, median row 1.11, argmax 48.8%.
constexpr double kFp8Max = 5.5;
constexpr double kFp8MedianRow = 1.7;
constexpr double kFp8Argmax = 0.3;
// The quantised model against the f32 model on its dequantised weights. The CPU forms the same
// products in the same order (measured: max |d| 0); CUDA's packed kernels order their sums
// otherwise than its f32 ones, held to the family's parity bound (test_deepseek_v4.cpp).
double dequantised_tolerance() {
  return test::test_backend() == "cuda" ? 1e-3 : 1e-5;
}

struct RowErrors {
  double max_abs = 0, median_row = 0, agreement = 0;
};

RowErrors row_errors(const std::vector<float>& got, const std::vector<float>& ref,
                     std::int64_t vocab) {
  const auto rows = static_cast<std::int64_t>(ref.size()) / vocab;
  std::vector<double> per_row;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::vector<float> a(got.begin() + r * vocab, got.begin() + (r + 1) * vocab);
    const std::vector<float> b(ref.begin() + r * vocab, ref.begin() + (r + 1) * vocab);
    per_row.push_back(test::diff_logits(a, b, vocab).max_abs);
  }
  const auto d = test::diff_logits(got, ref, vocab);
  std::sort(per_row.begin(), per_row.end());
  return {d.max_abs, per_row[per_row.size() / 2],
          1.0 - static_cast<double>(d.argmax_mismatches) / static_cast<double>(rows)};
}

std::unique_ptr<Model> load_or_fail(const std::string& dir) {
  auto m = load_model(dir, test::test_load_options());
  EXPECT_TRUE(m.ok()) << dir << ": " << m.status().to_string();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::string converted(const test::ScratchDir& dir, const std::string& src, bool fp4,
                      const std::string& name) {
  const auto out = dir.file(name);
  ConvertOptions o;
  (fp4 ? o.quantize_fp4 : o.quantize_fp8) = true;
  const auto st = convert_checkpoint(src, out, o);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

// The fixture's cases against the reference, with the bounds of one layout.
void expect_fixture_within(const std::string& dir, const char* label, double max_bound,
                           double median_bound, double argmax_bound) {
  auto m = load_or_fail(dir);
  ASSERT_NE(m, nullptr);
  const auto fixture = test::hf_tiny("deepseek_v4");
  const auto V = m->info().vocab_size;
  for (const auto& c : test::qwen_cases(fixture)) {
    auto state = m->new_state();
    const auto L = static_cast<std::int64_t>(c.tokens.size());
    const auto got = test::run_splits(*m, *state, c.tokens, {L});
    ASSERT_EQ(got.size(), c.full.size());
    const auto e = row_errors(got, c.full, V);
    std::printf("[%s %s] L=%lld max|d|=%.3g median row max|d|=%.3g argmax=%.3f\n", label,
                test::test_backend().c_str(), static_cast<long long>(L), e.max_abs, e.median_row,
                e.agreement);
    EXPECT_LE(e.max_abs, max_bound);
    EXPECT_LE(e.median_row, median_bound);
    EXPECT_GE(e.agreement, argmax_bound);
    EXPECT_GT(e.max_abs, 1e-3);  // the rounding is really there
  }
}

TEST(DeepseekV4OfficialNames, EverySchemaTensorHasOneOfTheReleasesNames) {
  auto d = describe_model(test::hf_tiny("deepseek_v4"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const auto& c = std::get<DeepseekV4Config>(d->config);
  // The release's name patterns (its model.safetensors.index.json with layer and expert numbers
  // replaced by 0; the shared experts' w1/w2/w3 as its headers name them): every name we write
  // is one of them.
  const std::set<std::string> release = {"embed.weight",
                                         "head.weight",
                                         "norm.weight",
                                         "hc_head_fn",
                                         "hc_head_base",
                                         "hc_head_scale",
                                         "layers.0.attn.attn_sink",
                                         "layers.0.attn.compressor.ape",
                                         "layers.0.attn.compressor.norm.weight",
                                         "layers.0.attn.compressor.wgate.weight",
                                         "layers.0.attn.compressor.wkv.weight",
                                         "layers.0.attn.indexer.compressor.ape",
                                         "layers.0.attn.indexer.compressor.norm.weight",
                                         "layers.0.attn.indexer.compressor.wgate.weight",
                                         "layers.0.attn.indexer.compressor.wkv.weight",
                                         "layers.0.attn.indexer.weights_proj.weight",
                                         "layers.0.attn.indexer.wq_b.weight",
                                         "layers.0.attn.kv_norm.weight",
                                         "layers.0.attn.q_norm.weight",
                                         "layers.0.attn.wkv.weight",
                                         "layers.0.attn.wo_a.weight",
                                         "layers.0.attn.wo_b.weight",
                                         "layers.0.attn.wq_a.weight",
                                         "layers.0.attn.wq_b.weight",
                                         "layers.0.attn_norm.weight",
                                         "layers.0.ffn.gate.bias",
                                         "layers.0.ffn.gate.tid2eid",
                                         "layers.0.ffn.gate.weight",
                                         "layers.0.ffn.shared_experts.w1.weight",
                                         "layers.0.ffn.shared_experts.w2.weight",
                                         "layers.0.ffn.shared_experts.w3.weight",
                                         "layers.0.ffn_norm.weight",
                                         "layers.0.hc_attn_base",
                                         "layers.0.hc_attn_fn",
                                         "layers.0.hc_attn_scale",
                                         "layers.0.hc_ffn_base",
                                         "layers.0.hc_ffn_fn",
                                         "layers.0.hc_ffn_scale",
                                         "mtp.0.attn.attn_sink",
                                         "mtp.0.attn.kv_norm.weight",
                                         "mtp.0.attn.q_norm.weight",
                                         "mtp.0.attn.wkv.weight",
                                         "mtp.0.attn.wo_a.weight",
                                         "mtp.0.attn.wo_b.weight",
                                         "mtp.0.attn.wq_a.weight",
                                         "mtp.0.attn.wq_b.weight",
                                         "mtp.0.attn_norm.weight",
                                         "mtp.0.e_proj.weight",
                                         "mtp.0.enorm.weight",
                                         "mtp.0.ffn.gate.bias",
                                         "mtp.0.ffn.gate.weight",
                                         "mtp.0.ffn.shared_experts.w1.weight",
                                         "mtp.0.ffn.shared_experts.w2.weight",
                                         "mtp.0.ffn.shared_experts.w3.weight",
                                         "mtp.0.ffn_norm.weight",
                                         "mtp.0.h_proj.weight",
                                         "mtp.0.hc_attn_base",
                                         "mtp.0.hc_attn_fn",
                                         "mtp.0.hc_attn_scale",
                                         "mtp.0.hc_ffn_base",
                                         "mtp.0.hc_ffn_fn",
                                         "mtp.0.hc_ffn_scale",
                                         "mtp.0.hc_head_base",
                                         "mtp.0.hc_head_fn",
                                         "mtp.0.hc_head_scale",
                                         "mtp.0.hnorm.weight",
                                         "mtp.0.norm.weight"};
  // Numbers between dots become 0 ("layers.12.ffn" -> "layers.0.ffn", "tid2eid" stays).
  auto pattern = [](const std::string& n) {
    std::string out;
    std::size_t i = 0;
    while (i < n.size()) {
      const auto end = std::min(n.find('.', i), n.size());
      const auto part = n.substr(i, end - i);
      const bool number =
          !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      out += number ? "0" : part;
      if (end < n.size()) out += '.';
      i = end + 1;
    }
    return out;
  };
  auto specs = deepseek_v4_tensors(c);
  const auto mtp = deepseek_v4_mtp_tensors(c);
  specs.insert(specs.end(), mtp.begin(), mtp.end());
  std::set<std::string> seen;
  for (const auto& spec : specs) {
    if (spec.name.ends_with("experts.gate_up_proj") || spec.name.ends_with("experts.down_proj")) {
      EXPECT_FALSE(deepseek_v4_official_name(spec.name).has_value()) << spec.name;
      continue;
    }
    const auto official = deepseek_v4_official_name(spec.name);
    ASSERT_TRUE(official.has_value()) << spec.name;
    EXPECT_TRUE(release.count(pattern(*official))) << spec.name << " -> " << *official;
    EXPECT_EQ(deepseek_v4_hf_name(*official), spec.name);
    EXPECT_TRUE(seen.insert(*official).second) << "two tensors named " << *official;
  }
  EXPECT_EQ(official_expert_name("layers.3.", 5, DsExpertProjection::kUp),
            "layers.3.ffn.experts.5.w3");
  EXPECT_EQ(official_scale_name("layers.3.attn.wq_a.weight"), "layers.3.attn.wq_a.scale");
  EXPECT_FALSE(deepseek_v4_hf_name("layers.0.attn.wq_a.scale").has_value());
  EXPECT_FALSE(deepseek_v4_hf_name("layers.x.attn.wq_a.weight").has_value());
}

TEST(DeepseekV4Official, ConvertWritesTheReleasesDtypesAndShapes) {
  test::ScratchDir dir;
  const auto out = converted(dir, test::hf_tiny("deepseek_v4"), true, "fp4");
  auto ck = Checkpoint::open(out);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  EXPECT_TRUE(deepseek_v4_official_names(*ck));
  auto dtype_of = [&](const std::string& n) {
    const auto v = ck->view(n);
    EXPECT_TRUE(v.has_value()) << n;
    return v ? std::string(dtype_name(v->dtype)) + " " + shape_to_string(v->shape) : "";
  };
  // Fixture: H 64, I 32, E 8, q_lora_rank 32; layer 1 CSA (with the indexer), layer 2 HCA.
  EXPECT_EQ(dtype_of("layers.2.attn.wq_a.weight"), "F8_E4M3 [32, 64]");
  EXPECT_EQ(dtype_of("layers.2.attn.wq_a.scale"), "F8_E8M0 [1, 1]");
  EXPECT_EQ(dtype_of("layers.1.attn.indexer.wq_b.scale"), "F8_E8M0 [2, 1]");
  EXPECT_EQ(dtype_of("layers.2.ffn.experts.7.w1.weight"), "I8 [32, 32]");
  EXPECT_EQ(dtype_of("layers.2.ffn.experts.7.w1.scale"), "F8_E8M0 [32, 2]");
  EXPECT_EQ(dtype_of("layers.2.ffn.experts.7.w2.weight"), "I8 [64, 16]");
  EXPECT_EQ(dtype_of("layers.2.ffn.experts.7.w2.scale"), "F8_E8M0 [64, 1]");
  EXPECT_EQ(dtype_of("layers.2.ffn.shared_experts.w2.weight"), "F8_E4M3 [64, 32]");
  // The fixture's o_a_proj groups are 16 rows, inside one 128-row block: kept in f32.
  EXPECT_EQ(dtype_of("layers.2.attn.wo_a.weight"), "F32 [32, 64]");
  EXPECT_EQ(dtype_of("layers.2.attn.wo_b.weight"), "F8_E4M3 [64, 32]");
  // Kept in their float type, as the release ships them.
  EXPECT_EQ(dtype_of("layers.2.attn.compressor.wkv.weight"), "F32 [32, 64]");
  EXPECT_EQ(dtype_of("layers.1.attn.indexer.weights_proj.weight"), "F32 [16, 64]");
  EXPECT_EQ(dtype_of("layers.1.attn.compressor.wgate.weight"), "F32 [64, 64]");
  EXPECT_EQ(dtype_of("head.weight"), "F32 [256, 64]");
  EXPECT_EQ(dtype_of("layers.0.ffn.gate.tid2eid"), "I64 [256, 2]");
  EXPECT_FALSE(ck->contains("layers.2.attn.compressor.wkv.scale"));
  EXPECT_FALSE(ck->contains("embed_tokens.weight"));
}

TEST(DeepseekV4Official, FixtureLogitsWithinMeasuredBounds) {
  test::ScratchDir dir;
  expect_fixture_within(converted(dir, test::hf_tiny("deepseek_v4"), true, "fp4"), "fp4 official",
                        kFixtureMax, kFixtureMedianRow, kFixtureArgmax);
}

TEST(DeepseekV4Official, HfNamedFp8FolderLoadsToo) {
  test::ScratchDir dir;
  expect_fixture_within(converted(dir, test::hf_tiny("deepseek_v4"), false, "fp8"), "fp8 hf",
                        kFp8Max, kFp8MedianRow, kFp8Argmax);
}

// On a device the per-expert FP4 tensors are stacked one layer at a time after the rest of the
// plan, uploaded and freed (the host never holds the 150 GB of a real release's stacked experts),
// and counted in the fit check before anything is copied; on the CPU they are stacked into
// buffers the weights keep.
TEST(DeepseekV4Official, DeviceUploadStacksTheExpertsOneLayerAtATime) {
  test::ScratchDir dir;
  const auto folder = converted(dir, test::hf_tiny("deepseek_v4"), true, "fp4");
  auto d = describe_model(folder);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const auto& c = std::get<DeepseekV4Config>(d->config);
  auto w = load_deepseek_v4_weights(c, folder);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  std::vector<DsLayerWeights*> layers;  // the fixture has no MTP block; a release's is one more
  for (auto& lw : w->layers) layers.push_back(&lw);
  if (w->mtp) layers.push_back(&w->mtp->layer);
  std::uint64_t experts = 0;
  for (auto* lw : layers) {
    ASSERT_TRUE(lw->official_experts.has_value());
    EXPECT_TRUE(lw->moe.gate_up.empty() && lw->moe.down.empty()) << "stacked at upload";
    experts += lw->official_experts->stacked_bytes();
  }
  // Everything but the experts fits; with them, not: refused before a copy.
  test::RecordingDevice small(kLoadHeadroomBytes + experts);
  EXPECT_FALSE(upload_deepseek_v4_weights(*w, small, DType::kF32).ok());
  EXPECT_TRUE(small.copies.empty()) << small.copies.size() << " weights copied before the refusal";
  test::RecordingDevice dev(kLoadHeadroomBytes * 4);
  ASSERT_TRUE(upload_deepseek_v4_weights(*w, dev, DType::kF32).ok());
  EXPECT_TRUE(w->host_bytes.empty()) << "no stacked copy kept on the host";
  auto ck = Checkpoint::open(folder);
  ASSERT_TRUE(ck.ok());
  for (auto* lw : layers) {
    const auto& o = *lw->official_experts;
    // What the device got: the codes a host stacking writes, gate rows then up rows per expert.
    std::vector<std::unique_ptr<std::vector<std::uint8_t>>> arena;
    const auto want =
        stack_official_experts(*ck, o.layer_prefix, o.experts, o.intermediate, o.hidden, arena);
    const std::pair<const Weight*, const Weight*> pairs[] = {{&lw->moe.gate_up, &want.gate_up},
                                                             {&lw->moe.down, &want.down}};
    for (const auto& [got, ref] : pairs) {
      ASSERT_EQ(got->shape, ref->shape) << o.layer_prefix;
      ASSERT_EQ(got->bytes(), ref->bytes());
      EXPECT_EQ(std::memcmp(got->data, ref->data, ref->bytes()), 0) << o.layer_prefix;
    }
    EXPECT_EQ(want.gate_up.bytes() + want.gate_up.scale_bytes() + want.down.bytes() +
                  want.down.scale_bytes(),
              o.stacked_bytes());
  }
}

// The official folder `src` rewritten as an HF-named f32 folder of its dequantised weights:
// what the quantised model must compute (the per-expert FP4 tensors stacked back, every F8_E4M3
// projection times its E8M0 blocks).
void write_dequantised(const std::string& src, const std::string& dst, std::int64_t experts) {
  auto ck = Checkpoint::open(src);
  ASSERT_TRUE(ck.ok());
  std::vector<TensorToWrite> out;
  std::vector<std::vector<float>> keep;
  std::vector<std::vector<std::uint8_t>> keep_raw;
  keep.reserve(ck->tensors().size());
  keep_raw.reserve(ck->tensors().size());
  auto dequantised = [&](const std::string& name, quant::QuantType t, std::int64_t block_rows,
                         std::int64_t block_cols) {
    const auto w = *ck->view(name);
    const auto sc = *ck->view(official_scale_name(name));
    quant::ScaledMatrix m;
    m.element = t;
    m.rows = w.dim(0);
    m.cols = t == quant::QuantType::kF4E2M1x2 ? 2 * w.dim(1) : w.dim(1);
    m.weights = w.bytes;
    m.scales = {quant::ScaleFormat::kE8M0, block_rows, block_cols, sc.bytes};
    auto f = quant::dequantize(m);
    EXPECT_TRUE(f.ok()) << name << ": " << f.status().to_string();
    return f.ok() ? std::move(f).value() : std::vector<float>{};
  };
  auto add = [&](const std::string& name, Shape shape, std::vector<float> values) {
    keep.push_back(std::move(values));
    const auto* p = reinterpret_cast<const std::uint8_t*>(keep.back().data());
    out.push_back({name, DType::kF32, std::move(shape), {p, keep.back().size() * sizeof(float)}});
  };
  std::set<std::string> expert_layers;
  for (const auto& [name, stored] : ck->tensors()) {
    if (name.ends_with(".scale")) continue;
    if (const auto at = name.find("ffn.experts."); at != std::string::npos) {
      expert_layers.insert(name.substr(0, at));
      continue;
    }
    const auto hf = deepseek_v4_hf_name(name);
    ASSERT_TRUE(hf.has_value()) << name;
    const auto v = *ck->view(name);
    if (v.dtype == DType::kF8E4M3) {
      add(*hf, v.shape, dequantised(name, quant::QuantType::kF8E4M3, 128, 128));
    } else {
      keep_raw.emplace_back(v.bytes.begin(), v.bytes.end());
      out.push_back({*hf, v.dtype, v.shape, keep_raw.back()});
    }
  }
  for (const auto& L : expert_layers) {
    std::vector<float> gate_up, down;
    Shape gu_shape, dn_shape;
    for (std::int64_t e = 0; e < experts; ++e) {
      for (const auto p : {DsExpertProjection::kGate, DsExpertProjection::kUp}) {
        const auto f = dequantised(official_expert_name(L, e, p) + ".weight",
                                   quant::QuantType::kF4E2M1x2, 1, 32);
        gate_up.insert(gate_up.end(), f.begin(), f.end());
      }
      const auto name = official_expert_name(L, e, DsExpertProjection::kDown) + ".weight";
      const auto f = dequantised(name, quant::QuantType::kF4E2M1x2, 1, 32);
      down.insert(down.end(), f.begin(), f.end());
      dn_shape = {experts, ck->view(name)->dim(0), 2 * ck->view(name)->dim(1)};
    }
    gu_shape = {experts, static_cast<std::int64_t>(gate_up.size()) / experts / dn_shape[1],
                dn_shape[1]};
    add(L + "mlp.experts.gate_up_proj", gu_shape, std::move(gate_up));
    add(L + "mlp.experts.down_proj", dn_shape, std::move(down));
  }
  std::filesystem::create_directories(dst);
  ASSERT_TRUE(write_safetensors(dst + "/model.safetensors", out).ok());
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
}

// The name map, the expert stacking and the scales as the loader reads them, exactly: the
// official folder computes what the f32 model on its dequantised weights computes.
TEST(DeepseekV4Official, ComputesWhatItsDequantisedWeightsCompute) {
  test::ScratchDir dir;
  const auto fp4 = converted(dir, test::hf_tiny("deepseek_v4"), true, "fp4");
  write_dequantised(fp4, dir.file("dequantised"), 8);
  auto quantised = load_or_fail(fp4);
  auto reference = load_or_fail(dir.file("dequantised"));
  ASSERT_NE(quantised, nullptr);
  ASSERT_NE(reference, nullptr);
  const auto c = test::qwen_cases(test::hf_tiny("deepseek_v4")).back();
  const auto L = static_cast<std::int64_t>(c.tokens.size());
  auto sq = quantised->new_state();
  auto sr = reference->new_state();
  const auto got = test::run_splits(*quantised, *sq, c.tokens, {L});
  const auto want = test::run_splits(*reference, *sr, c.tokens, {L});
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(got.empty());
  const auto d = test::diff_logits(got, want, quantised->info().vocab_size);
  std::printf("[fp4 official vs dequantised f32 %s] L=%lld max|d|=%.3g argmax mismatches=%lld\n",
              test::test_backend().c_str(), static_cast<long long>(L), d.max_abs,
              static_cast<long long>(d.argmax_mismatches));
  EXPECT_LE(d.max_abs, dequantised_tolerance());
}

// models/deepseek-v4-tiny carries an MTP block: on its quantised weights greedy MTP at depths
// 1-3 emits exactly the autoregressive tokens of the same model.
TEST(DeepseekV4Official, GreedyMtpEmitsTheAutoregressiveTokensOnQuantisedWeights) {
  test::ScratchDir dir;
  auto m = load_or_fail(converted(dir, kTinyServable, true, "fp4"));
  ASSERT_NE(m, nullptr);
  ASSERT_NE(m->mtp(), nullptr) << "the MTP block did not load from the official names";
  const std::vector<TokenId> prompt = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
  GenerateOptions opt;
  opt.max_tokens = 24;
  DecodeState ar_state = new_decode_state(*m);
  ASSERT_TRUE(extend(*m, ar_state, prompt).ok());
  const auto ar = generate(*m, ar_state, opt);
  ASSERT_TRUE(ar.error.ok()) << ar.error.to_string();
  for (int depth = 1; depth <= kMaxMtpDepth; ++depth) {
    opt.mtp_depth = depth;
    DecodeState s = new_decode_state(*m);
    ASSERT_TRUE(extend(*m, s, prompt).ok());
    const auto r = generate(*m, s, opt);
    ASSERT_TRUE(r.error.ok()) << r.error.to_string();
    EXPECT_EQ(r.tokens, ar.tokens) << "depth " << depth;
    EXPECT_TRUE(r.state_complete);
  }
}

// Rewrites `src` into `dst` with one stored tensor dropped, given one more column, or retyped
// (same bytes, another dtype of the same size).
struct Edit {
  std::string drop, widen, retype;
  DType to = DType::kU8;
};
Edit dropped(const std::string& n) {
  return {n, "", "", DType::kU8};
}
Edit widened(const std::string& n) {
  return {"", n, "", DType::kU8};
}
Edit retyped(const std::string& n, DType to) {
  return {"", "", n, to};
}

void rewrite(const std::string& src, const std::string& dst, const Edit& edit) {
  auto ck = Checkpoint::open(src);
  ASSERT_TRUE(ck.ok());
  std::vector<TensorToWrite> out;
  std::vector<std::vector<std::uint8_t>> keep;
  keep.reserve(ck->tensors().size());
  bool edited = false;
  for (const auto& [name, stored] : ck->tensors()) {
    if (name == edit.drop) {
      edited = true;
      continue;
    }
    const auto v = *ck->view(name);
    Shape shape = v.shape;
    DType dtype = v.dtype;
    keep.emplace_back(v.bytes.begin(), v.bytes.end());
    if (name == edit.widen) {
      shape.back() += 1;
      keep.back().resize(static_cast<std::size_t>(shape_numel(shape)) * dtype_size(v.dtype));
      edited = true;
    }
    if (name == edit.retype) dtype = edit.to, edited = true;
    out.push_back({stored.stored_name, dtype, shape, keep.back()});
  }
  ASSERT_TRUE(edited) << edit.drop << edit.widen << edit.retype;
  std::filesystem::create_directories(dst);
  ASSERT_TRUE(write_safetensors(dst + "/model.safetensors", out).ok());
  std::filesystem::copy_file(src + "/config.json", dst + "/config.json");
}

TEST(DeepseekV4Official, InconsistentFoldersAreRefusedByName) {
  test::ScratchDir dir;
  const auto fp4 = converted(dir, test::hf_tiny("deepseek_v4"), true, "fp4");
  const std::string dense = "layers.2.attn.wq_a", expert = "layers.3.ffn.experts.5.w1";
  struct Case {
    Edit edit;
    std::string says, names;
  };
  const std::vector<Case> cases = {
      {dropped(dense + ".scale"), "lacks", dense + ".scale"},
      {widened(dense + ".scale"), "128x128 blocks", dense + ".scale"},
      {retyped(dense + ".scale", DType::kI8), "expected F32 or F8_E8M0", dense + ".scale"},
      {retyped(dense + ".weight", DType::kI8), "has dtype I8", dense + ".weight"},
      {dropped(expert + ".scale"), "lacks", expert + ".scale"},
      {widened(expert + ".scale"), "[32, 3]", expert + ".scale"},
      {retyped(expert + ".weight", DType::kU8), "expected I8", expert + ".weight"},
      {retyped(expert + ".scale", DType::kU8), "expected F8_E8M0", expert + ".scale"},
  };
  int index = 0;
  for (const auto& c : cases) {
    const auto bad = dir.file("bad" + std::to_string(index++));
    rewrite(fp4, bad, c.edit);
    auto m = load_model(bad, test::test_load_options());
    ASSERT_FALSE(m.ok()) << c.names;
    const auto msg = m.status().to_string();
    EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.names), std::string::npos) << msg;
  }
}

TEST(DeepseekV4Official, InspectReportsStorageAndDecodeBytes) {
  test::ScratchDir dir;
  const auto fp4 = converted(dir, test::hf_tiny("deepseek_v4"), true, "fp4");
  auto r = inspect_model_dir(fp4);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->official_names);
  EXPECT_TRUE(r->complete()) << (r->missing_tensors.empty() ? "" : r->missing_tensors[0])
                             << (r->unexpected_tensors.empty() ? "" : r->unexpected_tensors[0])
                             << (r->mismatched_tensors.empty() ? "" : r->mismatched_tensors[0]);
  auto find = [&](const std::string& n) -> const TensorStorage* {
    for (const auto& t : r->tensors)
      if (t.name == n) return &t;
    return nullptr;
  };
  const auto* wq_a = find("layers.2.attn.wq_a.weight");
  ASSERT_NE(wq_a, nullptr);
  EXPECT_EQ(wq_a->format, "F8_E4M3 with 128x128 E8M0 scales");
  EXPECT_EQ(wq_a->hf_name, "layers.2.self_attn.q_a_proj.weight");
  EXPECT_EQ(wq_a->bytes, 32u * 64u + 1u);  // codes and one block's scale
  EXPECT_EQ(wq_a->decode_bytes, wq_a->bytes);
  EXPECT_EQ(find("layers.2.attn.wq_a.scale"), nullptr);  // counted with its weight
  const auto* w1 = find("layers.2.ffn.experts.0.w1.weight");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->format, "F4_E2M1 with 1x32 E8M0 scales");
  EXPECT_EQ(w1->bytes, 32u * 32u + 32u * 2u);
  EXPECT_EQ(w1->decode_bytes, w1->bytes * 2 / 8);  // top-2 of 8 experts
  const auto* embed = find("embed.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->decode_bytes, 64u * 4u);  // one f32 row of 64
  std::uint64_t sum = 0;
  for (const auto& t : r->tensors) sum += t.decode_bytes;
  EXPECT_EQ(sum, r->decode_bytes + r->mtp_decode_bytes);
  EXPECT_EQ(r->experts, 8);
  EXPECT_EQ(r->experts_per_token, 2);
  // Parameters as the f32 folder counts them: FP4 bytes hold two weights.
  auto f32 = inspect_model_dir(test::hf_tiny("deepseek_v4"));
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(r->parameters, f32->parameters);
  EXPECT_LT(r->decode_bytes, f32->decode_bytes / 2);
}

}  // namespace
}  // namespace fs
