// `flashserve bench` on the CPU with tiny shapes: the harness end to end (synthetic weights, a
// synthetic context, forced MTP acceptance, the profiled pass) and the JSON it reports. Figures
// are not asserted (benchmarks never pass or fail on time); fields and invariants are.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/backend.h"
#include "bench/bench_config.h"
#include "bench/bench_run.h"
#include "bench/decode_bytes.h"
#include "bench/fill.h"
#include "bench/timing_backend.h"
#include "bench/weight_mix.h"
#include "test_support.h"

namespace fs::bench {
namespace {

TEST(BenchFill, HostFillIsDeterministicAndInRange) {
  Tensor a(host_memory(), {1000}, DType::kF32), b(host_memory(), {1000}, DType::kF32);
  ASSERT_TRUE(fill_uniform(a, 7, 0.5f, 1.0f).ok());
  ASSERT_TRUE(fill_uniform(b, 7, 0.5f, 1.0f).ok());
  double mean = 0;
  for (std::int64_t i = 0; i < 1000; ++i) {
    EXPECT_EQ(a.data()[i], b.data()[i]);
    EXPECT_GE(a.data()[i], 0.5f);
    EXPECT_LT(a.data()[i], 1.5f);
    mean += a.data()[i] / 1000.0;
  }
  EXPECT_NEAR(mean, 1.0, 0.05);
  Tensor c(host_memory(), {1000}, DType::kF32);
  ASSERT_TRUE(fill_uniform(c, 8, 0.5f, 1.0f).ok());
  EXPECT_NE(a.data()[0], c.data()[0]);
}

TEST(BenchBytes, ReleasedShapesCountOnlyRoutedExpertsAndTheSelection) {
  auto c = parse_bench_config(flash_next_config_json(48, 100'000));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const auto at_1k = trunk_decode_bytes(*c, 1024, 2);
  const auto at_64k = trunk_decode_bytes(*c, 65536, 2);
  // Weights do not depend on the context; the state grows only by the indexer's pooled keys
  // once the selection is full (budget 2048 keys), so 1k -> 64k adds 16k blocks x 128 x f32
  // per QSA layer, plus the keys the selection reads beyond 1k.
  EXPECT_EQ(at_1k.weights, at_64k.weights);
  const double blocks = (65537 / 4 - 1025 / 4) * 128.0 * 4 * 12;
  const double keys = ((2048 - 1024) + (65537 % 4 - 1025 % 4)) * 2.0 * 512 * 4 * 12;
  EXPECT_NEAR(at_64k.state - at_1k.state, blocks + keys, 1.0);
  // Full model, bf16: per layer about 98 MB of routed experts (10 of 512), 10 MB shared, 26 MB of
  // hyper-connection mixers and 125 MB of GDN projections; 13.8 GB in all with the lm_head, far
  // below the 241 GB the experts alone hold. At 8 layers this is the "3.28 GB per token"
  // orientation figure to within a few percent.
  EXPECT_GT(at_1k.weights, 12.5e9);
  EXPECT_LT(at_1k.weights, 14.5e9);
  auto c8 = parse_bench_config(flash_next_config_json(8, 100'000));
  ASSERT_TRUE(c8.ok());
  EXPECT_NEAR(trunk_decode_bytes(*c8, 1024, 2).total(), 3.28e9, 0.15e9);
  auto more_experts = flash_next_config_json(48, 100'000);
  more_experts["num_experts"] = 1024;
  auto c2 = parse_bench_config(more_experts);
  ASSERT_TRUE(c2.ok());
  // Doubling E adds only router rows (E x H bf16 per layer).
  EXPECT_NEAR(trunk_decode_bytes(*c2, 1024, 2).weights - at_1k.weights, 48 * 512 * 2560 * 2.0, 1.0);
}

nlohmann::json run_tiny(std::string* log_text) {
  BenchOptions o;
  o.backend = "cpu";
  o.prefill = {16, 40};
  o.contexts = {24, 70};
  o.decode_tokens = 6;
  o.accept = 1.0;
  std::ostringstream log;
  auto r = run_bench(o, log);
  *log_text = log.str();
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : nlohmann::json{};
}

TEST(BenchRun, TinyCpuRunReportsEveryFigure) {
  std::string log;
  const auto r = run_tiny(&log);
  ASSERT_FALSE(r.is_null()) << log;
  EXPECT_EQ(r["shapes"], "tiny");
  EXPECT_EQ(r["layers"], 4);
  EXPECT_EQ(r["context_fill"], "synthetic");
  ASSERT_EQ(r["prefill"].size(), 2u);
  for (const auto& p : r["prefill"]) EXPECT_GT(p["tokens_per_s"].get<double>(), 0);
  ASSERT_EQ(r["decode"].size(), 2u);
  for (const auto& d : r["decode"]) {
    EXPECT_GT(d["bytes_per_token"]["total"].get<double>(), 0);
    ASSERT_EQ(d["modes"].size(), 4u);  // autoregressive + depths 1-3
    for (const auto& m : d["modes"]) {
      EXPECT_GT(m["tokens_per_s"].get<double>(), 0);
      EXPECT_TRUE(std::isfinite(m["tokens_per_s"].get<double>()));
      const int depth = m["depth"];
      if (depth == 0) continue;
      // Greedy MTP is exact, and at a forced acceptance of 1 every draft is kept: a round
      // emits 1 + depth tokens (the last round may be cut by max_tokens).
      EXPECT_TRUE(m["equals_autoregressive"].get<bool>()) << "depth " << depth;
      EXPECT_EQ(m["tokens"], 6);
      EXPECT_DOUBLE_EQ(m["measured_accept"].get<double>(), 1.0);
      ASSERT_EQ(m["accept_given_reached"].size(), static_cast<std::size_t>(depth));
      for (const auto& a : m["accept_given_reached"]) EXPECT_DOUBLE_EQ(a.get<double>(), 1.0);
      EXPECT_GE(m["tokens_per_round"].get<double>(), (6.0) / ((6 + depth) / (depth + 1)));
      // A round's halves are timed, and together take less than the whole run's time a round.
      const double draft = m["draft_ms_per_round"], verify = m["verify_ms_per_round"];
      EXPECT_GT(draft, 0) << "depth " << depth;
      EXPECT_GT(verify, 0) << "depth " << depth;
      EXPECT_LE((draft + verify) * m["rounds"].get<double>(), m["seconds"].get<double>() * 1e3);
      EXPECT_GT(m["autoregressive_ms_per_token"].get<double>(), 0);
    }
  }
  ASSERT_TRUE(r.contains("profile"));
  const auto& p = r["profile"];
  EXPECT_GT(p["ops_per_token"].get<double>(), 10);
  EXPECT_GT(p["groups"]["gemv_linear"]["ops_per_token"].get<double>(), 0);
  EXPECT_GT(p["groups"]["routed_experts"]["ops_per_token"].get<double>(), 0);
  EXPECT_GT(p["groups"]["gdn"]["ops_per_token"].get<double>(), 0);
  EXPECT_GT(p["groups"]["attention_indexer"]["ops_per_token"].get<double>(), 0);
  EXPECT_EQ(p["groups"]["lm_head"]["ops_per_token"].get<double>(), 1.0);
  // The profiled prefill (of the first length, 16 tokens): its groups, and its ops by name,
  // largest first, which together are the groups' time (every timed op has a name).
  ASSERT_TRUE(r.contains("profile_prefill"));
  const auto& pp = r["profile_prefill"];
  EXPECT_EQ(pp["tokens"], 16);
  EXPECT_GT(pp["groups"]["routed_experts"]["ops"].get<long long>(), 0);
  ASSERT_GT(pp["ops"].size(), 5u);
  double by_op = 0, by_group = 0, last = 1e300;
  for (const auto& op : pp["ops"]) {
    const double ms = op["ms"];
    EXPECT_LE(ms, last) << op["op"];
    last = ms;
    by_op += ms;
  }
  for (const auto& [name, g] : pp["groups"].items()) by_group += g["ms"].get<double>();
  EXPECT_NEAR(by_op, by_group, 1e-6 * by_group + 1e-9);
  bool moe = false;
  for (const auto& op : pp["ops"]) moe = moe || op["op"].get<std::string>().starts_with("moe_");
  EXPECT_TRUE(moe);
  const auto table = bench_table(r);
  EXPECT_NE(table.find("the largest ops:"), std::string::npos);
}

TEST(BenchRun, ForcedAcceptanceZeroKeepsNoDraftAndStaysExact) {
  BenchOptions o;
  o.backend = "cpu";
  o.prefill = {8};
  o.contexts = {20};
  o.decode_tokens = 5;
  o.accept = 0.0;
  o.profile = false;
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  for (const auto& m : (*r)["decode"][0]["modes"]) {
    if (m["depth"] == 0) continue;
    EXPECT_EQ(m["accepted"], 0);
    // The first position is reached every round and never accepted; later ones never reached.
    const auto& given = m["accept_given_reached"];
    ASSERT_EQ(given.size(), m["depth"].get<std::size_t>());
    EXPECT_DOUBLE_EQ(given[0].get<double>(), 0.0);
    for (std::size_t k = 1; k < given.size(); ++k) EXPECT_TRUE(given[k].is_null()) << k;
    EXPECT_TRUE(m["equals_autoregressive"].get<bool>());
    EXPECT_DOUBLE_EQ(m["tokens_per_round"].get<double>(), 1.0);
  }
}

// Drafts over the first 128 of the tiny model's 512 ids: the draft reads fewer head rows, the
// output is still the autoregressive one, partial acceptances included.
TEST(BenchRun, DraftVocabularyCutsTheDraftBytesAndStaysExact) {
  BenchOptions o;
  o.backend = "cpu";
  o.prefill = {8};
  o.contexts = {20};
  o.decode_tokens = 7;
  o.accept = 0.5;
  o.profile = false;
  std::ostringstream log;
  auto full = run_bench(o, log);
  ASSERT_TRUE(full.ok()) << full.status().to_string();
  o.draft_vocab = 128;
  auto cut = run_bench(o, log);
  ASSERT_TRUE(cut.ok()) << cut.status().to_string();
  EXPECT_EQ((*full)["draft_vocab"], 512);
  EXPECT_EQ((*cut)["draft_vocab"], 128);
  const auto draft_weights = [](const nlohmann::json& r) {
    return r["decode"][0]["mtp_draft_bytes"]["weights"].get<double>();
  };
  // 384 fewer rows of the 64-wide bf16 output head.
  EXPECT_NEAR(draft_weights(*full) - draft_weights(*cut), 384.0 * 64 * 2, 1.0);
  for (const auto& m : (*cut)["decode"][0]["modes"]) {
    if (m["depth"] == 0) continue;
    EXPECT_TRUE(m["equals_autoregressive"].get<bool>()) << "depth " << m["depth"];
  }
  o.draft_vocab = 513;
  EXPECT_FALSE(run_bench(o, log).ok());
}

// The CPU bench on tiny shapes at one context, no MTP and no profiled pass: what the sampled and
// scored modes add to.
BenchOptions tiny_decode_bench(std::int64_t tokens) {
  BenchOptions o;
  o.backend = "cpu";
  o.prefill = {8};
  o.contexts = {20};
  o.decode_tokens = tokens;
  o.max_depth = 0;
  o.profile = false;
  return o;
}

// --temperature adds sampled autoregressive decoding with the picks on the backend and with the
// rows on the host; top_p 0.9 over the tiny vocabulary is decided inside every row's top, so the
// backend run reads no row back and picks every token after the first from a row's top, with
// --presence-penalty / --frequency-penalty too.
TEST(BenchRun, TemperatureAddsTheSampledFigureOnBothPaths) {
  BenchOptions o = tiny_decode_bench(9);
  o.temperature = 0.9;
  o.top_p = 0.9;
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& s = (*r)["decode"][0]["sampled"];
  EXPECT_GT(s["backend_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(s["host_tokens_per_s"].get<double>(), 0);
  EXPECT_EQ(s["rows_from_top"].get<std::int64_t>(), o.decode_tokens - 1);
  EXPECT_EQ(s["rows_read_back"].get<std::int64_t>(), 0);
  EXPECT_NE(bench_table(*r).find("sampled AR at context 20 (T 0.90, top_p 0.90, top_k 0, "
                                 "presence 0.00, frequency 0.00, repetition 1.00)"),
            std::string::npos);
  // With penalties the rows are penalised where they lie: still every row from its top.
  o.presence_penalty = 0.7;
  o.frequency_penalty = 0.2;
  auto penalised = run_bench(o, log);
  ASSERT_TRUE(penalised.ok()) << penalised.status().to_string();
  const auto& p = (*penalised)["decode"][0]["sampled"];
  EXPECT_EQ(p["presence_penalty"].get<double>(), 0.7);
  EXPECT_EQ(p["frequency_penalty"].get<double>(), 0.2);
  EXPECT_EQ(p["rows_from_top"].get<std::int64_t>(), o.decode_tokens - 1);
  EXPECT_EQ(p["rows_read_back"].get<std::int64_t>(), 0);
  EXPECT_NE(bench_table(*penalised)
                .find("presence 0.70, frequency 0.20, repetition 1.00): picks on the backend"),
            std::string::npos);
  // The repetition penalty reaches the context's tokens too: entries on the backend as well.
  o.repetition_penalty = 1.1;
  auto repeated = run_bench(o, log);
  ASSERT_TRUE(repeated.ok()) << repeated.status().to_string();
  const auto& q = (*repeated)["decode"][0]["sampled"];
  EXPECT_EQ(q["repetition_penalty"].get<double>(), 1.1);
  EXPECT_EQ(q["rows_from_top"].get<std::int64_t>(), o.decode_tokens - 1);
  EXPECT_EQ(q["rows_read_back"].get<std::int64_t>(), 0);
  EXPECT_NE(bench_table(*repeated).find("frequency 0.20, repetition 1.10): picks on the backend"),
            std::string::npos);
  // Without a prefix rule the top cannot decide a row: each draw is made on the backend, and
  // only its id comes back.
  o.top_p = 1.0;
  auto every = run_bench(o, log);
  ASSERT_TRUE(every.ok()) << every.status().to_string();
  const auto& e = (*every)["decode"][0]["sampled"];
  EXPECT_EQ(e["rows_drawn"].get<std::int64_t>(), o.decode_tokens - 1);
  EXPECT_EQ(e["rows_from_top"].get<std::int64_t>(), 0);
  EXPECT_EQ(e["rows_read_back"].get<std::int64_t>(), 0);
  EXPECT_NE(bench_table(*every).find("(0 rows from their top, 8 drawn there, 0 read back)"),
            std::string::npos);
  // And sampled MTP with the model's head at each depth: on the backend every draft, verify and
  // correction is a draw there (no row comes back), the same tokens as the host path's.
  o.max_depth = 2;
  o.presence_penalty = o.frequency_penalty = 0;
  o.repetition_penalty = 1;
  auto mtp = run_bench(o, log);
  ASSERT_TRUE(mtp.ok()) << mtp.status().to_string();
  const auto& sm = (*mtp)["decode"][0]["sampled"];
  ASSERT_TRUE(sm.contains("mtp"));
  ASSERT_EQ(sm["mtp"].size(), 2u);
  for (const auto& m : sm["mtp"]) {
    EXPECT_GT(m["backend_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(m["host_tokens_per_s"].get<double>(), 0);
    EXPECT_GT(m["rounds"].get<std::int64_t>(), 0);
    EXPECT_GT(m["rows_drawn"].get<std::int64_t>(), 0);
    EXPECT_EQ(m["rows_read_back"].get<std::int64_t>(), 0);
    EXPECT_EQ(m["rows_from_top"].get<std::int64_t>(), 0);
    EXPECT_TRUE(m["same_tokens_on_both"].get<bool>());
  }
  EXPECT_NE(bench_table(*mtp).find("  sampled MTP depth 2: picks on the backend"),
            std::string::npos);
  o.max_depth = 0;
  o.temperature = 0;
  auto greedy = run_bench(o, log);
  ASSERT_TRUE(greedy.ok());
  EXPECT_FALSE((*greedy)["decode"][0].contains("sampled"));
}

// --top-logprobs adds greedy decoding that scores every token, on both paths.
TEST(BenchRun, TopLogprobsAddsTheScoredFigureOnBothPaths) {
  BenchOptions o = tiny_decode_bench(6);
  o.top_logprobs = 5;
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const auto& s = (*r)["decode"][0]["logprobs"];
  EXPECT_EQ(s["top_logprobs"].get<int>(), 5);
  EXPECT_GT(s["backend_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(s["host_tokens_per_s"].get<double>(), 0);
  EXPECT_NE(bench_table(*r).find("greedy AR with logprobs at context 20 (top 5): scored on the "
                                 "backend"),
            std::string::npos);
  o.top_logprobs = 0;
  auto plain = run_bench(o, log);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)["decode"][0].contains("logprobs"));
}

// `--dtype fp8`: synthetic block-scaled FP8 projections (bf16 for the rest), the same harness;
// MTP stays exact on them, and the bytes per token count one byte per projection weight.
TEST(BenchRun, Fp8WeightsRunAndCountOneBytePerProjectionWeight) {
  BenchOptions o;
  o.backend = "cpu";
  o.prefill = {8};
  o.contexts = {20};
  o.decode_tokens = 5;
  o.profile = false;
  o.dtype = "fp8";
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ((*r)["matrix_dtype"], "fp8");
  for (const auto& m : (*r)["decode"][0]["modes"]) {
    EXPECT_GT(m["tokens_per_s"].get<double>(), 0);
    if (m["depth"] != 0) {
      EXPECT_TRUE(m["equals_autoregressive"].get<bool>()) << m["depth"];
    }
  }
  o.dtype = "int4";
  EXPECT_FALSE(run_bench(o, log).ok());
  // Released shapes: FP8 reads a little over half the bf16 bytes (the bf16 lm_head, embedding
  // row, routers and hyper-connection matrices keep their two bytes: ~6% of the rest).
  auto c = parse_bench_config(flash_next_config_json(48, 100'000));
  ASSERT_TRUE(c.ok());
  const auto bf16 = trunk_decode_bytes(*c, 1024, kBf16Matrices);
  const auto fp8 = trunk_decode_bytes(*c, 1024, kFp8Matrices);
  EXPECT_EQ(bf16.weights, trunk_decode_bytes(*c, 1024, 2).weights);
  EXPECT_EQ(fp8.state, bf16.state);
  const double head = 2.0 * static_cast<double>(c->vocab_size * c->hidden_size);
  EXPECT_GT(fp8.weights, (bf16.weights - head) / 2 + head);
  EXPECT_LT(fp8.weights, (bf16.weights - head) * 0.6 + head);
}

TEST(BenchMix, RolesTakeTheirTypeAndRowsOfPartBlocksFallBack) {
  using quant::QuantType;
  auto q4 = weight_mix("q4_k");
  ASSERT_TRUE(q4.ok());
  EXPECT_EQ(q4->storage(MatrixRole::kProjection, 2560).packed, QuantType::kQ4_K);
  // The experts' 640-wide down rows are not whole 256-blocks: Q8_0, as llama.cpp falls back.
  EXPECT_EQ(q4->storage(MatrixRole::kExpertDown, 640).packed, QuantType::kQ8_0);
  EXPECT_FALSE(q4->storage(MatrixRole::kOther, 2560).packed.has_value());
  EXPECT_FALSE(q4->storage(MatrixRole::kProjection, 48).packed.has_value());  // not even 32s
  auto ds4 = weight_mix("iq2_xxs");
  ASSERT_TRUE(ds4.ok());
  EXPECT_EQ(ds4->storage(MatrixRole::kExpertGateUp, 4096).packed, QuantType::kIQ2_XXS);
  EXPECT_EQ(ds4->storage(MatrixRole::kExpertDown, 2048).packed, QuantType::kQ2_K);
  EXPECT_EQ(ds4->storage(MatrixRole::kProjection, 4096).packed, QuantType::kQ8_0);
  auto fp4 = weight_mix("fp4");
  ASSERT_TRUE(fp4.ok());
  EXPECT_EQ(fp4->storage(MatrixRole::kExpertDown, 640).packed, QuantType::kF4E2M1x2);
  EXPECT_TRUE(fp4->storage(MatrixRole::kProjection, 2560).fp8());
  EXPECT_DOUBLE_EQ(fp4->storage(MatrixRole::kExpertGateUp, 2560).bytes_per_weight(),
                   0.5 + 1.0 / 32);
  EXPECT_DOUBLE_EQ(q4->storage(MatrixRole::kProjection, 2560).bytes_per_weight(), 144.0 / 256);
  EXPECT_FALSE(weight_mix("int4").ok());

  // Released shapes: each lower-bit mix reads fewer bytes a token, the bf16 head unchanged.
  auto c = parse_bench_config(flash_next_config_json(48, 100'000));
  ASSERT_TRUE(c.ok());
  double last = trunk_decode_bytes(*c, 1024, kBf16Matrices).weights;
  auto weights_of = [&](const char* name) {
    return trunk_decode_bytes(*c, 1024, matrix_bytes(*weight_mix(name), *c)).weights;
  };
  for (const char* name : {"fp8", "q6_k", "q4_k", "q2_k"}) {
    EXPECT_LT(weights_of(name), last) << name;
    last = weights_of(name);
  }
  // ds4's mix keeps Q8_0 projections: between Q8_0 everywhere and Q2_K everywhere.
  EXPECT_LT(weights_of("iq2_xxs"), weights_of("q8_0"));
  EXPECT_GT(weights_of("iq2_xxs"), weights_of("q2_k"));
  EXPECT_EQ(trunk_decode_bytes(*c, 1024, matrix_bytes(*weight_mix("fp8"), *c)).weights,
            trunk_decode_bytes(*c, 1024, kFp8Matrices).weights);
}

TEST(BenchFill, PackedBlocksDequantiseToFiniteWeightsNearTheScale) {
  using quant::QuantType;
  for (const auto q : {QuantType::kQ8_0, QuantType::kQ4_K, QuantType::kQ5_K, QuantType::kQ6_K,
                       QuantType::kQ2_K, QuantType::kIQ2_XXS}) {
    Weight w;
    w.dtype = DType::kU8;
    w.shape = {4, 512};
    w.packed = q;
    Tensor bytes(host_memory(), {static_cast<std::int64_t>(w.bytes())}, DType::kU8);
    ASSERT_TRUE(fill_packed(bytes, q, 3, 0.05f).ok()) << quant::quant_name(q);
    w.data = static_cast<const std::uint8_t*>(bytes.raw());
    float amax = 0;
    std::vector<float> row(512);
    for (std::int64_t r = 0; r < 4; ++r) {
      ASSERT_TRUE(w.dequantize_row(r, row).ok());
      for (const float v : row) {
        ASSERT_TRUE(std::isfinite(v)) << quant::quant_name(q);
        amax = std::max(amax, std::fabs(v));
      }
    }
    EXPECT_GT(amax, 0.01f) << quant::quant_name(q);
    EXPECT_LT(amax, 0.2f) << quant::quant_name(q);
  }
}

TEST(BenchRun, PackedMixesRunExactAndStoreFewerBytes) {
  BenchOptions o;
  o.backend = "cpu";
  o.prefill = {8};
  o.contexts = {20};
  o.decode_tokens = 4;
  o.max_depth = 2;
  o.profile = false;
  std::ostringstream log;
  auto bf16 = run_bench(o, log);
  ASSERT_TRUE(bf16.ok()) << bf16.status().to_string();
  for (const char* name : {"q8_0", "fp4"}) {
    o.dtype = name;
    auto r = run_bench(o, log);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().to_string();
    EXPECT_EQ((*r)["matrix_dtype"], name);
    auto stored = [](const nlohmann::json& run) {
      return run["weights"]["device_bytes"].get<double>() +
             run["weights"]["host_bytes"].get<double>();
    };
    EXPECT_LT(stored(*r), stored(*bf16)) << name;
    for (const auto& m : (*r)["decode"][0]["modes"]) {
      EXPECT_GT(m["tokens_per_s"].get<double>(), 0);
      if (m["depth"] != 0) {
        EXPECT_TRUE(m["equals_autoregressive"].get<bool>()) << name;
      }
    }
  }
}

// The overlapped op-group pass needs dry ops: the CPU cannot run them, says so and adds nothing.
// A short autoregressive run with the overlapped op-group pass on `backend`, tiny shapes.
BenchOptions marginal_options(const std::string& backend) {
  BenchOptions o;
  o.backend = backend;
  o.tiny = true;
  o.prefill = {};
  o.contexts = {20};
  o.decode_tokens = 6;
  o.max_depth = 0;
  o.profile = false;
  o.marginal = true;
  return o;
}

TEST(BenchRun, MarginalPassIsSkippedWhereOpsCannotRunDry) {
  const BenchOptions o = marginal_options("cpu");
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->contains("marginal"));
  EXPECT_NE(log.str().find("cannot run ops dry"), std::string::npos) << log.str();
}

// On a GPU every group gets its share, and the step without a group is a step that still runs
// (its outputs are stale memory, not errors).
TEST(BenchRun, MarginalPassGivesEveryGroupAShareOnTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const BenchOptions o = marginal_options("cuda");
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string() << "\n" << log.str();
  ASSERT_TRUE(r->contains("marginal")) << log.str();
  const auto& m = (*r)["marginal"];
  EXPECT_GT(m["ms_per_token"].get<double>(), 0);
  for (const char* g : {"gemv_linear", "routed_experts", "gdn", "attention_indexer",
                        "norms_hyper_connections", "lm_head"}) {
    ASSERT_TRUE(m["groups"].contains(g)) << g;
    ASSERT_FALSE(m["groups"][g].contains("error")) << g << ": " << m["groups"][g]["error"];
    EXPECT_GT(m["groups"][g]["ms_per_token_without"].get<double>(), 0) << g;
  }
  EXPECT_NE(bench_table(*r).find("share of the overlapped"), std::string::npos);
}

// --marginal-ops: every op kind of the step by its method name, each with its calls per token and
// a step that still ran without it.
TEST(BenchRun, MarginalOpsGiveEachOpKindAShareOnTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  BenchOptions o = marginal_options("cuda");
  o.marginal_ops = true;
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string() << "\n" << log.str();
  const auto& ops = (*r)["marginal"]["ops"];
  for (const char* op :
       {"hyper_connection_read", "gated_delta_net_in_proj", "block_sparse_attention"}) {
    ASSERT_TRUE(ops.contains(op)) << op << "\n" << ops.dump(1);
    ASSERT_FALSE(ops[op].contains("error")) << op << ": " << ops[op]["error"];
    EXPECT_GT(ops[op]["calls_per_token"].get<double>(), 0) << op;
    EXPECT_GT(ops[op]["ms_per_token_around"].get<double>(), 0) << op;
    EXPECT_GT(ops[op]["ms_per_token_without"].get<double>(), 0) << op;
  }
  for (const auto& [name, v] : ops.items())
    EXPECT_EQ(name.find_first_of("(: "), std::string::npos) << "a mangled op name: " << name;
  // linear by its weight's shape: at least the lm_head's and one projection's.
  int linears = 0;
  for (const auto& [name, v] : ops.items()) linears += name.rfind("linear[", 0) == 0 ? 1 : 0;
  EXPECT_GE(linears, 2) << ops.dump(1);
  // Index-producing ops are never dry on their own (a stale index is an out-of-bounds read).
  EXPECT_FALSE(ops.contains("select_blocks"));
  EXPECT_NE(log.str().find("bench: op "), std::string::npos);
}

// --marginal-verify: the CPU cannot run ops dry, so no verify pass, said in the log.
TEST(BenchRun, MarginalVerifyIsSkippedWhereOpsCannotRunDry) {
  BenchOptions o = marginal_options("cpu");
  o.marginal = false;
  o.marginal_verify = 2;
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->contains("marginal_verify"));
  EXPECT_NE(log.str().find("no verify pass"), std::string::npos) << log.str();
}

// On a GPU: the round's verify and draft times, and each op kind of the round (the verify's
// multi-token ops and the draft's head ops) with its calls per round; the index ops never dry.
TEST(BenchRun, MarginalVerifyGivesEachOpKindAShareOfTheRoundOnTheGpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  BenchOptions o = marginal_options("cuda");
  o.marginal = false;
  o.marginal_verify = 2;
  o.decode_tokens = 8;
  std::ostringstream log;
  auto r = run_bench(o, log);
  ASSERT_TRUE(r.ok()) << r.status().to_string() << "\n" << log.str();
  ASSERT_TRUE(r->contains("marginal_verify")) << log.str();
  const auto& m = (*r)["marginal_verify"];
  EXPECT_EQ(m["depth"].get<int>(), 2);
  EXPECT_GT(m["verify_ms_per_round"].get<double>(), 0);
  EXPECT_GT(m["draft_ms_per_round"].get<double>(), 0);
  const auto& ops = m["ops"];
  for (const char* op : {"hyper_connection_read", "gated_delta_net_in_proj"}) {
    ASSERT_TRUE(ops.contains(op)) << op << "\n" << ops.dump(1);
    ASSERT_FALSE(ops[op].contains("error")) << op << ": " << ops[op]["error"];
    EXPECT_GT(ops[op]["calls_per_round"].get<double>(), 0) << op;
  }
  EXPECT_FALSE(ops.contains("select_blocks"));
  EXPECT_NE(bench_table(*r).find("share of an MTP round at depth 2"), std::string::npos);
}

// `--marginal-ops` dries one op kind at a time by the name of its Backend method: the names come
// from the wrappers' signatures, so a wrapper that named the wrong op (or a compiler that spells
// signatures differently) would show up here as a missing or mangled name.
TEST(TimingBackend, CountsOpsByTheirBackendMethodNames) {
  auto inner = make_backend("cpu");
  ASSERT_TRUE(inner.ok()) << inner.status().to_string();
  TimingBackend t(std::move(*inner), 1000);
  Tensor x = t.new_tensor({1, 4}), y = t.new_tensor({1, 4});
  t.upload_rows(std::vector<float>{1, 2, 3, 4}, 4, x);
  t.upload_rows(std::vector<float>{1, 1, 1, 1}, 4, y);
  t.add(x, y);  // not counted: counting is off
  t.set_count_ops(true);
  t.add(x, y);
  t.add(x, y);
  t.scale(x, 0.5f);
  // linear is keyed by its weight's shape (the out-projections apart from the PLE's).
  const std::vector<float> wv(8, 0.25f);
  const Weight w{DType::kF32, {2, 4}, reinterpret_cast<const std::uint8_t*>(wv.data())};
  Tensor out;
  t.linear(x, w, out);
  t.set_count_ops(false);
  t.mul(x, y);
  ASSERT_TRUE(t.status().ok()) << t.status().to_string();
  const auto& counts = t.op_counts();
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts.at("add"), 2);
  EXPECT_EQ(counts.at("scale"), 1);
  EXPECT_EQ(counts.at("linear[2x4]"), 1);
  // A dry op on a backend that cannot run dry still runs (the CPU computes it).
  t.set_dry_op("add");
  t.add(x, y);
  t.set_dry_op(std::nullopt);
  // x[0]: 1, three adds of 1 (one uncounted) make 4, the scale 2, the mul by ones 2, the dry add 3.
  EXPECT_FLOAT_EQ(x.to_host_vector()[0], 3.0f);
}

TEST(BenchCli, CpuCommandPrintsJsonAndCudaWithoutGpuSaysSo) {
  test::ScratchDir dir;
  std::string text;
  const auto file = dir.file("bench.json");
  const auto cmd = "(" + test::flashserve_binary() +
                   " bench --backend cpu --prefill 8 --contexts 16 --decode-tokens 3 --max-depth 1 "
                   "--no-profile --json " +
                   file + " 2>/dev/null)";
  ASSERT_EQ(test::run_command(cmd, &text), 0) << text;
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["decode"][0]["modes"].size(), 2u);
  EXPECT_FALSE(j.contains("profile"));
  EXPECT_FALSE(test::read_bytes(file).empty());
  if (!cuda_available()) {
    // No GPU: the default backend fails with a message that names the way out.
    ASSERT_NE(test::run_command(test::flashserve_binary() + " bench --contexts 16", &text), 0);
    EXPECT_NE(text.find("--backend cpu"), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace fs::bench
