#include "model/common/block_indexer.h"

#include <vector>

namespace fs {

void select_block_tokens(Backend& be, const Tensor& scores, std::span<const Position> q_positions,
                         std::int64_t block, std::int64_t top_blocks, KeySelection& sel) {
  std::vector<std::int64_t> visible_blocks;
  for (const auto p : q_positions) visible_blocks.push_back((p + 1) / block);
  std::vector<std::int32_t> picked;
  std::vector<float> values;
  be.topk(scores, top_blocks, visible_blocks, picked, values);
  sel = KeySelection{};
  std::vector<std::int32_t> keys;
  for (std::size_t s = 0; s < q_positions.size(); ++s) {
    keys.clear();
    for (std::int64_t j = 0; j < top_blocks; ++j) {
      const auto b = picked[s * static_cast<std::size_t>(top_blocks) + static_cast<std::size_t>(j)];
      if (b < 0) continue;
      for (std::int64_t t = 0; t < block; ++t)
        keys.push_back(static_cast<std::int32_t>(b * block + t));
    }
    // The unfinished tail: visible tokens after the last complete block.
    for (auto t = visible_blocks[s] * block; t <= q_positions[s]; ++t)
      keys.push_back(static_cast<std::int32_t>(t));
    sel.add_query(keys);
  }
}

}  // namespace fs
