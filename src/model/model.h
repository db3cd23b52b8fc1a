// The contract between a model family and everything above it (decode, session, server).
//
// A family implements `Model` (the forward pass) and builds a `ModelState` from typed
// `LayerCache`s (DESIGN principle 2). Decode sees models only through these interfaces;
// session code sees states only through `tensors()`/`load()`/`compare_states()`.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/family.h"
#include "model/numerics.h"
#include "model/types.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace fs {

// One named float32 tensor of a cache, in the cache's own memory (host or device). Reading its
// values is an explicit copy (`Tensor::to_host_vector`).
struct StateTensor {
  std::string name;
  const Tensor* tensor = nullptr;
};

// Host values of one named state tensor, the input of `LayerCache::load` (a checkpoint's payload,
// or another state's copied values).
struct StateTensorView {
  std::string name;
  Shape shape;
  std::span<const float> data;
};

// One typed cache of one layer: attention KV, recurrent state, conv tail, n-gram context,
// indexer buffers, MTP history...
class LayerCache {
 public:
  virtual ~LayerCache() = default;

  // Short stable name of the cache type ("gdn", "qsa_kv", "ple", ...): part of tensor names.
  virtual std::string kind() const = 0;
  // Tokens this cache has absorbed.
  virtual std::int64_t covered_tokens() const = 0;
  virtual std::unique_ptr<LayerCache> clone() const = 0;
  // Forgets every token at position >= length. A cache that cannot (a recurrent state has no
  // history) returns failed_precondition unless length == covered_tokens().
  virtual Status truncate(std::int64_t length) = 0;
  // Whether truncate(length) would succeed; ModelState asks every cache before changing any.
  virtual bool can_truncate(std::int64_t length) const { return length == covered_tokens(); }
  // Asks a cache that cannot truncate (a recurrent state) to keep, during the next forward of at
  // most `tokens` tokens, what truncate() needs to go back to any length inside that forward (an
  // MTP verify, whose partial acceptance then costs a copy instead of a second forward). Buffers
  // are reserved here, before the forward. False when the cache has no such form (the caller
  // clones it instead); caches that truncate anyway need not answer.
  virtual bool keep_positions(std::int64_t /*tokens*/) { return false; }
  virtual std::size_t bytes() const = 0;
  // The contents as named float32 tensors, enough to rebuild the cache exactly.
  virtual std::vector<StateTensor> tensors() const = 0;
  // Rebuilds the contents from host copies of tensors() of an equal cache (from any backend);
  // `covered` is its covered_tokens(). Names or shapes that do not fit this cache's config are
  // an error, never a partial load; the values are copied into this cache's own memory.
  virtual Status load(std::span<const StateTensorView> tensors, std::int64_t covered) = 0;
};

// Host copies of a cache's tensors, in the form `LayerCache::load` takes (the views point into
// `values`): how a state moves between backends without a file.
struct HostStateTensors {
  std::vector<std::vector<float>> values;
  std::vector<StateTensorView> views;
};
HostStateTensors copy_to_host(const LayerCache& cache);

// The full decode state of a sequence: one or more caches per layer, in a fixed order.
class ModelState {
 public:
  ModelState() = default;
  explicit ModelState(std::vector<std::unique_ptr<LayerCache>> caches)
      : caches_(std::move(caches)) {}

  std::span<const std::unique_ptr<LayerCache>> caches() const { return caches_; }
  LayerCache& cache(std::size_t i) { return *caches_.at(i); }
  const LayerCache& cache(std::size_t i) const { return *caches_.at(i); }
  std::size_t cache_count() const { return caches_.size(); }
  void replace_cache(std::size_t i, std::unique_ptr<LayerCache> cache) {
    caches_.at(i) = std::move(cache);
  }

  // The tokens every cache has absorbed; an error naming the first cache that disagrees.
  Expected<std::int64_t> covered_tokens() const;
  std::unique_ptr<ModelState> clone() const;
  std::size_t bytes() const;
  Status truncate(std::int64_t length);
  // Every cache's tensors, named "<index>.<kind>.<name>".
  std::vector<StateTensor> tensors() const;
  // An error naming the first tensor whose allocation failed (its memory was exhausted when the
  // state was built or loaded): such a state must not enter a forward.
  Status check_allocated() const;

 private:
  std::vector<std::unique_ptr<LayerCache>> caches_;
};

struct TensorDifference {
  std::string name;
  double max_abs = 0;
  bool shape_mismatch = false;
};

// Tensor-by-tensor comparison of two states (names, shapes, max |a - b|), on host copies, so the
// states may live on different backends. Tensors present in one state only are reported with
// shape_mismatch.
std::vector<TensorDifference> compare_states(const ModelState& a, const ModelState& b);
double max_difference(const std::vector<TensorDifference>& diffs);

// Which rows of logits a forward call returns. The *Argmax forms are greedy decoding's: the
// rows stay on the backend (ForwardOutput::device_logits) and only their argmax ids (ties to
// the lower id, as fs::argmax) cross to the host.
enum class LogitsRows { kAll, kLast, kNone, kAllArgmax, kLastArgmax };

inline bool logits_of_all_rows(LogitsRows r) {
  return r == LogitsRows::kAll || r == LogitsRows::kAllArgmax;
}
// Where a forward leaves the trunk's hidden rows: on the host (ForwardOutput::hidden), or in the
// backend's memory (ForwardOutput::device_hidden) for a caller that hands them to the MTP head
// there: a prefill's rows (S x the stream width, 160 MB at 4,096 tokens of Qwen 3.8 Flash Next)
// then never cross to the host and back.
enum class HiddenRows { kHost, kBackend };

inline bool logits_stay_on_backend(LogitsRows r) {
  return r == LogitsRows::kAllArgmax || r == LogitsRows::kLastArgmax;
}

struct ForwardOutput {
  std::int64_t rows = 0;      // rows of logits returned
  std::vector<float> logits;  // [rows x vocab]; empty for the *Argmax forms
  // The *Argmax forms: the id of each row's largest logit, and the rows [rows, vocab] in the
  // backend's memory (read back only if a caller later needs the values).
  std::vector<TokenId> argmax;
  Tensor device_logits;
  std::int64_t hidden_width = 0;
  std::vector<float> hidden;  // [tokens x hidden_width]: the trunk's final stream (MTP input)
  // HiddenRows::kBackend: the rows [tokens, hidden_width] in the backend's memory, and `hidden`
  // only the last of them (what a decode state keeps as last_hidden).
  Tensor device_hidden;
};

struct ModelInfo {
  Family family = Family::kQwenNext;
  std::string backend = "cpu";  // the backend it computes on
  DType dtype = DType::kF32;    // of its matrices on that backend
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::vector<TokenId> eos_token_ids;
  bool has_mtp = false;
  // The arithmetic it computes with: part of what a saved state is keyed by.
  Numerics numerics = Numerics::kHf;
};

class MtpHead;
class Backend;

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  // A fresh state that covers no tokens.
  virtual std::unique_ptr<ModelState> new_state() const = 0;
  // Feeds `tokens` through `state` (which advances by tokens.size()) and returns the logits of
  // the requested rows. Any split of a sequence into calls gives the same logits and state.
  // On error the state is unspecified and must not be used. `hidden`: where the trunk's hidden
  // rows go (HiddenRows); a model may leave them on the host either way (one without a backend
  // does), so a caller takes both forms.
  virtual Status forward(ModelState& state, std::span<const TokenId> tokens, LogitsRows rows,
                         ForwardOutput& out, HiddenRows hidden = HiddenRows::kHost) = 0;
  // The checkpoint's multi-token-prediction head, or nullptr when it has none.
  virtual MtpHead* mtp() { return nullptr; }
  // The backend the forward computes on, whose memory holds the logits the *Argmax forms leave
  // there: the decoder runs its sampling ops on them (decode/row_sampling.h). nullptr for a model
  // without one (test doubles); the decoder then reads rows back.
  virtual Backend* backend() { return nullptr; }
};

}  // namespace fs
