#include "qwen_fixture.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_support.h"

namespace fs::test {

std::vector<float> read_f32(const std::string& path) {
  const auto bytes = read_bytes(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

std::string qwen_variant_fixture() {
  return QWEN_VARIANT_FIXTURE;
}

std::vector<QwenCase> qwen_cases(const std::string& which) {
  const auto dir = which.empty() ? hf_tiny("qwen4_exp") : which;
  std::ifstream f(dir + "/golden.json");
  const auto g = nlohmann::json::parse(f);
  std::vector<QwenCase> out;
  for (const auto& c : g["cases"]) {
    QwenCase qc;
    qc.tokens = c["tokens"].get<std::vector<TokenId>>();
    qc.splits = c["incremental_splits"].get<std::vector<std::int64_t>>();
    qc.full = read_f32(dir + "/" + c["full_logits"].get<std::string>());
    qc.inc = read_f32(dir + "/" + c["incremental_logits"].get<std::string>());
    out.push_back(std::move(qc));
  }
  return out;
}

std::vector<float> run_splits(Model& m, ModelState& state, const std::vector<TokenId>& tokens,
                              const std::vector<std::int64_t>& splits) {
  std::vector<float> logits;
  std::size_t at = 0;
  for (const auto n : splits) {
    ForwardOutput out;
    const auto s =
        m.forward(state, {tokens.data() + at, static_cast<std::size_t>(n)}, LogitsRows::kAll, out);
    if (!s.ok()) return {};
    logits.insert(logits.end(), out.logits.begin(), out.logits.end());
    at += static_cast<std::size_t>(n);
  }
  return logits;
}

LogitsDiff diff_logits(const std::vector<float>& a, const std::vector<float>& b,
                       std::int64_t vocab) {
  LogitsDiff d;
  if (a.size() != b.size()) return {INFINITY, -1};
  for (std::size_t r = 0; r < a.size() / static_cast<std::size_t>(vocab); ++r) {
    const auto* pa = a.data() + r * static_cast<std::size_t>(vocab);
    const auto* pb = b.data() + r * static_cast<std::size_t>(vocab);
    for (std::int64_t j = 0; j < vocab; ++j)
      d.max_abs = std::max(d.max_abs, static_cast<double>(std::fabs(pa[j] - pb[j])));
    if (std::max_element(pa, pa + vocab) - pa != std::max_element(pb, pb + vocab) - pb)
      ++d.argmax_mismatches;
  }
  return d;
}

}  // namespace fs::test
