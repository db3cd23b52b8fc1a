// `flashserve bench`: the production Qwen 3.8 Flash Next decode and prefill paths on synthetic
// weights with the released shapes (or tiny ones), measured end to end and reported as JSON.
// See bench/NOTES.md (issue 14) for what each figure means and how it was produced.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "util/status.h"

namespace fs::bench {

struct BenchOptions {
  std::string backend = "cuda";  // cuda (released shapes) or cpu (tiny shapes)
  bool tiny = false;             // tiny shapes on any backend (always on the CPU)
  std::int64_t layers = 0;       // 0: the largest multiple of 4 that fits (tiny: 4)
  std::vector<std::int64_t> prefill = {512, 4096, 16384};
  std::vector<std::int64_t> contexts = {1024, 16384, 65536};
  std::int64_t decode_tokens = 64;       // emitted tokens per timed decode run
  int max_depth = 3;                     // MTP depths 1..max_depth after autoregressive
  double accept = 0.8;                   // forced per-draft acceptance
  std::int64_t ple_head_rows = 100'000;  // rows per n-gram head of the PLE table (host)
  std::int64_t reserve_mib = 16 * 1024;  // device memory left for state and activations
  std::uint64_t seed = 1;
  bool profile = true;  // the op-group pass
  // The overlapped op-group pass: autoregressive decode at the first context once with every op
  // and once per group with that group's ops dry (Backend::set_dry_ops), so that each group's
  // share of the step is measured as the step runs, launches overlapped (the profiled pass
  // brackets each op with events, which serialises them). Backends that cannot run dry skip it.
  bool marginal = false;
  // With marginal: also each op by name dry in turn (TimingBackend::set_dry_op), the ops of the
  // step ranked by their share. One more timed decode per op kind (~40 on Qwen).
  bool marginal_ops = false;
  // > 0: each op kind's share of an MTP round's verify and draft at this depth, at the first
  // context (each op by name dry in turn; two timed MTP decodes per op kind).
  int marginal_verify = 0;
  // > 0: the step's kernel chain as it runs, traced over this many autoregressive steps at the
  // first context (chain_timeline.h; CUDA only): each launch's release, hold on the chain and
  // resident blocks, and each kernel's hold a step.
  int timeline = 0;
  std::int64_t draft_vocab = 0;  // MTP drafts over ids [0, n) (0: the whole vocabulary)
  // Matrices: "bf16", or "fp8" (the projections FP8 E4M3 with 128x128 f32 block scales, the
  // rest bf16: what `convert --quantize fp8` and the FP8 releases hold).
  std::string dtype = "bf16";
  // > 0: also sampled decoding at this temperature and top_p (autoregressive, and MTP at depths
  // 1..max_depth with the model's head), with the picks on the backend and on the host.
  double temperature = 0;
  double top_p = 0.95;
  std::int32_t top_k = 0;  // 0: off
  // The sampled runs' penalties (subtracted on the backend when the picks are there).
  double presence_penalty = 0;
  double frequency_penalty = 0;
  double repetition_penalty = 1;
  // > 0: also greedy autoregressive decoding that scores every token with this many
  // alternatives (a request's top_logprobs), scored on the backend and on the host.
  int top_logprobs = 0;
};

// Runs every measurement; progress lines go to `log`.
Expected<nlohmann::json> run_bench(const BenchOptions& options, std::ostream& log);

// The readable table of a run_bench result.
std::string bench_table(const nlohmann::json& result);

}  // namespace fs::bench
