// The decode state of DeepSeek V4 (arch-dsv4.md 3): one cache per layer, holding
//   raw        [r, D]   the K=V rows (after kv_norm and RoPE) the next query reads: the last
//                       min(covered, W - 1) positions;
// and, on CSA / HCA layers, a compressor (CSA also the indexer's own compressor):
//   *.kv, *.gate [n', width]  the per-token projections of the compressor's frontier: the
//                       unfinished window (and, for CSA's overlap, the window before it), from
//                       which a closing window is pooled;
//   *.rows     [covered / m, D']  the compressed rows, append-only (normed, rotated at w*m).
// These are the state's tensors (checkpoints, comparisons): a function of the token prefix only,
// so every split of a sequence into calls, and every way back to a length, leaves the same state.
// Besides them each buffer keeps a slack of the rows that left it during the last forwards (up to
// `kDsRollbackSlack` positions): going back inside the slack (a rejected speculative suffix) is a
// copy of rows, because the frontier is a window of absolute positions rather than HF's drained
// buffer. The slack is not part of the state's tensors; a loaded state starts without one.
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
  Tensor kv, gate;              // [n, width]: projections of positions covered - n .. covered - 1
  Tensor kv_slack, gate_slack;  // the rows before them that going back may need again
  Tensor rows;                  // [covered / ratio, D']
  std::int64_t ratio = 1;
  bool overlap = false;  // CSA: a row pools the previous window too

  // The first position whose projections a state covering `covered` keeps in its slack: enough
  // to re-pool the unfinished window of any length down to covered - kDsRollbackSlack.
  std::int64_t keep_from(std::int64_t covered) const;
  // The first position a state covering `length` needs (kv and gate begin there).
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
  // The rows raw holds in a state covering `length`.
  std::int64_t raw_rows(std::int64_t length) const;
  // After a forward (covered updated): moves the rows a state covering `covered` no longer reads
  // from raw and the frontiers into their slacks, and cuts the slacks to kDsRollbackSlack.
  void trim(class Backend& be);

  DsAttentionKind layer_kind;
  std::int64_t window = 0;                      // W: a query reads W raw rows, its own included
  Tensor raw;                                   // [min(covered, W - 1), D]
  Tensor raw_slack;                             // the rows before raw, up to kDsRollbackSlack
  std::optional<DsCompressorState> compressor;  // CSA, HCA
  std::optional<DsCompressorState> indexer;     // CSA
  std::int64_t covered = 0;
};

// The caches of a fresh sequence, one per layer.
std::unique_ptr<ModelState> new_deepseek_v4_state(const DeepseekV4Config& c,
                                                  const std::shared_ptr<Memory>& memory);

}  // namespace fs
