// Shared helpers of the Qwen tests: the hf-tiny qwen4_exp fixture's cases and reference logits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace fs::test {

struct QwenCase {
  std::vector<TokenId> tokens;
  std::vector<std::int64_t> splits;
  std::vector<float> full, inc;  // reference logits [L x vocab]
};

// The cases of the hf-tiny qwen4_exp fixture, or of another fixture folder of the same format.
std::vector<QwenCase> qwen_cases(const std::string& dir = "");
// tests/fixtures/qwen4_exp_variant: PLE on two layers, silu gate, no top-k renormalisation,
// hc_count 3, attention biases, two QSA layers (tools/oracle/qwen_variant_oracle.py).
std::string qwen_variant_fixture();
std::vector<float> read_f32(const std::string& path);

// Feeds `tokens` in calls of `splits` through `state`, concatenating the logits of every row.
std::vector<float> run_splits(Model& m, ModelState& state, const std::vector<TokenId>& tokens,
                              const std::vector<std::int64_t>& splits);

struct LogitsDiff {
  double max_abs = 0;
  std::int64_t argmax_mismatches = 0;
};
LogitsDiff diff_logits(const std::vector<float>& a, const std::vector<float>& b,
                       std::int64_t vocab);

}  // namespace fs::test
