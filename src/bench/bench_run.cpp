#include "bench/bench_run.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>
#include <string_view>

#include "bench/bench_config.h"
#include "bench/chain_timeline.h"
#include "bench/decode_bytes.h"
#include "bench/device_probe.h"
#include "bench/fill.h"
#include "bench/forced_drafter.h"
#include "bench/synthetic_context.h"
#include "bench/synthetic_weights.h"
#include "bench/timing_backend.h"
#include "decode/generator.h"
#include "model/qwen_next/forward.h"
#if FLASHSERVE_HAVE_CUDA
#include "backend/cuda/chain_trace.h"
#endif

namespace fs::bench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<TokenId> random_tokens(std::int64_t n, std::int64_t vocab, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<TokenId> d(1, static_cast<TokenId>(vocab - 1));
  std::vector<TokenId> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

constexpr std::int64_t kReleasedLayers = 48;

// The layer count: the option, or the largest multiple of 4 whose weights fit beside the fixed
// weights, the MTP head and the reserve.
Expected<std::int64_t> pick_layers(const BenchOptions& o, bool tiny) {
  if (o.layers > 0) return o.layers;
  if (tiny) return 4;
  auto free = device_free_bytes();
  if (!free.ok()) return free.status();
  auto probe = parse_bench_config(flash_next_config_json(4, o.ple_head_rows));
  if (!probe.ok()) return probe.status();
  auto mix = weight_mix(o.dtype);
  if (!mix.ok()) return mix.status();
  const auto b = weight_budget(*probe, matrix_bytes(*mix, *probe));
  const double per4 = 3.0 * static_cast<double>(b.linear_layer) + static_cast<double>(b.qsa_layer);
  const double room = static_cast<double>(*free) - static_cast<double>(b.fixed + b.mtp) -
                      static_cast<double>(o.reserve_mib) * 1024.0 * 1024.0;
  const auto groups = static_cast<std::int64_t>(room / per4);
  if (groups < 1) return internal_error("bench: not even 4 layers fit in the device's free memory");
  return std::min<std::int64_t>(4 * groups, kReleasedLayers);
}

struct Bench {
  const BenchOptions& o;
  std::ostream& log;
  QwenNextConfig config;
  QwenNextModel* model = nullptr;
  TimingBackend* timing = nullptr;

  Expected<double> time_prefill(std::int64_t n) {
    DecodeState s = new_decode_state(*model);
    const auto tokens = random_tokens(n, config.vocab_size, static_cast<std::uint32_t>(o.seed + n));
    const auto t0 = Clock::now();
    if (auto st = extend(*model, s, tokens); !st.ok()) return st;
    return seconds_since(t0);
  }

  struct Run {
    GenerateResult result;
    double seconds = 0;
  };
  Expected<Run> decode(const DecodeState& base, std::int64_t tokens, int depth, Drafter* drafter,
                       const SamplerConfig& sampler = {}, PickOn pick_on = PickOn::kAuto,
                       int top_logprobs = 0) {
    DecodeState s = base.clone();
    GenerateOptions g;
    if (top_logprobs > 0) {
      g.top_logprobs = top_logprobs;
      g.on_logprobs = [](const TokenLogprobs&) {};
    }
    g.max_tokens = tokens;
    g.mtp_depth = depth;
    g.drafter = drafter;
    g.seed = o.seed;
    g.sampler = sampler;
    g.pick_on = pick_on;
    const auto t0 = Clock::now();
    Run r;
    r.result = generate(*model, s, g);
    r.seconds = seconds_since(t0);
    if (!r.result.error.ok()) return r.result.error;
    return r;
  }
};

// Ops whose outputs are indices that later ops read addresses from (the picked blocks, the routed
// experts) are never dry on their own: stale memory there is an out-of-bounds read, not a stale
// value (session 17's first run faulted late in the pass, most likely so). Their groups' shares
// cover them, with their consumers.
bool is_index_op(std::string_view name) {
  constexpr std::array<std::string_view, 4> kIndexOps = {"select_blocks", "topk", "route_experts",
                                                         "select_experts"};
  return std::find(kIndexOps.begin(), kIndexOps.end(), name) != kIndexOps.end();
}

// The overlapped op-group pass (BenchOptions::marginal). A dry group leaves its outputs as the
// memory held them (values of earlier steps), so the ops after it do their usual work; what a
// dry run cannot remove are device copies (cache appends, slices), counted with what stays.
Expected<json> marginal_pass(Bench& b, const QwenNextConfig& c, const BenchOptions& o) {
  if (!b.timing->can_run_dry()) {
    b.log << "bench: the " << b.timing->name() << " backend cannot run ops dry: no marginal pass\n";
    return json();
  }
  DecodeState base = new_decode_state(*b.model);
  if (auto s = fill_synthetic_context(*b.model, c, o.contexts.front(), o.seed, base); !s.ok())
    return s;
  const auto n = o.decode_tokens;
  auto ms_per_token = [&]() -> Expected<double> {
    if (auto w = b.decode(base, 3, 0, nullptr); !w.ok()) return w.status();
    auto r = b.decode(base, n, 0, nullptr);
    if (!r.ok()) return r.status();
    return 1e3 * r->seconds / static_cast<double>(r->result.tokens.size());
  };
  auto full = ms_per_token();
  if (!full.ok()) return full.status();
  json groups = json::object();
  double shares = 0;
  for (std::size_t g = 0; g < kOpGroups; ++g) {
    const auto group = static_cast<OpGroup>(g);
    b.timing->set_dry_group(group);
    auto without = ms_per_token();
    b.timing->set_dry_group(std::nullopt);
    if (!without.ok()) {
      groups[op_group_name(group)] = {{"error", without.status().to_string()}};
      continue;
    }
    const double share = *full - *without;
    shares += share;
    groups[op_group_name(group)] = {{"ms_per_token_without", *without}, {"ms_per_token", share}};
    b.log << "bench: without " << op_group_name(group) << " " << *without << " ms per token ("
          << share << " ms its share)\n";
  }
  json ops = json::object();
  if (o.marginal_ops) {
    // The ops decode runs, by name and calls a token (over n tokens: the indexer's block
    // completions come every fourth token), then each one dry in turn. A single op's share is
    // small against the step's drift between runs (~1%, 60 us at FP8 48: session 17's first
    // run gave ~100 us to ops that run once a token and queue microseconds), so each dry run
    // is taken against the mean of full runs just before and just after it.
    b.timing->set_count_ops(true);
    auto counted = b.decode(base, n, 0, nullptr);
    b.timing->set_count_ops(false);
    if (!counted.ok()) return counted.status();
    const auto counts = b.timing->op_counts();
    const double counted_tokens =
        static_cast<double>(std::max<std::size_t>(1, counted->result.tokens.size()));
    auto before = ms_per_token();
    if (!before.ok()) return before.status();
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& [name, calls] : counts) {
      if (is_index_op(name)) continue;
      b.timing->set_dry_op(name);
      auto without = ms_per_token();
      b.timing->set_dry_op(std::nullopt);
      if (!without.ok()) {
        ops[name] = {{"error", without.status().to_string()}};
        continue;
      }
      auto after = ms_per_token();
      if (!after.ok()) return after.status();
      const double around = 0.5 * (*before + *after);
      const double share = around - *without;
      const double per_token = static_cast<double>(calls) / counted_tokens;
      ops[name] = {{"ms_per_token", share},
                   {"ms_per_token_without", *without},
                   {"ms_per_token_around", around},
                   {"calls_per_token", per_token}};
      ranked.emplace_back(share, name);
      before = after;
    }
    std::sort(ranked.rbegin(), ranked.rend());
    for (const auto& [share, name] : ranked) {
      const double per_token = ops[name]["calls_per_token"].get<double>();
      b.log << "bench: op " << name << " x" << per_token << ": " << share << " ms per token ("
            << 1e3 * share / std::max(per_token, 1e-9) << " us a call)\n";
    }
  }
  return json{{"context", o.contexts.front()},
              {"ms_per_token", *full},
              {"groups", groups},
              {"ops", ops},
              {"sum_of_shares_ms", shares},
              {"note",
               "a group's share is the step's time minus the step's time with that group's ops "
               "dry (host work kept, no device work queued; device copies stay): measured "
               "with launches overlapped as decode runs them"}};
}

// The MTP round's ops by name (BenchOptions::marginal_verify): MTP decode at depth D with the
// forced drafter, once with every op and once with each op kind dry, each op's share of the
// round's verify and of its draft (GenerateStats' halves, per round). A dry op changes the
// logits and so which drafts the verify accepts, but not what a round runs: a verify always
// takes D + 1 tokens and a draft D head steps, so the per-round times stay comparable. Each dry
// run is taken against the mean of the full runs just before and after it, as marginal_pass.
Expected<json> marginal_verify_pass(Bench& b, const QwenNextConfig& c, const BenchOptions& o) {
  if (!b.timing->can_run_dry() || !b.model->mtp()) {
    b.log << "bench: no MTP head or no dry ops on the " << b.timing->name()
          << " backend: no verify pass\n";
    return json();
  }
  const int depth = o.marginal_verify;
  DecodeState base = new_decode_state(*b.model);
  if (auto s = fill_synthetic_context(*b.model, c, o.contexts.front(), o.seed, base); !s.ok())
    return s;
  const auto n = o.decode_tokens;
  auto ref = b.decode(base, n + depth + 1, 0, nullptr);
  if (!ref.ok()) return ref.status();
  const bool head_on_backend = picks_on_backend(*b.model, GenerateOptions{});
  struct Round {
    double verify_ms = 0, draft_ms = 0;
  };
  std::uint32_t seed = 101;
  auto round_ms = [&]() -> Expected<Round> {
    ForcedAcceptanceDrafter warm(*b.model, ref->result.tokens, base.tokens.size(), o.accept,
                                 c.vocab_size, seed++, head_on_backend);
    if (auto w = b.decode(base, depth + 3, depth, &warm); !w.ok()) return w.status();
    ForcedAcceptanceDrafter drafter(*b.model, ref->result.tokens, base.tokens.size(), o.accept,
                                    c.vocab_size, seed++, head_on_backend);
    auto r = b.decode(base, n, depth, &drafter);
    if (!r.ok()) return r.status();
    const auto& st = r->result.stats;
    if (st.rounds == 0) return internal_error("bench: an MTP decode ran no rounds");
    const double rounds = static_cast<double>(st.rounds);
    return Round{static_cast<double>(st.verify_ns) / 1e6 / rounds,
                 static_cast<double>(st.draft_ns) / 1e6 / rounds};
  };
  b.timing->set_count_ops(true);
  ForcedAcceptanceDrafter counting(*b.model, ref->result.tokens, base.tokens.size(), o.accept,
                                   c.vocab_size, seed++, head_on_backend);
  auto counted = b.decode(base, n, depth, &counting);
  b.timing->set_count_ops(false);
  if (!counted.ok()) return counted.status();
  const auto counts = b.timing->op_counts();
  const double rounds =
      static_cast<double>(std::max<std::int64_t>(1, counted->result.stats.rounds));
  auto before = round_ms();
  if (!before.ok()) return before.status();
  const Round full = *before;
  json ops = json::object();
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [name, calls] : counts) {
    if (is_index_op(name)) continue;
    b.timing->set_dry_op(name);
    auto without = round_ms();
    b.timing->set_dry_op(std::nullopt);
    if (!without.ok()) {
      ops[name] = {{"error", without.status().to_string()}};
      continue;
    }
    auto after = round_ms();
    if (!after.ok()) return after.status();
    const double verify = 0.5 * (before->verify_ms + after->verify_ms) - without->verify_ms;
    const double draft = 0.5 * (before->draft_ms + after->draft_ms) - without->draft_ms;
    ops[name] = {{"verify_ms_per_round", verify},
                 {"draft_ms_per_round", draft},
                 {"calls_per_round", static_cast<double>(calls) / rounds}};
    ranked.emplace_back(verify, name);
    before = after;
  }
  std::sort(ranked.rbegin(), ranked.rend());
  for (const auto& [share, name] : ranked)
    b.log << "bench: verify op " << name << " x" << ops[name]["calls_per_round"].get<double>()
          << ": " << share << " ms a round's verify, "
          << ops[name]["draft_ms_per_round"].get<double>() << " ms its draft\n";
  return json{{"context", o.contexts.front()},
              {"depth", depth},
              {"verify_ms_per_round", full.verify_ms},
              {"draft_ms_per_round", full.draft_ms},
              {"ops", ops},
              {"note",
               "an op's share is the round's verify (draft) time minus that time with the op's "
               "calls dry, against the mean of the full runs around it; calls count the verify's "
               "and the draft's together"}};
}

// The chain timeline (BenchOptions::timeline; chain_timeline.h): autoregressive decode at the
// first context with the chain trace on, one trace a step (ended and begun again as each token
// is emitted, when the step's kernels have run), the steps split into launches, named from the
// launch log and averaged.
Expected<json> timeline_pass(Bench& b, const QwenNextConfig& c, const BenchOptions& o) {
#if FLASHSERVE_HAVE_CUDA
  if (b.timing->memory()->device() != Device::kCuda) {
    b.log << "bench: the timeline traces CUDA kernels: none on " << b.timing->name() << "\n";
    return json();
  }
  if (!cuda::chain_trace_built()) {
    b.log << "bench: built without the chain trace (configure with -DFLASHSERVE_CHAIN_TRACE=ON): "
             "no timeline\n";
    return json();
  }
  DecodeState base = new_decode_state(*b.model);
  if (auto s = fill_synthetic_context(*b.model, c, o.contexts.front(), o.seed, base); !s.ok())
    return s;
  // Warm: this state's step graph recorded (its launches logged) before the trace.
  if (auto w = b.decode(base, 3, 0, nullptr); !w.ok()) return w.status();
  // A step launched kernel by kernel is named from its own launches; a replayed step graph logs
  // none, and is named from the whole log (its recording).
  const auto recorded = cuda::chain_launches();
  std::size_t logged = cuda::chain_launch_count();
  // Block waits a step: ~3,000 a layer and the lm_head's; room for 48 layers several times over.
  constexpr std::size_t kCapacity = std::size_t{1} << 20;
  std::vector<std::vector<TimelineLaunch>> steps;
  std::uint64_t dropped = 0, resolution = 0;
  Status trace_error;
  const auto take = [&]() {
    auto t = cuda::chain_trace_end();
    if (!t.ok()) return t.status();
    dropped += t->waits - t->records.size();
    if (t->records.empty()) return Status::ok_status();
    if (resolution == 0) {  // the smallest step of the timer seen in the first step's records
      std::vector<std::uint64_t> times;
      for (const auto& r : t->records) {
        times.push_back(r.arrive);
        times.push_back(r.release);
      }
      std::sort(times.begin(), times.end());
      for (std::size_t i = 1; i < times.size(); ++i)
        if (times[i] > times[i - 1] && (resolution == 0 || times[i] - times[i - 1] < resolution))
          resolution = times[i] - times[i - 1];
    }
    auto step = split_launches(std::move(t->records));
    const auto own = cuda::chain_launches(logged);
    logged += own.size();
    name_launches(step, own.empty() ? recorded : own);
    steps.push_back(std::move(step));
    return Status::ok_status();
  };
  if (auto st = cuda::chain_trace_begin(kCapacity); !st.ok()) return st;
  DecodeState s = base.clone();
  GenerateOptions g;
  g.max_tokens = o.timeline + 1;
  g.seed = o.seed;
  g.on_token = [&](TokenId) {
    if (!trace_error.ok()) return;
    trace_error = take();
    if (trace_error.ok()) trace_error = cuda::chain_trace_begin(kCapacity);
  };
  const auto result = generate(*b.model, s, g);
  if (auto last = cuda::chain_trace_end(); !last.ok() && trace_error.ok())
    trace_error = last.status();
  if (!result.error.ok()) return result.error;
  if (!trace_error.ok()) return trace_error;
  const auto avg = average_steps(steps);
  json rows = json::array();
  std::map<std::string, std::pair<double, int>> by_kernel;  // hold us a step, launches a step
  double span = 0;
  for (const auto& l : avg.launches) {
    const auto name = l.kernel.empty() ? std::string("(unlogged)") : short_kernel_name(l.kernel);
    rows.push_back({{"kernel", name},
                    {"kernel_full", l.kernel},
                    {"blocks", l.blocks},
                    {"threads", l.threads},
                    {"waits", l.waits},
                    {"release_us", l.release},
                    {"hold_us", l.hold},
                    {"early", l.early},
                    {"last_arrival_us", l.last_arrival},
                    {"release_spread_us", l.release_spread}});
    auto& k = by_kernel[name];
    k.first += l.hold;
    k.second += 1;
    span = std::max(span, l.release);
  }
  json kernels = json::array();
  std::vector<std::pair<double, std::string>> ranked;
  for (const auto& [name, k] : by_kernel) ranked.emplace_back(k.first, name);
  std::sort(ranked.rbegin(), ranked.rend());
  for (const auto& [hold, name] : ranked)
    kernels.push_back({{"kernel", name},
                       {"launches_per_step", by_kernel[name].second},
                       {"hold_us_per_step", hold},
                       {"share", span > 0 ? hold / span : 0.0}});
  b.log << "bench: timeline of " << avg.used << " of " << avg.steps << " traced steps, "
        << avg.launches.size() << " launches a step over " << span << " us\n";
  return json{{"context", o.contexts.front()},
              {"steps_traced", avg.steps},
              {"steps_averaged", avg.used},
              {"launches_per_step", avg.launches.size()},
              {"span_us", span},
              {"waits_dropped", dropped},
              {"timer_resolution_ns_seen", resolution},
              {"kernels", kernels},
              {"launches", rows},
              {"note",
               "span: the step's first release to its last launch's release (its last kernel's "
               "own time is not seen); hold: the next launch's first release less this one's; "
               "early: the fraction of a launch's blocks that reached their wait 250 ns or more "
               "before its first release; last_arrival: its last block's arrival less its first "
               "release (> 0: blocks started after its inputs were complete)"}};
#else
  (void)c;
  (void)o;
  b.log << "bench: built without CUDA: no timeline\n";
  return json();
#endif
}

json bytes_json(const DecodeBytes& b) {
  return {{"weights", b.weights}, {"state", b.state}, {"total", b.total()}};
}

}  // namespace

Expected<json> run_bench(const BenchOptions& o, std::ostream& log) {
  const bool tiny = o.tiny || o.backend == "cpu";
  const auto mix = weight_mix(o.dtype);
  if (!mix.ok()) return mix.status();
  auto inner = make_backend(o.backend);
  if (!inner.ok()) {
    return inner.status().with_context(
        "bench: the '" + o.backend +
        "' backend is not available (on a machine without a GPU use --backend cpu, which runs "
        "tiny shapes)");
  }
  auto layers = pick_layers(o, tiny);
  if (!layers.ok()) return layers.status();
  const auto cj =
      tiny ? tiny_config_json(*layers) : flash_next_config_json(*layers, o.ple_head_rows);
  auto config = parse_bench_config(cj);
  if (!config.ok()) return config.status();
  const QwenNextConfig& c = *config;

  json out;
  out["backend"] = (*inner)->name();
  out["shapes"] = tiny ? "tiny" : "qwen3.8-flash-next";
  out["layers"] = c.num_hidden_layers;
  out["layers_released"] = 48;
  out["config"] = cj;
  out["ple_table_rows"] = ple_table_rows(c, 0);
  out["ple_table_rows_released"] = 320001536;
  out["matrix_dtype"] = o.dtype;
  if (o.dtype != "bf16") out["matrix_dtype_note"] = mix->note();
  out["context_fill"] = "synthetic";
  out["accept"] = o.accept;

  // Weights where the backend computes; the timing decorator wraps the backend for the model's
  // whole life (disabled outside the profiled pass).
#if FLASHSERVE_HAVE_CUDA
  // The timeline names its kernels from the launch log, which a step graph writes only when it is
  // recorded: on from the start.
  if (o.timeline > 0) cuda::set_chain_launch_log(true);
#endif
  auto timing_owner = std::make_unique<TimingBackend>(std::move(*inner), c.vocab_size);
  TimingBackend* timing = timing_owner.get();
  SyntheticWeightStore store(timing->memory(), o.seed);
  auto t0 = Clock::now();
  auto weights = synthetic_qwen_next_weights(c, store, *mix);
  if (!weights.ok()) return weights.status();
  timing->synchronize();
  out["weights"] = {{"device_bytes", store.device_bytes()},
                    {"host_bytes", store.host_bytes()},
                    {"generate_s", seconds_since(t0)}};
  log << "bench: " << c.num_hidden_layers << " layers, " << store.device_bytes() / 1e9
      << " GB of synthetic weights on " << timing->name() << ", " << store.host_bytes() / 1e9
      << " GB PLE table on the host\n";
  auto model = std::make_unique<QwenNextModel>(c, std::move(*weights), std::move(timing_owner));
  if (o.draft_vocab > 0 && model->mtp()) {
    if (auto s = model->mtp()->set_draft_vocabulary(o.draft_vocab); !s.ok()) return s;
  }
  const std::int64_t draft_vocab = model->mtp() ? model->mtp()->draft_vocabulary() : c.vocab_size;
  out["draft_vocab"] = draft_vocab;
  Bench b{o, log, c, model.get(), timing};

  double copy = 0;
  if (timing->memory()->device() == Device::kCuda) {
    auto bw = copy_bandwidth(std::size_t{4} << 30, 5);
    if (!bw.ok()) return bw.status();
    copy = *bw;
    out["copy_bandwidth_Bps"] = copy;
    out["copy_bandwidth_note"] = "cudaMemcpyAsync D2D of 4 GiB, best of 5, (read+write)/time";
  }

  // Decode at each context: autoregressive (the reference continuation too), then MTP.
  json decode = json::array();
  const auto n = o.decode_tokens;
  for (const auto ctx : o.contexts) {
    DecodeState base = new_decode_state(*model);
    if (auto s =
            fill_synthetic_context(*model, c, ctx, o.seed + static_cast<std::uint64_t>(ctx), base);
        !s.ok())
      return s.with_context("context " + std::to_string(ctx));
    if (auto w = b.decode(base, 3, 0, nullptr); !w.ok()) return w.status();  // warm-up
    const auto graphs_before = timing->step_graph_stats();
    const bool profiled = ctx == o.contexts.front();
    if (profiled) profiler_range_begin();
    auto ar = b.decode(base, n + o.max_depth + 1, 0, nullptr);
    if (profiled) profiler_range_end();
    if (!ar.ok()) return ar.status();
    const auto graphs_after = timing->step_graph_stats();
    const auto& ref = ar->result.tokens;
    const double ar_tps = static_cast<double>(ref.size()) / ar->seconds;
    const auto bytes = trunk_decode_bytes(c, ctx, matrix_bytes(*mix, c));
    json row = {{"context", ctx},
                {"bytes_per_token", bytes_json(bytes)},
                {"mtp_draft_bytes",
                 bytes_json(mtp_draft_bytes(c, ctx, matrix_bytes(*mix, c), draft_vocab))}};
    json modes = json::array();
    modes.push_back({{"depth", 0},
                     {"tokens", ref.size()},
                     {"seconds", ar->seconds},
                     {"tokens_per_s", ar_tps},
                     {"tokens_per_round", 1.0}});
    row["achieved_Bps"] = bytes.total() * ar_tps;
    if (copy > 0) row["fraction_of_copy"] = bytes.total() * ar_tps / copy;
    log << "bench: context " << ctx << " autoregressive " << ar_tps << " tok/s\n";
    if (graphs_after.launches > graphs_before.launches) {
      // Step graphs (docs/GPU.md): how many of the timed steps were recorded, how many replayed,
      // and the host time of a replay's walk.
      const auto replays = graphs_after.replays - graphs_before.replays;
      const double walk_us =
          replays > 0 ? static_cast<double>(graphs_after.walk_ns - graphs_before.walk_ns) / 1e3 /
                            static_cast<double>(replays)
                      : 0.0;
      row["step_graphs"] = {
          {"captures", graphs_after.captures - graphs_before.captures},
          {"replays", replays},
          {"walk_us_per_replay", walk_us},
          {"walk_leaked_nodes", graphs_after.walk_leaked_nodes - graphs_before.walk_leaked_nodes}};
      log << "bench: context " << ctx
          << " step graphs: " << graphs_after.captures - graphs_before.captures << " captures, "
          << replays << " replays, walk " << walk_us << " us per replay\n";
    }
    if (o.top_logprobs > 0) {
      // Greedy decoding that scores every token (a request with logprobs): scored where the rows
      // lie, or with every row on the host.
      json scored = {{"top_logprobs", o.top_logprobs}};
      for (const auto& [name, where] :
           {std::pair{"backend", PickOn::kBackend}, std::pair{"host", PickOn::kHost}}) {
        if (auto w = b.decode(base, 3, 0, nullptr, {}, where, o.top_logprobs); !w.ok())
          return w.status();
        auto r = b.decode(base, n, 0, nullptr, {}, where, o.top_logprobs);
        if (!r.ok()) return r.status();
        const double tps = static_cast<double>(r->result.tokens.size()) / r->seconds;
        scored[std::string(name) + "_tokens_per_s"] = tps;
        log << "bench: context " << ctx << " greedy with logprobs, scored on the " << name << " "
            << tps << " tok/s\n";
      }
      row["logprobs"] = scored;
    }
    if (o.temperature > 0) {
      // Sampled autoregressive decoding: where the rows go is the only difference.
      SamplerConfig sampler;
      sampler.temperature = o.temperature;
      sampler.top_p = o.top_p;
      sampler.top_k = o.top_k;
      sampler.presence_penalty = o.presence_penalty;
      sampler.frequency_penalty = o.frequency_penalty;
      sampler.repetition_penalty = o.repetition_penalty;
      json sampled = {{"temperature", o.temperature},
                      {"top_p", o.top_p},
                      {"top_k", o.top_k},
                      {"presence_penalty", o.presence_penalty},
                      {"frequency_penalty", o.frequency_penalty},
                      {"repetition_penalty", o.repetition_penalty}};
      for (const auto& [name, where] :
           {std::pair{"backend", PickOn::kBackend}, std::pair{"host", PickOn::kHost}}) {
        if (auto w = b.decode(base, 3, 0, nullptr, sampler, where); !w.ok()) return w.status();
        auto r = b.decode(base, n, 0, nullptr, sampler, where);
        if (!r.ok()) return r.status();
        const double tps = static_cast<double>(r->result.tokens.size()) / r->seconds;
        sampled[std::string(name) + "_tokens_per_s"] = tps;
        if (where == PickOn::kBackend) {
          sampled["rows_from_top"] = r->result.stats.rows_from_top;
          sampled["rows_read_back"] = r->result.stats.rows_read_back;
          sampled["rows_drawn"] = r->result.stats.rows_drawn;
        }
        log << "bench: context " << ctx << " sampled autoregressive, picks on the " << name << " "
            << tps << " tok/s\n";
      }
      // Sampled MTP with the model's own head (a forced drafter cannot force a sampled
      // acceptance): each depth with the picks on the backend, then on the host, the same seed.
      json sampled_mtp = json::array();
      for (int d = 1; d <= o.max_depth && model->mtp(); ++d) {
        json m = {{"depth", d}};
        std::vector<TokenId> tokens[2];
        for (const auto& [name, where] :
             {std::pair{"backend", PickOn::kBackend}, std::pair{"host", PickOn::kHost}}) {
          if (auto w = b.decode(base, d + 3, d, nullptr, sampler, where); !w.ok())
            return w.status();
          auto r = b.decode(base, n, d, nullptr, sampler, where);
          if (!r.ok()) return r.status();
          const auto& st = r->result.stats;
          const double tps = static_cast<double>(r->result.tokens.size()) / r->seconds;
          m[std::string(name) + "_tokens_per_s"] = tps;
          m[std::string(name) + "_speedup_vs_autoregressive"] =
              tps / sampled[std::string(name) + "_tokens_per_s"].get<double>();
          tokens[where == PickOn::kBackend ? 0 : 1] = r->result.tokens;
          if (where == PickOn::kBackend) {
            std::int64_t drafted = 0, accepted = 0;
            for (int k = 0; k < d; ++k) drafted += st.drafted[k], accepted += st.accepted[k];
            m["rounds"] = st.rounds;
            m["measured_accept"] = drafted ? static_cast<double>(accepted) / drafted : 0.0;
            m["tokens_per_round"] =
                st.rounds ? static_cast<double>(r->result.tokens.size()) / st.rounds : 0.0;
            m["rows_from_top"] = st.rows_from_top;
            m["rows_read_back"] = st.rows_read_back;
            m["rows_drawn"] = st.rows_drawn;
          }
          log << "bench: context " << ctx << " sampled MTP depth " << d << ", picks on the " << name
              << " " << tps << " tok/s\n";
        }
        // The same draws on both sides (bit for bit on the CPU backend; a GPU's sums round
        // differently, so a draw within double rounding of a boundary could differ).
        m["same_tokens_on_both"] = tokens[0] == tokens[1];
        sampled_mtp.push_back(m);
      }
      if (!sampled_mtp.empty()) sampled["mtp"] = sampled_mtp;
      row["sampled"] = sampled;
    }
    for (int d = 1; d <= o.max_depth; ++d) {
      if (!model->mtp()) break;
      // A short untimed run first: a depth's first verify meets new shapes (d+1 rows), whose
      // buffers the pool then allocates once.
      // The head picks where generate's own drafter would for these (greedy) decodes.
      const bool head_picks_on_backend = picks_on_backend(*model, GenerateOptions{});
      ForcedAcceptanceDrafter warm(*model, ref, base.tokens.size(), o.accept, c.vocab_size, 7,
                                   head_picks_on_backend);
      if (auto w = b.decode(base, d + 3, d, &warm); !w.ok()) return w.status();
      ForcedAcceptanceDrafter drafter(*model, ref, base.tokens.size(), o.accept, c.vocab_size,
                                      static_cast<std::uint32_t>(o.seed * 31 + d),
                                      head_picks_on_backend);
      auto r = b.decode(base, n, d, &drafter);
      if (!r.ok()) return r.status();
      const auto& st = r->result.stats;
      std::int64_t drafted = 0, accepted = 0;
      for (int k = 0; k < d; ++k) drafted += st.drafted[k], accepted += st.accepted[k];
      // The per-draft rate the drafter forces: a draft at position k is reached when the k before
      // it were accepted (accepted / drafted over all positions is lower at depth > 1, since a
      // round drafts every position and stops accepting at its first miss). null: never reached.
      auto given_reached = nlohmann::json::array();
      for (int k = 0; k < d; ++k) {
        const std::int64_t reached =
            k == 0 ? st.drafted[0] : std::min(st.accepted[k - 1], st.drafted[k]);
        given_reached.push_back(reached > 0
                                    ? nlohmann::json(static_cast<double>(st.accepted[k]) / reached)
                                    : nlohmann::json(nullptr));
      }
      const auto& got = r->result.tokens;
      const bool exact = std::equal(got.begin(), got.end(), ref.begin());
      const double tps = static_cast<double>(got.size()) / r->seconds;
      modes.push_back(
          {{"depth", d},
           {"tokens", got.size()},
           {"seconds", r->seconds},
           {"tokens_per_s", tps},
           {"rounds", st.rounds},
           {"tokens_per_round", st.rounds ? static_cast<double>(got.size()) / st.rounds : 0.0},
           {"drafted", drafted},
           {"accepted", accepted},
           {"measured_accept", drafted ? static_cast<double>(accepted) / drafted : 0.0},
           {"accept_given_reached", given_reached},
           {"speedup_vs_autoregressive", tps / ar_tps},
           {"equals_autoregressive", exact},
           // A round's halves (GenerateStats), against the autoregressive step's time.
           {"draft_ms_per_round", st.rounds ? st.draft_ns / 1e6 / st.rounds : 0.0},
           {"verify_ms_per_round", st.rounds ? st.verify_ns / 1e6 / st.rounds : 0.0},
           {"autoregressive_ms_per_token", 1e3 / ar_tps}});
      log << "bench: context " << ctx << " MTP depth " << d << " " << tps
          << " tok/s (a round: draft " << (st.rounds ? st.draft_ns / 1e6 / st.rounds : 0.0)
          << " ms, verify " << (st.rounds ? st.verify_ns / 1e6 / st.rounds : 0.0)
          << " ms; autoregressive step " << 1e3 / ar_tps << " ms)\n";
    }
    row["modes"] = modes;
    decode.push_back(row);
  }
  out["decode"] = decode;

  if (o.marginal && !o.contexts.empty()) {
    auto m = marginal_pass(b, c, o);
    if (!m.ok()) return m.status();
    if (!m->is_null()) out["marginal"] = std::move(*m);
  }
  if (o.timeline > 0 && !o.contexts.empty()) {
    auto m = timeline_pass(b, c, o);
    if (!m.ok()) return m.status();
    if (!m->is_null()) out["timeline"] = std::move(*m);
  }
  if (o.marginal_verify > 0 && !o.contexts.empty()) {
    auto m = marginal_verify_pass(b, c, o);
    if (!m.ok()) return m.status();
    if (!m->is_null()) out["marginal_verify"] = std::move(*m);
  }

  // The profiled pass: autoregressive at the first context with every op timed by group.
  if (o.profile && !o.contexts.empty()) {
    DecodeState base = new_decode_state(*model);
    if (auto s = fill_synthetic_context(*model, c, o.contexts.front(), o.seed, base); !s.ok())
      return s;
    timing->reset();
    timing->set_enabled(true);
    auto r = b.decode(base, n, 0, nullptr);
    const auto secs = timing->seconds();
    const auto calls = timing->calls();
    timing->set_enabled(false);
    if (!r.ok()) return r.status();
    const double tokens = static_cast<double>(r->result.tokens.size());
    json groups = json::object();
    double device = 0, ops = 0;
    for (std::size_t g = 0; g < kOpGroups; ++g) {
      device += secs[g];
      ops += static_cast<double>(calls[g]);
      groups[op_group_name(static_cast<OpGroup>(g))] = {
          {"ms_per_token", 1e3 * secs[g] / tokens},
          {"ops_per_token", static_cast<double>(calls[g]) / tokens}};
    }
    // Sampling runs on the host inside the generator (greedy argmax over the vocabulary): timed
    // here on its own, and part of the host time below.
    std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
    for (std::size_t i = 0; i < logits.size(); ++i)
      logits[i] = uniform_value(o.seed, i, 1.0f, 0.0f);
    SamplerConfig greedy;
    const auto s0 = Clock::now();
    // The picked ids are kept (and checked) so the calls cannot be optimised away.
    std::int64_t picked = -1;
    for (int i = 0; i < 20; ++i) {
      const auto id = target_distribution(logits, greedy).ids.front();
      if (picked >= 0 && id != picked)
        return internal_error("bench: greedy sampling is not stable");
      picked = id;
    }
    const double sample_s = seconds_since(s0) / 20;
    const double wall = r->seconds;
    out["profile"] = {
        {"context", o.contexts.front()},
        {"tokens", tokens},
        {"wall_ms_per_token", 1e3 * wall / tokens},
        {"tokens_per_s_profiled", tokens / wall},
        {"groups", groups},
        {"device_ms_per_token", 1e3 * device / tokens},
        {"sampling_ms_per_token", 1e3 * sample_s},
        {"host_ms_per_token", 1e3 * std::max(0.0, wall - device) / tokens},
        {"ops_per_token", ops / tokens},
        {"note",
         "device times are CUDA-event brackets per op (a gap waiting for the host to "
         "launch counts to the op after it); host = wall - device, sampling included; "
         "ops are backend op calls (each launches one or a few kernels)"}};
  }
  // Prefill last, longest last, so a run cut short still has its decode figures in the log (a
  // short prefill first warms the pool and cuBLAS).
  if (auto w = b.time_prefill(tiny ? 8 : 64); !w.ok()) return w.status();
  json prefill = json::array();
  for (const auto n : o.prefill) {
    auto s = b.time_prefill(n);
    if (!s.ok()) return s.status().with_context("prefill of " + std::to_string(n));
    prefill.push_back({{"tokens", n}, {"seconds", *s}, {"tokens_per_s", n / *s}});
    log << "bench: prefill " << n << " tokens: " << n / *s << " tok/s\n";
  }
  out["prefill"] = prefill;

  // The profiled prefill: the first length again, every op timed by group (prefill's ops are
  // large, so the event brackets cost little of it).
  if (o.profile && !o.prefill.empty()) {
    const auto n = o.prefill.front();
    timing->reset();
    timing->set_enabled(true);
    timing->set_time_ops(true);
    auto s = b.time_prefill(n);
    const auto secs = timing->seconds();
    const auto calls = timing->calls();
    const auto by_op = timing->op_seconds();
    timing->set_time_ops(false);
    timing->set_enabled(false);
    if (!s.ok()) return s.status().with_context("profiled prefill of " + std::to_string(n));
    json groups = json::object();
    double device = 0;
    for (std::size_t g = 0; g < kOpGroups; ++g) {
      device += secs[g];
      groups[op_group_name(static_cast<OpGroup>(g))] = {
          {"ms", 1e3 * secs[g]}, {"ops", calls[g]}, {"share", *s > 0 ? secs[g] / *s : 0.0}};
    }
    // Each op by name (linear keyed by its weight's shape), largest first.
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& [name, sec] : by_op) ranked.emplace_back(sec, name);
    std::sort(ranked.rbegin(), ranked.rend());
    json ops = json::array();
    for (const auto& [sec, name] : ranked) ops.push_back({{"op", name}, {"ms", 1e3 * sec}});
    out["profile_prefill"] = {{"tokens", n},
                              {"ops", ops},
                              {"wall_ms", 1e3 * *s},
                              {"tokens_per_s_profiled", static_cast<double>(n) / *s},
                              {"groups", groups},
                              {"device_ms", 1e3 * device},
                              {"host_ms", 1e3 * std::max(0.0, *s - device)}};
  }

  return out;
}

std::string bench_table(const json& r) {
  std::ostringstream t;
  char line[256];
  t << "flashserve bench: " << r.value("shapes", "") << ", " << r.value("layers", 0) << " of "
    << r.value("layers_released", 0) << " layers, " << r.value("matrix_dtype", "bf16")
    << ", backend " << r.value("backend", "") << ", PLE table " << r.value("ple_table_rows", 0)
    << " rows (released " << r.value("ple_table_rows_released", 0) << "), context filled "
    << r.value("context_fill", "") << "\n";
  const double copy = r.value("copy_bandwidth_Bps", 0.0);
  if (copy > 0) {
    std::snprintf(line, sizeof line, "copy bandwidth (D2D): %.0f GB/s\n", copy / 1e9);
    t << line;
  }
  t << "\nprefill      tokens/s\n";
  for (const auto& p : r["prefill"]) {
    std::snprintf(line, sizeof line, "%8lld  %10.1f\n", p["tokens"].get<long long>(),
                  p["tokens_per_s"].get<double>());
    t << line;
  }
  t << "\ndecode (batch 1, forced accept " << r.value("accept", 0.0) << ", drafts over "
    << r.value("draft_vocab", std::int64_t{0}) << " token ids)\n";
  t << " context  depth   tok/s  tok/round  accept  speedup  exact   MB/token   GB/s  of copy\n";
  for (const auto& d : r["decode"]) {
    const double mb = d["bytes_per_token"]["total"].get<double>() / 1e6;
    for (const auto& m : d["modes"]) {
      const int depth = m["depth"].get<int>();
      const double tps = m["tokens_per_s"].get<double>();
      // Bandwidth is the autoregressive row's: an MTP round reads the trunk once for several
      // tokens plus the draft head per draft, so one bytes-per-token figure does not describe it.
      char gbps[16] = "-", frac[16] = "-";
      if (depth == 0) {
        std::snprintf(gbps, sizeof gbps, "%.0f", mb * tps / 1e3);
        if (copy > 0) std::snprintf(frac, sizeof frac, "%.1f%%", 100 * mb * 1e6 * tps / copy);
      }
      std::snprintf(line, sizeof line,
                    "%8lld  %5d  %7.2f  %9.2f  %6.2f  %7.2f  %5s  %9.1f  %5s  %7s\n",
                    d["context"].get<long long>(), depth, tps, m.value("tokens_per_round", 1.0),
                    m.value("measured_accept", 0.0), m.value("speedup_vs_autoregressive", 1.0),
                    depth == 0 ? "-" : (m.value("equals_autoregressive", false) ? "yes" : "NO"), mb,
                    gbps, frac);
      t << line;
    }
  }
  for (const auto& d : r["decode"]) {
    if (!d.contains("logprobs")) continue;
    const auto& s = d["logprobs"];
    const double dev = s["backend_tokens_per_s"].get<double>(),
                 host = s["host_tokens_per_s"].get<double>();
    std::snprintf(line, sizeof line,
                  "greedy AR with logprobs at context %lld (top %d): scored on the backend %.1f "
                  "tok/s, rows to the host %.1f tok/s: %.2fx\n",
                  d["context"].get<long long>(), s["top_logprobs"].get<int>(), dev, host,
                  dev / host);
    t << line;
  }
  for (const auto& d : r["decode"]) {
    if (!d.contains("sampled")) continue;
    const auto& s = d["sampled"];
    const double dev = s["backend_tokens_per_s"].get<double>(),
                 host = s["host_tokens_per_s"].get<double>();
    std::snprintf(line, sizeof line,
                  "sampled AR at context %lld (T %.2f, top_p %.2f, top_k %d, presence %.2f, "
                  "frequency %.2f, repetition %.2f): picks on the backend %.1f "
                  "tok/s (%lld rows from their top, %lld drawn there, %lld read back), rows to "
                  "the host %.1f "
                  "tok/s: %.2fx\n",
                  d["context"].get<long long>(), s["temperature"].get<double>(),
                  s["top_p"].get<double>(), s.value("top_k", 0), s.value("presence_penalty", 0.0),
                  s.value("frequency_penalty", 0.0), s.value("repetition_penalty", 1.0), dev,
                  s["rows_from_top"].get<long long>(), s.value("rows_drawn", 0LL),
                  s["rows_read_back"].get<long long>(), host, dev / host);
    t << line;
    for (const auto& m : s.value("mtp", json::array())) {
      std::snprintf(line, sizeof line,
                    "  sampled MTP depth %d: picks on the backend %.1f tok/s (%.2fx its AR; "
                    "accept %.2f, %.2f tokens a round; %lld rows from their top, %lld drawn "
                    "there, %lld read back), rows to the host %.1f tok/s (%.2fx its AR): %.2fx; "
                    "same tokens: %s\n",
                    m["depth"].get<int>(), m["backend_tokens_per_s"].get<double>(),
                    m["backend_speedup_vs_autoregressive"].get<double>(),
                    m["measured_accept"].get<double>(), m["tokens_per_round"].get<double>(),
                    m["rows_from_top"].get<long long>(), m["rows_drawn"].get<long long>(),
                    m["rows_read_back"].get<long long>(), m["host_tokens_per_s"].get<double>(),
                    m["host_speedup_vs_autoregressive"].get<double>(),
                    m["backend_tokens_per_s"].get<double>() / m["host_tokens_per_s"].get<double>(),
                    m["same_tokens_on_both"].get<bool>() ? "yes" : "no");
      t << line;
    }
  }
  if (r.contains("profile")) {
    const auto& p = r["profile"];
    t << "\nprofiled autoregressive decode at context " << p["context"].get<long long>() << ": "
      << p["wall_ms_per_token"].get<double>() << " ms/token, " << p["ops_per_token"].get<double>()
      << " ops/token\n";
    for (const auto& [name, g] : p["groups"].items()) {
      std::snprintf(line, sizeof line, "  %-26s %8.3f ms  %6.1f ops\n", name.c_str(),
                    g["ms_per_token"].get<double>(), g["ops_per_token"].get<double>());
      t << line;
    }
    std::snprintf(line, sizeof line, "  %-26s %8.3f ms  (of which sampling %.3f ms)\n", "host",
                  p["host_ms_per_token"].get<double>(), p["sampling_ms_per_token"].get<double>());
    t << line;
  }
  if (r.contains("profile_prefill")) {
    const auto& p = r["profile_prefill"];
    t << "\nprofiled prefill of " << p["tokens"].get<long long>()
      << " tokens: " << p["wall_ms"].get<double>() << " ms ("
      << p["tokens_per_s_profiled"].get<double>() << " tok/s)\n";
    for (const auto& [name, g] : p["groups"].items()) {
      std::snprintf(line, sizeof line, "  %-26s %10.2f ms  %5.1f%%  %7lld ops\n", name.c_str(),
                    g["ms"].get<double>(), 100 * g["share"].get<double>(),
                    g["ops"].get<long long>());
      t << line;
    }
    std::snprintf(line, sizeof line, "  %-26s %10.2f ms\n", "host", p["host_ms"].get<double>());
    t << line;
    if (p.contains("ops")) {
      t << "  the largest ops:\n";
      int shown = 0;
      for (const auto& op : p["ops"]) {
        if (++shown > 14) break;
        std::snprintf(line, sizeof line, "    %-48s %10.2f ms\n",
                      op["op"].get<std::string>().c_str(), op["ms"].get<double>());
        t << line;
      }
    }
  }
  if (r.contains("marginal")) {
    const auto& m = r["marginal"];
    t << "\neach group's share of the overlapped autoregressive step at context "
      << m["context"].get<long long>() << ": " << m["ms_per_token"].get<double>()
      << " ms/token (the step minus the step with the group's ops dry)\n";
    for (const auto& [name, g] : m["groups"].items()) {
      if (g.contains("error")) {
        t << "  " << name << ": " << g["error"].get<std::string>() << "\n";
        continue;
      }
      std::snprintf(line, sizeof line, "  %-26s %8.3f ms  (%.3f ms without it)\n", name.c_str(),
                    g["ms_per_token"].get<double>(), g["ms_per_token_without"].get<double>());
      t << line;
    }
    std::snprintf(line, sizeof line, "  %-26s %8.3f ms\n", "sum of the shares",
                  m["sum_of_shares_ms"].get<double>());
    t << line;
  }
  if (r.contains("timeline")) {
    const auto& m = r["timeline"];
    t << "\nthe step's kernel chain as it ran at context " << m["context"].get<long long>() << " ("
      << m["steps_averaged"].get<std::size_t>() << " steps averaged, "
      << m["launches_per_step"].get<std::size_t>() << " launches over "
      << m["span_us"].get<double>() << " us): each kernel's hold on the chain\n";
    for (const auto& k : m["kernels"]) {
      std::snprintf(line, sizeof line, "  %-40s x%-4d %9.1f us  %5.1f%%\n",
                    k["kernel"].get<std::string>().c_str(), k["launches_per_step"].get<int>(),
                    k["hold_us_per_step"].get<double>(), 100.0 * k["share"].get<double>());
      t << line;
    }
    // A window from the middle of the step (a layer or two of the steady chain).
    const auto& launches = m["launches"];
    const std::size_t from = launches.size() / 2, to = std::min(launches.size(), from + 40);
    t << "  launches " << from << "-" << to
      << ": grid, release, hold, early blocks, last arrival (us)\n";
    for (std::size_t i = from; i < to; ++i) {
      const auto& l = launches[i];
      std::snprintf(line, sizeof line, "  %-40s %5u x %-4u %8.1f %6.2f %5.0f%% %7.2f\n",
                    l["kernel"].get<std::string>().c_str(), l["blocks"].get<unsigned>(),
                    l["threads"].get<unsigned>(), l["release_us"].get<double>(),
                    l["hold_us"].get<double>(), 100.0 * l["early"].get<double>(),
                    l["last_arrival_us"].get<double>());
      t << line;
    }
  }
  if (r.contains("marginal_verify")) {
    const auto& m = r["marginal_verify"];
    t << "\neach op's share of an MTP round at depth " << m["depth"].get<int>() << ", context "
      << m["context"].get<long long>() << ": verify " << m["verify_ms_per_round"].get<double>()
      << " ms, draft " << m["draft_ms_per_round"].get<double>() << " ms a round\n";
    std::vector<std::pair<double, std::string>> ranked;
    for (const auto& [name, op] : m["ops"].items())
      if (!op.contains("error")) ranked.emplace_back(op["verify_ms_per_round"].get<double>(), name);
    std::sort(ranked.rbegin(), ranked.rend());
    for (const auto& [share, name] : ranked) {
      const auto& op = m["ops"][name];
      std::snprintf(line, sizeof line, "  %-40s verify %7.3f ms  draft %7.3f ms  %6.1f calls\n",
                    name.c_str(), share, op["draft_ms_per_round"].get<double>(),
                    op["calls_per_round"].get<double>());
      t << line;
    }
  }
  return t.str();
}

}  // namespace fs::bench
