// The decode state of DeepSeek V4 (arch-dsv4.md 3): one cache per layer, holding
//   raw        [n, D]   the last K=V rows (after kv_norm and RoPE) of positions covered - n ..
//                       covered - 1: the sliding window's W - 1 rows plus a rollback slack;
// and, on CSA / HCA layers, a compressor (CSA also the indexer's own compressor):
//   *_kv, *_gate [n', width]  the per-token projections of the compressor's frontier (positions
//                       covered - n' .. covered - 1: the unfinished window, the previous window
//                       for CSA's overlap, and the slack), from which a closing window is pooled;
//   *_rows     [covered / m, D']  the compressed rows, append-only (normed, rotated at w*m).
// The frontier is a window of absolute positions rather than HF's drained buffer, so going back
// up to `kRollbackSlack` tokens (a rejected speculative suffix) only shortens the tensors: the
// rows of the accepted prefix are still there and re-pool the same way. After each forward the
// buffers are cut to a length that is a function of `covered` alone, so every split of a
// sequence into calls leaves the same state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/deepseek_v4/config.h"
#include "model/model.h"
#include "tensor/tensor.h"

namespace fs {

// Tokens a state can go back by after a forward (a speculative verify's rejected suffix).
inline constexpr std::int64_t kDsRollbackSlack = 32;

// One compressor's frontier and rows (the attention's own, or the lightning indexer's).
struct DsCompressorState {
  Tensor kv, gate;  // [n, width]: projections of positions covered - n .. covered - 1
  Tensor rows;      // [covered / ratio, D']
  std::int64_t ratio = 1;
  bool overlap = false;  // CSA: a row pools the previous window too

  // The first position whose projections a state covering `covered` keeps: enough to re-pool
  // the unfinished window of any length down to covered - slack.
  std::int64_t keep_from(std::int64_t covered) const;
  // The first position a state covering `length` needs (no slack).
  std::int64_t needed_from(std::int64_t length) const;
};

class DsAttentionCache final : public LayerCache {
 public:
  DsAttentionCache(const DeepseekV4Config& c, DsAttentionKind kind,
                   const std::shared_ptr<Memory>& memory);
  std::string kind() const override;
  std::int64_t covered_tokens() const override { return covered; }
  std::unique_ptr<LayerCache> clone() const override;
  Status truncate(std::int64_t length) override;
  bool can_truncate(std::int64_t length) const override;
  // Going back inside the next forward needs nothing kept: its rows stay while within the slack.
  bool keep_positions(std::int64_t tokens) override { return tokens <= kDsRollbackSlack; }
  std::size_t bytes() const override;
  std::vector<StateTensor> tensors() const override;
  Status load(std::span<const StateTensorView> tensors, std::int64_t covered) override;

  // The position of raw's first row.
  std::int64_t raw_first() const { return covered - raw.rows(); }
  // The rows of raw a state covering `covered` keeps after a forward.
  std::int64_t raw_keep(std::int64_t covered_tokens) const;
  // Cuts raw and the frontiers to what a state covering `covered` keeps (after a forward).
  void trim(class Backend& be);

  DsAttentionKind layer_kind;
  std::int64_t window = 0;                      // W: a query reads W raw rows, its own included
  Tensor raw;                                   // [n, D]
  std::optional<DsCompressorState> compressor;  // CSA, HCA
  std::optional<DsCompressorState> indexer;     // CSA
  std::int64_t covered = 0;
};

// The caches of a fresh sequence, one per layer.
std::unique_ptr<ModelState> new_deepseek_v4_state(const DeepseekV4Config& c,
                                                  const std::shared_ptr<Memory>& memory);

}  // namespace fs
