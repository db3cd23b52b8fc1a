#include "decode/drafter.h"

#include "decode/row_sampling.h"

namespace fs {
namespace {

// A draft from the head's whole row on the backend: the id drawn with `u`, its probability, and
// a copy of the row (the head's next forward may write where its logits lie).
Status draw_on_backend(Backend& be, const Tensor& logits, const SamplerConfig& sampler, double u,
                       DraftToken& draft) {
  auto id = draws_on_backend(be, logits, 0, 1, sampler, {&u, 1}, {});
  if (!id.ok()) return id.status();
  draft.token = id->front();
  auto q = token_probs_on_backend(be, logits, 0, 1, sampler, *id, {});
  if (!q.ok()) return q.status();
  draft.q_of_token = q->front();
  be.slice_rows(logits, 0, 1, draft.q_row);
  if (Status s = be.status(); !s.ok()) {
    be.clear_status();
    return s;
  }
  return {};
}

}  // namespace

Status MtpDrafter::propose(DecodeState& state, TokenId primary, int depth,
                           const SamplerConfig& sampler, Rng& rng, std::vector<DraftToken>& out) {
  out.clear();
  MtpHead* head = model_.mtp();
  if (!head || !state.mtp_history) return failed_precondition("the model has no MTP head");
  if (state.last_hidden.empty())
    return failed_precondition("MTP drafting needs a trunk hidden state");
  std::vector<float> hidden = state.last_hidden;
  TokenId next = primary;
  const bool on_backend = pick_on_backend_ && (sampler.greedy() || model_.backend() != nullptr);
  for (int d = 0; d < depth; ++d) {
    ForwardOutput o;
    const TokenId in[1] = {next};
    const auto rows = on_backend ? LogitsRows::kLastArgmax : LogitsRows::kLast;
    if (auto s = head->forward(*state.mtp_history, hidden, in, rows, o); !s.ok()) return s;
    DraftToken draft;
    if (on_backend && sampler.greedy()) {
      draft.q = TokenDistribution::point(o.argmax.at(0));
      draft.token = o.argmax.at(0);
    } else if (on_backend && !sampler.has_prefix_rule()) {
      // The uniform sample() would take, in the same place; no penalties on drafts.
      if (auto s =
              draw_on_backend(*model_.backend(), o.device_logits, sampler, rng.uniform(), draft);
          !s.ok())
        return s.with_context("MTP draft");
    } else {
      if (on_backend) {
        auto q = distributions_on_backend(*model_.backend(), o.device_logits, 0, 1, sampler);
        if (!q.ok()) return q.status().with_context("MTP draft");
        draft.q = std::move(q->front());
      } else {
        draft.q = target_distribution(o.logits, sampler);
      }
      draft.token = sampler.greedy() ? draft.q.ids.front() : sample(draft.q, rng);
    }
    next = draft.token;
    out.push_back(std::move(draft));
    hidden = std::move(o.hidden);
  }
  return {};
}

Status ScriptedDrafter::propose(DecodeState& state, TokenId primary, int depth,
                                const SamplerConfig&, Rng&, std::vector<DraftToken>& out) {
  out.clear();
  for (TokenId t : script_(state.tokens, primary, depth)) {
    if (static_cast<int>(out.size()) == depth) break;
    out.push_back({t, TokenDistribution::point(t)});
  }
  return {};
}

}  // namespace fs
