// Typed decode caches of GLM 5.3 Flash (arch-glm.md section 3), one per layer:
//   KDA layer:  KdaCache ("kda"): the fp32 recurrent state S [heads, dk, dv] and the short conv's
//               tails of the raw q, k and v projections [K-1, Q] each (the reference keeps the
//               concatenated [3Q, K] conv_state; the last K-1 columns are all it reads).
//   DSA layer:  DsaCache ("dsa"): the expanded keys and values [T, heads*D] (as HF caches them;
//               NoPE, so they never change), and on full-indexer layers the indexer's rows: its
//               LayerNormed keys and pool gate scores [T, dI], and the compressed keys of the
//               complete pools [T / kpool, dI] (derived from those rows, kept so a decode step
//               compresses only the pool it completes).
// The KDA cache is recurrent: it truncates only to its own length, or, after keep_positions()
// before a forward (an MTP verify), to any length inside that forward (the state after each token
// and the conv inputs are kept, speculation_window.h). The DSA cache's rows are append-only, so
// any prefix is the state of that prefix (pools that are no longer complete go).
//
// The tensors are allocated in the memory of the backend the model runs on.
#pragma once

#include <cstdint>
#include <memory>

#include "model/common/speculation_window.h"
#include "model/glm5/config.h"
#include "model/model.h"
#include "tensor/tensor.h"

namespace fs {

class KdaCache final : public LayerCache {
 public:
  KdaCache(const Glm5Config& c, const std::shared_ptr<Memory>& memory);
  std::string kind() const override { return "kda"; }
  std::int64_t covered_tokens() const override { return covered; }
  std::unique_ptr<LayerCache> clone() const override;
  Status truncate(std::int64_t length) override;
  bool can_truncate(std::int64_t length) const override {
    return length == covered || window_q.holds(covered, length);
  }
  bool keep_positions(std::int64_t tokens) override;
  std::size_t bytes() const override;
  std::vector<StateTensor> tensors() const override;
  Status load(std::span<const StateTensorView> tensors, std::int64_t covered) override;

  Tensor recurrent;               // [heads, dk, dv]
  Tensor conv_q, conv_k, conv_v;  // [K-1, Q] each, oldest row first
  std::int64_t covered = 0;
  // One window per conv tail (its history); window_q also keeps the states [n, heads*dk*dv].
  SpeculationWindow window_q, window_k, window_v;
};

class DsaCache final : public LayerCache {
 public:
  DsaCache(const Glm5Config& c, bool full_indexer, const std::shared_ptr<Memory>& memory);
  std::string kind() const override { return "dsa"; }
  std::int64_t covered_tokens() const override { return keys.rows(); }
  std::unique_ptr<LayerCache> clone() const override;
  Status truncate(std::int64_t length) override;
  bool can_truncate(std::int64_t length) const override {
    return length >= 0 && length <= covered_tokens();
  }
  std::size_t bytes() const override;
  std::vector<StateTensor> tensors() const override;
  Status load(std::span<const StateTensorView> tensors, std::int64_t covered) override;

  Tensor keys, values;  // [T, heads*D]
  // Full-indexer layers only (zero rows otherwise).
  Tensor index_keys;   // [T, dI] k_norm(wk(x))
  Tensor index_gates;  // [T, dI] x · index_kpool_compress_gate^T
  Tensor pools;        // [T / kpool, dI] compressed keys of the complete pools
  std::int64_t kpool = 1;
  bool full_indexer = false;
};

// The caches of a fresh sequence, in layer order.
std::unique_ptr<ModelState> new_glm5_state(const Glm5Config& c,
                                           const std::shared_ptr<Memory>& memory);

}  // namespace fs
