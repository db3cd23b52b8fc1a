#include "model/glm5/state.h"

#include "model/state_load.h"

namespace fs {

// --- KdaCache ------------------------------------------------------------------------------------

KdaCache::KdaCache(const Glm5Config& c, const std::shared_ptr<Memory>& memory)
    : recurrent(memory, {c.linear_num_heads, c.linear_head_dim, c.linear_head_dim}),
      conv_q(memory, {c.linear_conv_kernel_dim - 1, c.kda_dim()}),
      conv_k(memory, {c.linear_conv_kernel_dim - 1, c.kda_dim()}),
      conv_v(memory, {c.linear_conv_kernel_dim - 1, c.kda_dim()}) {}

std::unique_ptr<LayerCache> KdaCache::clone() const {
  return std::make_unique<KdaCache>(*this);
}
Status KdaCache::truncate(std::int64_t length) {
  if (length == covered) return {};
  if (!window_q.holds(covered, length))
    return failed_precondition("kda cache is recurrent: it cannot go back from " +
                               std::to_string(covered) + " to " + std::to_string(length) +
                               " tokens");
  // The state after the window's token j, and the conv tails cut from the inputs up to it.
  const auto j = window_q.row_for(length);
  recurrent.memory()->copy(recurrent.raw(),
                           static_cast<const char*>(window_q.states.raw()) +
                               static_cast<std::size_t>(j) * recurrent.bytes(),
                           recurrent.bytes());
  window_q.restore_tail(conv_q, j);
  window_k.restore_tail(conv_k, j);
  window_v.restore_tail(conv_v, j);
  covered = length;
  for (auto* w : {&window_q, &window_k, &window_v}) w->clear();
  return {};
}
bool KdaCache::keep_positions(std::int64_t tokens) {
  // Reserved now; the forward writes them without allocating.
  if (!window_q.states.allocate(recurrent.memory(), {tokens, recurrent.numel()}) ||
      !window_q.reserve_history(conv_q, tokens) || !window_k.reserve_history(conv_k, tokens) ||
      !window_v.reserve_history(conv_v, tokens))
    return false;
  for (auto* w : {&window_q, &window_k, &window_v}) w->requested = tokens;
  return true;
}
std::size_t KdaCache::bytes() const {
  return static_cast<std::size_t>(recurrent.numel() + conv_q.numel() + conv_k.numel() +
                                  conv_v.numel()) *
         sizeof(float);
}
std::vector<StateTensor> KdaCache::tensors() const {
  return {{"recurrent", &recurrent}, {"conv_q", &conv_q}, {"conv_k", &conv_k}, {"conv_v", &conv_v}};
}
Status KdaCache::load(std::span<const StateTensorView> t, std::int64_t n) {
  Tensor r, q, k, v;
  const auto& m = recurrent.memory();
  if (auto s = load_state_tensor(t, "recurrent", r, recurrent.shape(), m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "conv_q", q, conv_q.shape(), m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "conv_k", k, conv_k.shape(), m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "conv_v", v, conv_v.shape(), m); !s.ok()) return s;
  recurrent = std::move(r);
  conv_q = std::move(q);
  conv_k = std::move(k);
  conv_v = std::move(v);
  covered = n;
  for (auto* w : {&window_q, &window_k, &window_v}) w->clear();
  return {};
}

// --- DsaCache ------------------------------------------------------------------------------------

DsaCache::DsaCache(const Glm5Config& c, bool full, const std::shared_ptr<Memory>& memory)
    : keys(memory, {0, c.num_attention_heads * c.qk_head_dim()}),
      values(memory, {0, c.num_attention_heads * c.v_head_dim}),
      index_keys(memory, {0, c.index_head_dim}),
      index_gates(memory, {0, c.index_head_dim}),
      pools(memory, {0, c.index_head_dim}),
      kpool(c.index_kpool),
      full_indexer(full) {}

std::unique_ptr<LayerCache> DsaCache::clone() const {
  return std::make_unique<DsaCache>(*this);
}
Status DsaCache::truncate(std::int64_t length) {
  if (length < 0 || length > covered_tokens())
    return out_of_range("dsa cache covers " + std::to_string(covered_tokens()) +
                        " tokens, cannot truncate to " + std::to_string(length));
  keys.shrink_rows(length);
  values.shrink_rows(length);
  if (full_indexer) {
    index_keys.shrink_rows(length);
    index_gates.shrink_rows(length);
    pools.shrink_rows(length / kpool);
  }
  return {};
}
std::size_t DsaCache::bytes() const {
  return static_cast<std::size_t>(keys.numel() + values.numel() + index_keys.numel() +
                                  index_gates.numel() + pools.numel()) *
         sizeof(float);
}
std::vector<StateTensor> DsaCache::tensors() const {
  std::vector<StateTensor> out = {{"keys", &keys}, {"values", &values}};
  if (full_indexer) {
    out.push_back({"index_keys", &index_keys});
    out.push_back({"index_gates", &index_gates});
    out.push_back({"pools", &pools});
  }
  return out;
}
Status DsaCache::load(std::span<const StateTensorView> t, std::int64_t n) {
  Tensor k, v, ik, ig, p;
  const auto& m = keys.memory();
  if (auto s = load_state_tensor(t, "keys", k, {n, keys.cols()}, m); !s.ok()) return s;
  if (auto s = load_state_tensor(t, "values", v, {n, values.cols()}, m); !s.ok()) return s;
  if (full_indexer) {
    const auto dI = index_keys.cols();
    if (auto s = load_state_tensor(t, "index_keys", ik, {n, dI}, m); !s.ok()) return s;
    if (auto s = load_state_tensor(t, "index_gates", ig, {n, dI}, m); !s.ok()) return s;
    if (auto s = load_state_tensor(t, "pools", p, {n / kpool, dI}, m); !s.ok()) return s;
  }
  keys = std::move(k);
  values = std::move(v);
  if (full_indexer) {
    index_keys = std::move(ik);
    index_gates = std::move(ig);
    pools = std::move(p);
  }
  return {};
}

std::unique_ptr<ModelState> new_glm5_state(const Glm5Config& c,
                                           const std::shared_ptr<Memory>& memory) {
  std::vector<std::unique_ptr<LayerCache>> caches;
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const auto u = static_cast<std::size_t>(i);
    if (c.layer_types[u] == GlmAttentionKind::kLinearAttention) {
      caches.push_back(std::make_unique<KdaCache>(c, memory));
    } else {
      caches.push_back(
          std::make_unique<DsaCache>(c, c.indexer_types[u] == GlmIndexerKind::kFull, memory));
    }
  }
  return std::make_unique<ModelState>(std::move(caches));
}

}  // namespace fs
