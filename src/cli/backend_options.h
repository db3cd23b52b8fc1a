// --backend, --dtype, --draft-vocab and --numerics, the same on every command that runs a model.
#pragma once

#include <CLI/CLI.hpp>

#include "model/loader.h"

namespace fs::cli {

inline void add_backend_options(CLI::App* cmd, LoadOptions& o) {
  cmd->add_option(
         "--backend", o.backend,
         "cpu, cuda, or auto (cuda when a GPU this build has kernels for is present, else cpu)")
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "Weight matrices on the backend: f32, bf16, or auto (bf16 on cuda, as stored "
                  "on cpu)")
      ->capture_default_str();
  cmd->add_option("--draft-vocab", o.draft_vocab,
                  "MTP drafts over token ids [0, N) only: a cheaper draft head, the same output "
                  "(0: the whole vocabulary)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--numerics", o.numerics,
                  "hf (HF's plain arithmetic) or official (DeepSeek V4 only: the official graph's "
                  "FP8 KV and Hadamard + FP4 indexer simulations, as ds4 computes)")
      ->capture_default_str();
}

}  // namespace fs::cli
