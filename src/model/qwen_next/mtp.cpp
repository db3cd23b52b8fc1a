#include "model/qwen_next/mtp.h"

#include "model/common/hyper_connection.h"
#include "model/common/logits.h"
#include "model/qwen_next/forward.h"
#include "model/qwen_next/step_graph.h"

namespace fs {
namespace {

// Tells a head's key from the trunk's, whose first word is its token count (1-4).
constexpr std::int64_t kHeadKeyTag = -1;

// The history's buffers, which the head's recorded kernels point at.
std::vector<std::int64_t> history_identity(const QsaCache& c) {
  std::vector<std::int64_t> words;
  add_buffer_identity(c, words);
  return words;
}

// The key of a head's step graph: what fixes its ops and their non-scalar arguments, as the
// trunk's key does (forward.cpp). The token count and rows fix the shapes and whether the lm_head
// runs; the draft vocabulary fixes the lm_head's rows (a history step, which has no lm_head,
// keeps its keys when it changes); the indexer blocks the step completes fix the indexer's
// branch; then the history's buffers. The position and the history's length are per-step
// scalars, not part of it.
Backend::StepGraphKey head_key(const QsaCache& c, std::int64_t S, LogitsRows rows,
                               std::int64_t draft_vocabulary) {
  Backend::StepGraphKey key;
  const auto head_rows = rows == LogitsRows::kNone ? 0 : draft_vocabulary;
  key.words = {kHeadKeyTag, S, static_cast<std::int64_t>(rows), head_rows, blocks_completed(c, S)};
  add_buffer_identity(c, key.words);
  return key;
}

}  // namespace

QwenNextMtpHead::QwenNextMtpHead(QwenNextModel& model, const QwenMtpWeights& weights)
    : MtpHeadBase(model.config_.vocab_size), model_(model), w_(weights) {}

std::unique_ptr<ModelState> QwenNextMtpHead::new_history() const {
  std::vector<std::unique_ptr<LayerCache>> caches;
  caches.push_back(std::make_unique<QsaCache>(model_.config_, model_.backend_->memory()));
  return std::make_unique<ModelState>(std::move(caches));
}

std::int64_t QwenNextMtpHead::hidden_width() const {
  return model_.config_.stream_width();
}

Status QwenNextMtpHead::forward(ModelState& history, std::span<const float> hidden,
                                std::span<const TokenId> tokens, LogitsRows rows,
                                ForwardOutput& out) {
  const auto& c = model_.config_;
  auto& be = *model_.backend_;
  const auto S = static_cast<std::int64_t>(tokens.size()), H = c.hidden_size, hc = c.hc_count;
  const auto W = c.stream_width();
  auto cache = checked_history<QsaCache>(history, hidden, tokens);
  if (!cache.ok()) return cache.status();
  out = ForwardOutput{};
  if (S == 0) return {};
  const Position first = (*cache)->covered_tokens();
  const auto eps = static_cast<float>(c.rms_norm_eps);

  // A draft or a history step runs as one graph where the backend has them (docs/GPU.md "Step
  // 10"): recorded on the first step of its key, replayed after, the ops below then doing only
  // their host work (the hidden rows and the embedding's descriptors written to the graph's
  // staging, shapes, the position). Nothing between begin and launch returns early or waits.
  QsaCache& qsa = **cache;
  const bool graph = runs_as_step_graph(be, S, rows);
  std::vector<std::int64_t> identity;
  if (graph) {
    if (!reserve_step(qsa, S))
      return out_of_range("out of " + device_name(be.memory()->device()) +
                          " memory reserving the MTP history for a step");
    identity = history_identity(qsa);
    be.begin_step_graph(head_key(qsa, S, rows, draft_vocabulary()));
  }

  // x = fc_hidden(norm(h)) per stream + fc_embedding(norm(embed(token))) broadcast to the streams.
  const Tensor h = upload_hidden(be, hidden);
  Tensor n, x, e, e_normed, e_projected, e_streams;
  be.rms_norm(h, w_.hidden_norm, H, eps, true, n);
  n.reshape({S * hc, H});
  be.linear(n, w_.fc_hidden, x);
  x.reshape({S, W});
  std::vector<std::int64_t> ids(tokens.begin(), tokens.end());
  be.embedding({&model_.weights_.embed_tokens, 1}, ids, e);
  be.rms_norm(e, w_.embed_norm, H, eps, true, e_normed);
  be.linear(e_normed, w_.fc_embedding, e_projected);
  be.repeat_cols(e_projected, hc, e_streams);
  be.add(x, e_streams);

  QwenNextModel::LayerCaches caches;
  caches.qsa = &qsa;
  model_.decoder_layer(w_.layer, caches, first, tokens, x);

  Tensor mixed, logits, picked;
  if (rows != LogitsRows::kNone) {
    hyper_connection_read(be, w_.mixer, x, mixed, nullptr);
    lm_head_rows(be, mixed, rows, draft_head(model_.weights_.lm_head), logits, picked);
  }
  if (graph) {
    be.launch_step_graph();
    // The key named these buffers: one reallocated inside the step would be the graph's.
    if (be.status().ok() && history_identity(qsa) != identity)
      return internal_error("the MTP history was reallocated inside a step graph");
  }
  return finish(be, rows, x, std::move(logits), picked, graph, out);
}

}  // namespace fs
