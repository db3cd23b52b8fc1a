#include "model/deepseek_v4/numerics.h"

#include <algorithm>
#include <string>

namespace fs {

std::int64_t ds_indexer_hadamard_block(const DeepseekV4Config& c) {
  return std::min(kDsIndexerHadamardBlock, c.index_head_dim);
}

Status check_official_numerics(const DeepseekV4Config& c) {
  const auto nope = c.head_dim - c.rope_head_dim();
  if (nope <= 0)
    return invalid_argument("--numerics official: head_dim " + std::to_string(c.head_dim) +
                            " has no non-RoPE dims for the FP8 KV simulation");
  const auto h = ds_indexer_hadamard_block(c);
  const bool power_of_two = h > 0 && (h & (h - 1)) == 0;
  if (c.index_head_dim > 0 && (!power_of_two || c.index_head_dim % h != 0))
    return invalid_argument("--numerics official: index_head_dim " +
                            std::to_string(c.index_head_dim) +
                            " must be a power of two up to 128 or a multiple of 128 (the "
                            "width of the indexer's Hadamard rotation)");
  return {};
}

void simulate_kv_fp8(Backend& be, const DeepseekV4Config& c, Tensor& rows) {
  be.fp8_e4m3_simulate(rows, c.head_dim - c.rope_head_dim(), kDsKvFp8Block);
}

void simulate_indexer_fp4(Backend& be, const DeepseekV4Config& c, Tensor& rows) {
  be.hadamard_fp4_simulate(rows, ds_indexer_hadamard_block(c), kDsIndexerFp4Block);
}

}  // namespace fs
