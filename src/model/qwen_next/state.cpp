#include "model/qwen_next/state.h"

#include <algorithm>
#include <map>

#include "model/state_load.h"

namespace fs {
namespace {

StateTensor view_of(const std::string& name, const Tensor& t) {
  return {name, &t};
}

Status refuse_truncate(const char* kind, std::int64_t covered, std::int64_t length) {
  if (length == covered) return {};
  return failed_precondition(std::string(kind) + " cache is recurrent: it cannot go back from " +
                             std::to_string(covered) + " to " + std::to_string(length) + " tokens");
}

}  // namespace

// --- GatedDeltaNetCache -------------------------------------------------------------------------

GatedDeltaNetCache::GatedDeltaNetCache(const QwenNextConfig& c,
                                       const std::shared_ptr<Memory>& memory)
    : recurrent(memory, {c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim}),
      conv_tail(memory, {c.linear_conv_kernel_dim - 1, c.gdn_conv_dim()}) {}

std::unique_ptr<LayerCache> GatedDeltaNetCache::clone() const {
  return std::make_unique<GatedDeltaNetCache>(*this);
}
Status GatedDeltaNetCache::truncate(std::int64_t length) {
  if (!window.holds(covered, length)) return refuse_truncate("gdn", covered, length);
  // The state after the window's token j, and the conv tail cut from the inputs up to it.
  const auto j = window.row_for(length);
  recurrent.memory()->copy(recurrent.raw(),
                           static_cast<const char*>(window.states.raw()) +
                               static_cast<std::size_t>(j) * recurrent.bytes(),
                           recurrent.bytes());
  window.restore_tail(conv_tail, j);
  covered = length;
  window.clear();
  return {};
}
bool GatedDeltaNetCache::keep_positions(std::int64_t tokens) {
  // Reserved now (outside any step graph); the forward writes them without allocating.
  if (!window.states.allocate(recurrent.memory(), {tokens, recurrent.numel()}) ||
      !window.reserve_history(conv_tail, tokens))
    return false;
  window.requested = tokens;
  return true;
}
std::size_t GatedDeltaNetCache::bytes() const {
  return static_cast<std::size_t>(recurrent.numel() + conv_tail.numel()) * sizeof(float);
}
std::vector<StateTensor> GatedDeltaNetCache::tensors() const {
  return {view_of("recurrent", recurrent), view_of("conv_tail", conv_tail)};
}
Status GatedDeltaNetCache::load(std::span<const StateTensorView> t, std::int64_t n) {
  Tensor r, c;
  if (auto s = load_state_tensor(t, "recurrent", r, recurrent.shape(), recurrent.memory()); !s.ok())
    return s;
  if (auto s = load_state_tensor(t, "conv_tail", c, conv_tail.shape(), conv_tail.memory()); !s.ok())
    return s;
  recurrent = std::move(r);
  conv_tail = std::move(c);
  covered = n;
  window.clear();
  return {};
}

// --- PleCache
// -------------------------------------------------------------------------------------

PleCache::PleCache(const QwenNextConfig& c, const std::shared_ptr<Memory>& memory)
    : context({c.ngram_size - 1},
              std::vector<float>(
                  static_cast<std::size_t>(c.ngram_size - 1),
                  static_cast<float>(c.eos_token_ids.empty() ? 0 : c.eos_token_ids.front()))),
      conv_tail(memory, {(c.ple_conv_kernel_size - 1) * c.ngram_size, c.stream_width()}) {}

std::unique_ptr<LayerCache> PleCache::clone() const {
  return std::make_unique<PleCache>(*this);
}
Status PleCache::truncate(std::int64_t length) {
  if (!window.holds(covered, length)) return refuse_truncate("ple", covered, length);
  const auto j = window.row_for(length);
  const auto n = context.numel();  // N-1 ids: those ending at the window's token j
  std::vector<std::int64_t> ids(window.ids.begin() + j + 1, window.ids.begin() + j + 1 + n);
  set_context_ids(ids);
  window.restore_tail(conv_tail, j);
  covered = length;
  window.clear();
  return {};
}
bool PleCache::keep_positions(std::int64_t tokens) {
  if (!window.reserve_history(conv_tail, tokens)) return false;
  window.requested = tokens;
  return true;
}
std::size_t PleCache::bytes() const {
  return static_cast<std::size_t>(context.numel() + conv_tail.numel()) * sizeof(float);
}
std::vector<std::int64_t> PleCache::context_ids() const {
  return {context.span().begin(), context.span().end()};
}
void PleCache::set_context_ids(const std::vector<std::int64_t>& ids) {
  for (std::size_t i = 0; i < ids.size(); ++i) context.data()[i] = static_cast<float>(ids[i]);
}
std::vector<StateTensor> PleCache::tensors() const {
  return {view_of("context", context), view_of("conv_tail", conv_tail)};
}
Status PleCache::load(std::span<const StateTensorView> t, std::int64_t n) {
  Tensor ctx, tail;
  if (auto s = load_state_tensor(t, "context", ctx, context.shape(), host_memory()); !s.ok())
    return s;
  if (auto s = load_state_tensor(t, "conv_tail", tail, conv_tail.shape(), conv_tail.memory());
      !s.ok())
    return s;
  for (const float v : ctx.span()) {
    if (v < 0 || v != static_cast<float>(static_cast<std::int64_t>(v)))
      return invalid_argument("ple context holds a value that is not a token id");
  }
  context = std::move(ctx);
  conv_tail = std::move(tail);
  covered = n;
  window.clear();
  return {};
}

// --- QsaCache
// -------------------------------------------------------------------------------------

QsaCache::QsaCache(const QwenNextConfig& c, const std::shared_ptr<Memory>& memory)
    : keys(memory, {0, c.num_key_value_heads * c.head_dim}),
      values(memory, {0, c.num_key_value_heads * c.head_dim}),
      index_keys(memory, {0, c.indexer_head_dim}),
      blocks(memory, {0, c.indexer_head_dim}),
      block(c.indexer_compress_ratio) {}

std::unique_ptr<LayerCache> QsaCache::clone() const {
  return std::make_unique<QsaCache>(*this);
}

Status QsaCache::truncate(std::int64_t length) {
  if (length < 0 || length > covered_tokens())
    return out_of_range("qsa cache covers " + std::to_string(covered_tokens()) +
                        " tokens, cannot truncate to " + std::to_string(length));
  // Attention rows are append-only: a prefix is the state of the prefix. Blocks that are no
  // longer complete go with it.
  keys.shrink_rows(length);
  values.shrink_rows(length);
  index_keys.shrink_rows(length);
  blocks.shrink_rows(length / block);
  return {};
}
std::size_t QsaCache::bytes() const {
  return static_cast<std::size_t>(keys.numel() + values.numel() + index_keys.numel() +
                                  blocks.numel()) *
         sizeof(float);
}
std::vector<StateTensor> QsaCache::tensors() const {
  return {view_of("keys", keys), view_of("values", values), view_of("index_keys", index_keys),
          view_of("blocks", blocks)};
}
Status QsaCache::load(std::span<const StateTensorView> t, std::int64_t n) {
  Tensor k, v, ik, b;
  const auto& m = keys.memory();
  if (auto s = load_state_tensor(t, "keys", k, {n, keys.cols()}, m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "values", v, {n, values.cols()}, m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "index_keys", ik, {n, index_keys.cols()}, m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "blocks", b, {n / block, blocks.cols()}, m); !s.ok()) return s;
  keys = std::move(k);
  values = std::move(v);
  index_keys = std::move(ik);
  blocks = std::move(b);
  return {};
}

std::unique_ptr<ModelState> new_qwen_next_state(const QwenNextConfig& c,
                                                const std::shared_ptr<Memory>& memory) {
  std::vector<std::unique_ptr<LayerCache>> caches;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.layer_types[static_cast<std::size_t>(i)] == QwenLayerKind::kLinearAttention) {
      caches.push_back(std::make_unique<GatedDeltaNetCache>(c, memory));
      if (c.ple_layer_index(i) >= 0) caches.push_back(std::make_unique<PleCache>(c, memory));
    } else {
      caches.push_back(std::make_unique<QsaCache>(c, memory));
    }
  }
  return std::make_unique<ModelState>(std::move(caches));
}

}  // namespace fs
