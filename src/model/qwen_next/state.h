// Typed decode caches of Qwen 3.8 Flash Next (arch-qwen.md section 3), one or two per layer:
//   linear layer:  GatedDeltaNetCache ("gdn": recurrent state S [Hv, dk, dv] fp32 + conv tail
//                  [K-1, conv_dim]); PLE layers add PleCache ("ple": n-gram context [N-1] and the
//                  dilated conv tail [(Kp-1)*N, hc*H]).
//   QSA layer:     QsaCache ("qsa": keys/values [T, Hkv*D] after norm+RoPE, the indexer's raw keys
//                  [T, dI], and pooled block keys [T/c, dI] after k_layernorm + RoPE).
// Recurrent caches (gdn, ple) hold no history: they truncate only to their own length, or, after
// keep_positions() before a forward (an MTP verify), to any length inside that forward.
//
// The family declares the shapes; the tensors are allocated in the memory of the backend the
// model runs on (DESIGN "On the GPU", rule 2). The PLE n-gram context is token-id bookkeeping
// the host needs to hash the next n-grams, so it stays in host memory on every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/common/speculation_window.h"
#include "model/model.h"
#include "model/qwen_next/config.h"
#include "tensor/tensor.h"

namespace fs {

class GatedDeltaNetCache final : public LayerCache {
 public:
  GatedDeltaNetCache(const QwenNextConfig& c, const std::shared_ptr<Memory>& memory);
  std::string kind() const override { return "gdn"; }
  std::int64_t covered_tokens() const override { return covered; }
  std::unique_ptr<LayerCache> clone() const override;
  Status truncate(std::int64_t length) override;
  bool can_truncate(std::int64_t length) const override {
    return length == covered || window.holds(covered, length);
  }
  bool keep_positions(std::int64_t tokens) override;
  std::size_t bytes() const override;
  std::vector<StateTensor> tensors() const override;
  Status load(std::span<const StateTensorView> tensors, std::int64_t covered) override;

  Tensor recurrent;  // [Hv, dk, dv]
  Tensor conv_tail;  // [K-1, conv_dim], oldest row first
  std::int64_t covered = 0;
  SpeculationWindow window;  // states [n, Hv*dk*dv], history [K-1 + n, conv_dim]
};

class PleCache final : public LayerCache {
 public:
  PleCache(const QwenNextConfig& c, const std::shared_ptr<Memory>& memory);
  std::string kind() const override { return "ple"; }
  std::int64_t covered_tokens() const override { return covered; }
  std::unique_ptr<LayerCache> clone() const override;
  Status truncate(std::int64_t length) override;
  bool can_truncate(std::int64_t length) const override {
    return length == covered || window.holds(covered, length);
  }
  bool keep_positions(std::int64_t tokens) override;
  std::size_t bytes() const override;
  std::vector<StateTensor> tensors() const override;
  Status load(std::span<const StateTensorView> tensors, std::int64_t covered) override;

  // The last N-1 token ids, eos-padded; stored as float like every state tensor (token ids are
  // below 2^24, so exact). Use context_ids()/set_context_ids() for the integer view.
  Tensor context;    // [N-1], host memory
  Tensor conv_tail;  // [(Kp-1)*N, hc*H]
  std::int64_t covered = 0;
  // history [(Kp-1)*N + n, hc*H] (the conv inputs), ids: the context then the forward's tokens
  SpeculationWindow window;

  std::vector<std::int64_t> context_ids() const;
  void set_context_ids(const std::vector<std::int64_t>& ids);
};

class QsaCache final : public LayerCache {
 public:
  QsaCache(const QwenNextConfig& c, const std::shared_ptr<Memory>& memory);
  std::string kind() const override { return "qsa"; }
  std::int64_t covered_tokens() const override { return keys.rows(); }
  std::unique_ptr<LayerCache> clone() const override;
  Status truncate(std::int64_t length) override;
  bool can_truncate(std::int64_t length) const override {
    return length >= 0 && length <= covered_tokens();
  }
  std::size_t bytes() const override;
  std::vector<StateTensor> tensors() const override;
  Status load(std::span<const StateTensorView> tensors, std::int64_t covered) override;

  Tensor keys, values;  // [T, Hkv*D]
  Tensor index_keys;    // [T, dI] raw
  Tensor blocks;        // [T / c, dI] pooled, normed, rotated at the block's first position
  std::int64_t block = 1;
};

// The caches of a fresh sequence, in layer order (gdn[, ple] per linear layer, qsa per QSA layer).
std::unique_ptr<ModelState> new_qwen_next_state(const QwenNextConfig& c,
                                                const std::shared_ptr<Memory>& memory);

}  // namespace fs
