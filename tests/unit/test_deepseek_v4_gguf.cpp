// DeepSeek V4 from GGUF files of ds4's layout (model/gguf_config.h, model/gguf_tensors.h), made
// from the hf-tiny fixture at test time (tests/support/ds4_gguf_writer.h): an F32 file gives the
// HF reference's logits as the safetensors checkpoint does; a Q8_0/F16 file gives the logits of a
// safetensors twin holding the same dequantised weights, the packed weights computed on as
// stored; the fused experts are deferred and, on a device, assembled one at a time inside the fit
// check; the CLI runs on the file (tokenizer.json beside it for text); ds4's MTP side file is
// found and drafts as the twin's head does; and a file whose metadata, tensors or bytes disagree
// with the model is refused with the reason.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "ds4_gguf_writer.h"
#include "model/deepseek_v4/weights.h"
#include "model/gguf_config.h"
#include "model/gguf_tensors.h"
#include "model/loader.h"
#include "model/weight_upload.h"
#include "qwen_fixture.h"
#include "recording_device.h"
#include "session/checkpoint.h"
#include "test_backend.h"
#include "test_support.h"

namespace fs {
namespace {

using quant::QuantType;
using test::diff_logits;

std::string fixture() {
  return test::hf_tiny("deepseek_v4");
}

// The same weights through two containers: on the CPU every product dequantises rows exactly as
// the twin's f32 values (bit-for-bit in the op suite), on CUDA the packed kernels sum in another
// order.
double twin_tolerance() {
  return test::test_backend() == "cpu" ? 1e-5 : 1e-3;
}
// The bound on the f32 engine against the float64 reference (as test_deepseek_v4.cpp).
constexpr double kParityTolerance = 1e-3;

// Options with one edit (designated initializers would leave the rest to -Wextra's complaints).
template <typename Edit>
test::Ds4GgufOptions with(Edit edit) {
  test::Ds4GgufOptions o;
  edit(o);
  return o;
}
test::Ds4GgufOptions quantised() {
  return with([](auto& o) {
    o.matrices = QuantType::kQ8_0;
    o.small = QuantType::kF16;
  });
}

std::string write_gguf(const test::ScratchDir& dir, const test::Ds4GgufOptions& o,
                       test::Ds4Gguf* out = nullptr) {
  auto g = test::make_ds4_gguf(fixture(), o);
  EXPECT_TRUE(g.ok()) << g.status().to_string();
  if (!g.ok()) return "";
  const auto path = dir.file("tiny-ds4.gguf");
  test::write_bytes(path, g->file);
  if (out) *out = std::move(g).value();
  return path;
}

std::vector<float> logits_of(const std::string& model, const test::QwenCase& c) {
  auto m = load_model(model, test::test_load_options());
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return {};
  auto state = (*m)->new_state();
  return test::run_splits(**m, *state, c.tokens, c.splits);
}

TEST(DeepseekV4Gguf, F32FileMatchesTheReference) {
  test::ScratchDir dir;
  const auto path = write_gguf(dir, {});
  const auto c = test::qwen_cases(fixture()).front();
  const auto got = logits_of(path, c);
  const auto ref = diff_logits(got, c.inc, 256);
  const auto st = diff_logits(got, logits_of(fixture(), c), 256);
  std::printf("[ds4 gguf f32 %s] vs HF max|d|=%.3g, vs safetensors max|d|=%.3g\n",
              test::test_backend().c_str(), ref.max_abs, st.max_abs);
  EXPECT_LE(ref.max_abs, kParityTolerance);
  EXPECT_EQ(ref.argmax_mismatches, 0);
  EXPECT_LE(st.max_abs, twin_tolerance());
}

TEST(DeepseekV4Gguf, Q8AndF16FileMatchesItsDequantisedTwin) {
  test::ScratchDir dir;
  test::Ds4Gguf g;
  const auto path = write_gguf(dir, quantised(), &g);
  ASSERT_TRUE(test::write_safetensors_twin(g, fixture(), dir.file("twin")).ok());
  const auto c = test::qwen_cases(fixture()).front();
  const auto got = logits_of(path, c);
  const auto twin = logits_of(dir.file("twin"), c);
  const auto d = diff_logits(got, twin, 256);
  // The quantised weights were computed with (the fixture's near-tied random logits move by
  // O(1) under Q8_0 rounding, as under the official numerics, so only a difference is asserted).
  const auto ref = diff_logits(got, c.inc, 256);
  std::printf("[ds4 gguf q8_0 %s] vs twin max|d|=%.3g, vs HF max|d|=%.3g (%lld argmax moved)\n",
              test::test_backend().c_str(), d.max_abs, ref.max_abs,
              static_cast<long long>(ref.argmax_mismatches));
  ASSERT_EQ(got.size(), twin.size());
  EXPECT_LE(d.max_abs, twin_tolerance());
  EXPECT_EQ(d.argmax_mismatches, 0);
  EXPECT_GT(ref.max_abs, 1e-3);
}

// The weights as the loader sees them: packed types viewed in the mapped file (no dequantised
// copy), the fused gate_up assembled from the two halves in the order HF fuses them.
TEST(DeepseekV4Gguf, PackedWeightsViewTheFileAndGateUpIsFused) {
  test::ScratchDir dir;
  test::Ds4Gguf g;
  const auto path = write_gguf(dir, quantised(), &g);
  auto t = GgufTensors::open(path);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const auto q = (*t)->weight("layers.1.self_attn.q_b_proj.weight");
  EXPECT_EQ(q.storage(), QuantType::kQ8_0);
  EXPECT_TRUE(q.is_packed());
  EXPECT_EQ(q.bytes(), static_cast<std::size_t>(q.rows() * (q.cols() / 32) * 34));
  EXPECT_EQ((*t)->weight("embed_tokens.weight").dtype, DType::kF16);
  const std::string name = "layers.2.mlp.experts.gate_up_proj";
  // Deferred until assembled (a device load assembles, uploads and frees one at a time).
  EXPECT_TRUE((*t)->weight(name).empty());
  const auto gu = (*t)->assemble(name);
  const auto& want = g.values.at(name);
  ASSERT_EQ(gu.shape, want.shape);
  EXPECT_EQ(gu.storage(), QuantType::kQ8_0);
  std::vector<float> row(static_cast<std::size_t>(gu.cols()));
  for (std::int64_t r = 0; r < gu.rows(); ++r) {
    ASSERT_TRUE(gu.dequantize_row(r, row).ok());
    for (std::size_t j = 0; j < row.size(); ++j)
      ASSERT_EQ(row[j], want.values[static_cast<std::size_t>(r) * row.size() + j]) << r << " " << j;
  }
  // The same weight again is the same assembled buffer, not a second copy.
  EXPECT_EQ((*t)->assemble(name).data, gu.data);
  EXPECT_EQ((*t)->weight(name).data, gu.data);
  (*t)->release(name);
  EXPECT_TRUE((*t)->weight(name).empty());
}

TEST(DeepseekV4Gguf, CliLogitsAndGenerateOnTheFile) {
  test::ScratchDir dir;
  const auto path = write_gguf(dir, quantised());
  const auto c = test::qwen_cases(fixture()).front();
  std::string tokens, text;
  for (const auto t : c.tokens) tokens += (tokens.empty() ? "" : ",") + std::to_string(t);
  const auto out = dir.file("l.f32");
  ASSERT_EQ(test::run_command(test::flashserve_binary() + " logits --backend " +
                                  test::test_backend() + " --dtype f32 --model " + path +
                                  " --tokens " + tokens + " --out " + out,
                              &text),
            0)
      << text;
  // The CLI runs the prompt as one call: compared with the library's one call (the case's own
  // splits take other product paths and were 1.3e-5 apart on one machine).
  auto whole = c;
  whole.splits = {static_cast<std::int64_t>(c.tokens.size())};
  const auto d = diff_logits(test::read_f32(out), logits_of(path, whole), 256);
  EXPECT_LE(d.max_abs, twin_tolerance());
  ASSERT_EQ(test::run_command(test::flashserve_binary() + " generate --backend " +
                                  test::test_backend() + " --model " + path + " --tokens " +
                                  tokens + " --max-tokens 4 --temperature 0 --json --save-state " +
                                  dir.file("turn.state"),
                              &text),
            0)
      << text;
  EXPECT_NE(text.find("\"tokens\""), std::string::npos) << text;
  // The saved state is bound to the file's fingerprint (config, tensor index, bytes).
  EXPECT_TRUE(std::filesystem::exists(dir.file("turn.state")));
  // Text needs a tokenizer.json beside the file; without one the error says so.
  EXPECT_NE(
      test::run_command(test::flashserve_binary() + " generate --backend " + test::test_backend() +
                            " --model " + path + " --prompt hello --max-tokens 2",
                        &text),
      0);
  EXPECT_NE(text.find("tokenizer.json beside it"), std::string::npos) << text;
}

// On a device the fused experts are assembled, uploaded and freed one at a time, after the rest,
// and counted in the fit check before anything is copied.
TEST(DeepseekV4Gguf, DeviceUploadAssemblesTheExpertsOneAtATime) {
  test::ScratchDir dir;
  test::Ds4Gguf g;
  const auto path = write_gguf(dir, quantised(), &g);
  auto d = describe_gguf_model(path);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  const auto& c = std::get<DeepseekV4Config>(d->config);
  auto w = load_deepseek_v4_weights(c, path);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  for (const auto& lw : w->layers) EXPECT_TRUE(lw.moe.gate_up.empty()) << "deferred until upload";
  // Every byte but the experts' fits; with them, not: refused before a copy.
  std::uint64_t experts = 0;
  for (const auto& lw : w->layers) experts += lw.moe.gate_up.bytes();
  test::RecordingDevice small(kLoadHeadroomBytes + experts);
  const Status refused = upload_deepseek_v4_weights(*w, small, DType::kF32);
  EXPECT_FALSE(refused.ok());
  EXPECT_TRUE(small.copies.empty()) << small.copies.size() << " weights copied before the refusal";
  test::RecordingDevice dev(kLoadHeadroomBytes * 4);
  ASSERT_TRUE(upload_deepseek_v4_weights(*w, dev, DType::kF32).ok());
  for (std::size_t i = 0; i < w->layers.size(); ++i) {
    const auto name = "layers." + std::to_string(i) + ".mlp.experts.gate_up_proj";
    const Weight& up = w->layers[i].moe.gate_up;
    ASSERT_FALSE(up.empty()) << name;
    EXPECT_TRUE(w->gguf->weight(name).empty()) << name << ": the host copy was freed";
    // The device copy holds the fused tensor, gate rows then up rows per expert.
    const auto& want = g.values.at(name).values;
    std::vector<float> row(static_cast<std::size_t>(up.cols()));
    for (std::int64_t r = 0; r < up.rows(); r += 7) {
      ASSERT_TRUE(up.dequantize_row(r, row).ok());
      for (std::size_t j = 0; j < row.size(); ++j)
        ASSERT_EQ(row[j], want[static_cast<std::size_t>(r) * row.size() + j]) << name << " " << r;
    }
  }
}

// The greedy text turn `generate --prompt` gives on `model`: its text and ids (the stats carry
// timings, so they are left out).
std::string greedy_text_turn(const std::string& model) {
  std::string text;
  EXPECT_EQ(test::run_command(test::flashserve_binary() + " generate --backend " +
                                  test::test_backend() + " --dtype f32 --model " + model +
                                  " --prompt 'def add(a, b):' --max-tokens 6 --temperature 0 "
                                  "--mtp-depth 0 --json 2>/dev/null",
                              &text),
            0)
      << text;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  EXPECT_TRUE(j.is_object()) << text;
  return j.is_object() ? j["text"].dump() + j["tokens"].dump() : text;
}

// The servable tiny folder (models/deepseek-v4-tiny, with a tokenizer) as a GGUF file with its
// tokenizer files beside it: text in, the folder's own greedy continuation out.
TEST(DeepseekV4Gguf, TextCommandsReadTheTokenizerBesideTheFile) {
  test::ScratchDir dir;
  const std::string folder = std::string(FLASHSERVE_SOURCE_DIR) + "/models/deepseek-v4-tiny";
  auto g = test::make_ds4_gguf(folder);
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const auto path = dir.file("ds4-tiny.gguf");
  test::write_bytes(path, g->file);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "generation_config.json"})
    std::filesystem::copy_file(std::filesystem::path(folder) / f, dir.path() / f);
  EXPECT_EQ(greedy_text_turn(path), greedy_text_turn(folder));
  // A chat turn: the chat format follows the file's architecture (DeepSeek V4's encoding).
  std::string text;
  EXPECT_EQ(
      test::run_command(test::flashserve_binary() + " run --backend " + test::test_backend() +
                            " --model " + path + " --max-tokens 4 --temperature 0 --chat 'hello'",
                        &text),
      0)
      << text;
}

// The same file carrying its own tokenizer (tokenizer.ggml.*, as llama.cpp's converter writes
// them) and nothing beside it: the text turn equals the folder's.
TEST(DeepseekV4Gguf, TextCommandsReadTheTokenizerInsideTheFile) {
  test::ScratchDir dir;
  const std::string folder = std::string(FLASHSERVE_SOURCE_DIR) + "/models/deepseek-v4-tiny";
  auto g = test::make_ds4_gguf(folder, with([](auto& o) { o.tokenizer = true; }));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  const auto path = dir.file("ds4-tiny.gguf");
  test::write_bytes(path, g->file);
  EXPECT_EQ(greedy_text_turn(path), greedy_text_turn(folder));
  // A pre-tokenizer name the table lacks is refused with the reason, not guessed.
  auto bad = test::make_ds4_gguf(folder, with([](auto& o) {
                                   o.tokenizer = true;
                                   o.tokenizer_pre = "not-a-real-pre";
                                 }));
  ASSERT_TRUE(bad.ok());
  const auto bad_path = dir.file("bad.gguf");
  test::write_bytes(bad_path, bad->file);
  std::string text;
  EXPECT_NE(
      test::run_command(test::flashserve_binary() + " generate --backend " + test::test_backend() +
                            " --model " + bad_path + " --prompt hello --max-tokens 2",
                        &text),
      0);
  EXPECT_NE(text.find("'not-a-real-pre' has no split known here"), std::string::npos) << text;
}

// ds4's MTP side file: a block made by tools/make_ds4_mtp.py, written as a second GGUF of
// `mtp.0.*` names beside the trunk's, is found and drafts as the safetensors folder's does
// (greedy: the same tokens, the same drafts accepted); two such files are refused.
TEST(DeepseekV4Gguf, MtpSideFileBesideTheModelDrafts) {
  test::ScratchDir dir;
  const auto folder = dir.file("with-mtp");
  std::string text;
  ASSERT_EQ(test::run_command("python3 " FLASHSERVE_SOURCE_DIR "/tools/make_ds4_mtp.py --model " +
                                  fixture() + " --out " + folder,
                              &text),
            0)
      << text;
  // Q8_0 where the packed products equal the twin's f32 ones bit for bit (the CPU); elsewhere F32,
  // so that a greedy near-tie cannot tell the two containers apart.
  const bool exact = test::test_backend() == "cpu";
  auto g = test::make_ds4_gguf(folder, with([&](auto& o) {
                                 if (exact) o.matrices = QuantType::kQ8_0;
                                 o.mtp_side_file = true;
                               }));
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  ASSERT_FALSE(g->mtp_file.empty());
  const auto gguf_dir = dir.path() / "gguf";
  std::filesystem::create_directories(gguf_dir);
  const auto path = (gguf_dir / "tiny-ds4-Q8_0.gguf").string();
  test::write_bytes(path, g->file);
  const auto alone = model_fingerprint(path);
  test::write_bytes((gguf_dir / "tiny-ds4-MTP-Q8_0.gguf").string(), g->mtp_file);
  // Saved states are bound to the side file too.
  const auto with_side = model_fingerprint(path);
  ASSERT_TRUE(alone.ok() && with_side.ok());
  EXPECT_NE(*alone, *with_side);
  ASSERT_TRUE(test::write_safetensors_twin(*g, folder, dir.file("twin")).ok());
  auto m = load_model(path, test::test_load_options());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_TRUE((*m)->info().has_mtp);
  const auto c = test::qwen_cases(fixture()).front();
  std::string tokens;
  for (std::size_t i = 0; i < 24; ++i) tokens += (i ? "," : "") + std::to_string(c.tokens[i]);
  auto generate = [&](const std::string& model) {
    std::string out;
    EXPECT_EQ(test::run_command(test::flashserve_binary() + " generate --backend " +
                                    test::test_backend() + " --dtype f32 --model " + model +
                                    " --tokens " + tokens +
                                    " --max-tokens 12 --temperature 0 --mtp-depth 2 --json",
                                &out),
              0)
        << out;
    const auto j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << out;
    return j.is_object()
               ? j["tokens"].dump() + j["stats"]["drafted"].dump() + j["stats"]["accepted"].dump()
               : out;
  };
  const auto from_file = generate(path);
  std::printf("[ds4 gguf mtp %s] %s\n", test::test_backend().c_str(), from_file.c_str());
  EXPECT_EQ(from_file, generate(dir.file("twin")));
  test::write_bytes((gguf_dir / "copy-mtp.gguf").string(), g->mtp_file);
  auto two = load_model(path, test::test_load_options());
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().to_string().find("two MTP side files"), std::string::npos)
      << two.status().to_string();
}

// The reason a file is refused with, "" when it loads.
std::string refusal(const test::Ds4GgufOptions& o,
                    void (*edit)(std::vector<std::uint8_t>&) = nullptr) {
  test::ScratchDir dir;
  auto g = test::make_ds4_gguf(fixture(), o);
  if (!g.ok()) return "writer: " + g.status().to_string();
  if (edit) edit(g->file);
  const auto path = dir.file("bad.gguf");
  test::write_bytes(path, g->file);
  auto m = load_model(path, test::test_load_options());
  if (!m.ok()) std::printf("[ds4 gguf refused] %s\n", m.status().to_string().c_str());
  return m.ok() ? "" : m.status().to_string();
}

TEST(DeepseekV4Gguf, InconsistentFilesAreRefusedWithTheReason) {
  EXPECT_NE(refusal(with([](auto& o) {
              o.drop_keys = {"hash_layer_count"};
            })).find("deepseek4.hash_layer_count"),
            std::string::npos);
  EXPECT_NE(refusal(with([](auto& o) {
              o.drop_keys = {"attention.compress_ratios"};
            })).find("attention.compress_ratios"),
            std::string::npos);
  EXPECT_NE(refusal(with([](auto& o) {
              o.drop_tensors = {"blk.3.attn_q_b.weight"};
            })).find("layers.3.self_attn.q_b_proj.weight"),
            std::string::npos);
  // Only one half of the fused experts.
  EXPECT_NE(refusal(with([](auto& o) {
              o.drop_tensors = {"blk.2.ffn_up_exps.weight"};
            })).find("blk.2.ffn_gate_exps"),
            std::string::npos);
  EXPECT_NE(refusal(with([](auto& o) { o.architecture = "llama"; })).find("architecture 'llama'"),
            std::string::npos);
  // Cut inside the data: the reader refuses before any tensor is handed out.
  const auto cut = refusal({}, [](std::vector<std::uint8_t>& f) { f.resize(f.size() - 1000); });
  EXPECT_FALSE(cut.empty());
  const auto header = refusal({}, [](std::vector<std::uint8_t>& f) { f.resize(100); });
  EXPECT_FALSE(header.empty());
  std::printf("[ds4 gguf refusals] cut: %s\n  header: %s\n", cut.c_str(), header.c_str());
}

TEST(DeepseekV4Gguf, TensorsDisagreeingWithTheMetadataAreRefused) {
  // Metadata saying the experts are 64 wide, tensors 32 wide: the fused tensor is named with the
  // shape the config implies.
  const auto wide = refusal(with([](auto& o) {
    o.u32_values = {{"expert_feed_forward_length", 64}};
  }));
  EXPECT_NE(wide.find("blk.0.ffn_gate_exps.weight + blk.0.ffn_up_exps.weight"), std::string::npos)
      << wide;
  EXPECT_NE(wide.find("[8, 128, 64]"), std::string::npos) << wide;
  // Halves of different types cannot be fused.
  const auto mixed = refusal(with([](auto& o) {
    o.matrices = QuantType::kQ8_0;
    o.types = {{"blk.1.ffn_up_exps.weight", QuantType::kF32}};
  }));
  EXPECT_NE(mixed.find("must agree to be fused"), std::string::npos) << mixed;
  // A vector in a block type the loader does not read (F64 is no weight type).
  const auto odd = refusal(with([](auto& o) {
    o.types = {{"blk.0.attn_norm.weight", QuantType::kF64}};
  }));
  EXPECT_NE(odd.find("blk.0.attn_norm.weight"), std::string::npos) << odd;
  // A head count the tensors contradict.
  const auto heads = refusal(with([](auto& o) { o.u32_values = {{"attention.head_count", 8}}; }));
  EXPECT_NE(heads.find("has shape"), std::string::npos) << heads;
}

}  // namespace
}  // namespace fs
