#include "bench/synthetic_context.h"

#include <random>

#include "bench/fill.h"
#include "model/qwen_next/state.h"

namespace fs::bench {
namespace {

Status refill(Tensor& t, Shape shape, std::uint64_t seed, float scale) {
  t = Tensor(t.memory(), std::move(shape), DType::kF32);
  return fill_uniform(t, seed, scale);
}

// Keys after norm + RoPE have unit-scale entries; raw index keys likewise.
Status fill_qsa(QsaCache& q, std::int64_t rows, std::uint64_t seed) {
  const auto kv = q.keys.cols(), dI = q.index_keys.cols();
  for (auto s :
       {refill(q.keys, {rows, kv}, seed, 1.0f), refill(q.values, {rows, kv}, seed + 1, 1.0f),
        refill(q.index_keys, {rows, dI}, seed + 2, 1.0f),
        refill(q.blocks, {rows / q.block, dI}, seed + 3, 1.0f)})
    if (!s.ok()) return s;
  return {};
}

Status fill_caches(ModelState& state, std::int64_t rows, std::uint64_t seed) {
  for (std::size_t i = 0; i < state.cache_count(); ++i) {
    auto& cache = state.cache(i);
    const std::uint64_t s = seed + 16 * i;
    Status st;
    if (auto* g = dynamic_cast<GatedDeltaNetCache*>(&cache)) {
      st = refill(g->recurrent, g->recurrent.shape(), s, 0.02f);
      if (st.ok()) st = refill(g->conv_tail, g->conv_tail.shape(), s + 1, 1.0f);
      g->covered = rows;
    } else if (auto* p = dynamic_cast<PleCache*>(&cache)) {
      st = refill(p->conv_tail, p->conv_tail.shape(), s, 1.0f);
      std::vector<std::int64_t> ids(static_cast<std::size_t>(p->context.numel()), 1);
      p->set_context_ids(ids);
      p->covered = rows;
    } else if (auto* q = dynamic_cast<QsaCache*>(&cache)) {
      st = fill_qsa(*q, rows, s);
    } else {
      st = internal_error("bench: unknown cache kind '" + cache.kind() + "'");
    }
    if (!st.ok()) return st;
  }
  return {};
}

}  // namespace

Status fill_synthetic_context(Model& model, const QwenNextConfig& c, std::int64_t length,
                              std::uint64_t seed, DecodeState& state) {
  if (length < 2) return invalid_argument("bench: a synthetic context needs at least 2 tokens");
  if (!state.tokens.empty()) return failed_precondition("bench: the state is not fresh");
  const auto before = length - 1;
  if (auto s = fill_caches(*state.trunk, before, seed); !s.ok()) return s;
  // One history row per token t >= 1.
  if (state.mtp_history) {
    if (auto s = fill_caches(*state.mtp_history, before - 1, seed + 7919); !s.ok()) return s;
  }
  std::mt19937 rng(static_cast<std::uint32_t>(seed));
  std::uniform_int_distribution<TokenId> token(1, static_cast<TokenId>(c.vocab_size - 1));
  state.tokens.resize(static_cast<std::size_t>(before));
  for (auto& t : state.tokens) t = token(rng);
  state.last_hidden.assign(static_cast<std::size_t>(c.stream_width()), 0.0f);
  for (std::size_t i = 0; i < state.last_hidden.size(); ++i)
    state.last_hidden[i] = uniform_value(seed + 13, i, 1.0f, 0.0f);
  state.next_logits.assign(static_cast<std::size_t>(c.vocab_size), 0.0f);
  const TokenId last[1] = {token(rng)};
  return extend(model, state, last);
}

}  // namespace fs::bench
