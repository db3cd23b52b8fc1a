// flashserve bench: Qwen 3.8 Flash Next prefill and batch-1 decode (autoregressive and MTP) on
// synthetic weights with the released shapes, with bytes per token against the measured copy
// bandwidth and a per-op-group profile; JSON (stdout and --json FILE) plus a table on stderr.
#include <fstream>
#include <iostream>

#include "bench/bench_run.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace fs::cli {

void add_bench_command(CLI::App& app, Action& action) {
  struct Options {
    bench::BenchOptions bench;
    std::string prefill = "512,4096,16384", contexts = "1024,16384,65536", json_path;
    bool no_profile = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "bench",
      "Benchmark Qwen 3.8 Flash Next (released shapes, synthetic bf16 weights made on the GPU): "
      "prefill, batch-1 decode with MTP 1-3, bytes/token vs copy bandwidth, op-group profile");
  cmd->add_option("--backend", o->bench.backend, "cuda, or cpu (tiny shapes, for tests)")
      ->capture_default_str();
  cmd->add_flag("--tiny", o->bench.tiny, "Tiny shapes on any backend");
  cmd->add_option("--layers", o->bench.layers,
                  "Decoder layers (0: the largest multiple of 4 that fits the device)")
      ->capture_default_str();
  cmd->add_option("--prefill", o->prefill, "Prefill lengths, comma-separated")
      ->capture_default_str();
  cmd->add_option("--contexts", o->contexts, "Decode context lengths, comma-separated")
      ->capture_default_str();
  cmd->add_option("--decode-tokens", o->bench.decode_tokens, "Tokens per timed decode run")
      ->capture_default_str();
  cmd->add_option("--max-depth", o->bench.max_depth, "MTP depths 1..N after autoregressive")
      ->check(CLI::Range(0, 3))
      ->capture_default_str();
  cmd->add_option("--accept", o->bench.accept, "Forced per-draft acceptance rate")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--draft-vocab", o->bench.draft_vocab,
                  "MTP drafts over token ids [0, N) only (0: the whole vocabulary)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--ple-head-rows", o->bench.ple_head_rows,
                  "Rows per PLE n-gram head (host table; only touched rows are read)")
      ->capture_default_str();
  cmd->add_option("--reserve-mib", o->bench.reserve_mib,
                  "Device memory kept free for state and activations when sizing --layers")
      ->capture_default_str();
  cmd->add_option("--dtype", o->bench.dtype,
                  "Matrices: bf16; fp8 (projections and experts FP8 E4M3 with 128x128 block "
                  "scales); fp4 (routed experts FP4 E2M1 with E8M0 scales per 32, the other "
                  "projections FP8); q8_0, q4_k, q5_k, q6_k, q2_k (projections and experts in that "
                  "GGUF type, Q8_0 for rows that are not whole blocks); iq2_xxs (ds4's mix: routed "
                  "gate/up IQ2_XXS, down Q2_K, other projections Q8_0). Embedding, lm_head, "
                  "routers and hyper-connection matrices stay bf16")
      ->check(
          CLI::IsMember({"bf16", "fp8", "fp4", "q8_0", "q4_k", "q5_k", "q6_k", "q2_k", "iq2_xxs"}))
      ->capture_default_str();
  cmd->add_option("--seed", o->bench.seed, "Seed of the synthetic weights")->capture_default_str();
  cmd->add_option("--temperature", o->bench.temperature,
                  "Also sampled decoding at this temperature, autoregressive and (with "
                  "--max-depth) MTP with the model's head, picks on the backend and on the host "
                  "(0: not run)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", o->bench.top_p, "top_p of the sampled runs")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--top-k", o->bench.top_k, "top_k of the sampled runs (0: off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--presence-penalty", o->bench.presence_penalty,
                  "presence_penalty of the sampled runs")
      ->check(CLI::Range(-2.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", o->bench.frequency_penalty,
                  "frequency_penalty of the sampled runs")
      ->check(CLI::Range(-2.0, 2.0))
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", o->bench.repetition_penalty,
                  "repetition_penalty of the sampled runs (over the context and the completion)")
      ->check(CLI::Range(0.01, 2.0))
      ->capture_default_str();
  cmd->add_option("--top-logprobs", o->bench.top_logprobs,
                  "Also greedy decoding that scores each token with this many alternatives "
                  "(a request's top_logprobs), on the backend and on the host (0: not run)")
      ->check(CLI::Range(0, 20));
  cmd->add_flag("--no-profile", o->no_profile, "Skip the op-group profiled pass");
  cmd->add_flag("--marginal", o->bench.marginal,
                "Also time autoregressive decode with each op group's ops dry: each group's "
                "share of the overlapped step (a device backend only)");
  cmd->add_flag("--marginal-ops", o->bench.marginal_ops,
                "With --marginal: also each op kind's share (each op by name dry in turn), "
                "ranked");
  cmd->add_option("--marginal-verify", o->bench.marginal_verify,
                  "Also each op kind's share of an MTP round's verify and draft at this depth "
                  "(each op by name dry in turn; a device backend only)")
      ->check(CLI::Range(0, 3));
  cmd->add_option("--timeline", o->bench.timeline,
                  "Also trace the step's kernel chain as it runs over this many autoregressive "
                  "steps at the first context: each kernel's hold on the chain, the blocks "
                  "resident before their inputs were (CUDA only)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--json", o->json_path, "Also write the JSON result to this file");
  cmd->callback([o, &action] {
    action = [o]() -> int {
      auto prefill = parse_list(o->prefill, "--prefill");
      auto contexts = parse_list(o->contexts, "--contexts");
      for (const auto* l : {&prefill, &contexts}) {
        if (!l->ok()) {
          std::cerr << "flashserve bench: " << l->status().to_string() << "\n";
          return 2;
        }
      }
      o->bench.prefill = *prefill;
      o->bench.contexts = *contexts;
      o->bench.profile = !o->no_profile;
      auto r = bench::run_bench(o->bench, std::cerr);
      if (!r.ok()) {
        std::cerr << "flashserve bench: " << r.status().to_string() << "\n";
        return 1;
      }
      std::cerr << bench::bench_table(*r);
      if (!o->json_path.empty()) {
        std::ofstream f(o->json_path);
        f << r->dump(2) << "\n";
        if (!f) {
          std::cerr << "flashserve bench: cannot write " << o->json_path << "\n";
          return 1;
        }
      }
      std::cout << r->dump() << "\n";
      return 0;
    };
  });
}

}  // namespace fs::cli
