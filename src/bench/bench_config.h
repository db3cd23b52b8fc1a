// Configs of the `flashserve bench` models: the released Qwen 3.8 Flash Next shapes (layers
// reduced to fit one GPU, a smaller PLE table) and a tiny one with the same structure for CPU
// runs. Both go through the production config parser, so they are validated like a checkpoint's.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "model/qwen_next/config.h"
#include "util/status.h"

namespace fs::bench {

// `layers` decoder layers, linear:QSA 3:1 (a QSA layer every fourth), PLE on layer 2 whose
// n-gram table has 16 heads of about `ple_head_rows` rows (the released table: 20,000,003+).
nlohmann::json flash_next_config_json(std::int64_t layers, std::int64_t ple_head_rows);
// Same structure, tiny widths (CPU ctest).
nlohmann::json tiny_config_json(std::int64_t layers);

Expected<QwenNextConfig> parse_bench_config(const nlohmann::json& j);

}  // namespace fs::bench
