#include "decode/decode_state.h"

#include <algorithm>

namespace fs {

Status DecodeState::check_invariant() const {
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (!trunk) return internal_error("decode state has no trunk state");
  auto covered = trunk->covered_tokens();
  if (!covered.ok()) return covered.status();
  if (*covered != n) {
    return internal_error("trunk covers " + std::to_string(*covered) + " tokens but the key has " +
                          std::to_string(n));
  }
  if (mtp_history) {
    auto rows = mtp_history->covered_tokens();
    if (!rows.ok()) return rows.status();
    const auto want = std::max<std::int64_t>(n - 1, 0);
    if (*rows != want) {
      return internal_error("MTP history has " + std::to_string(*rows) + " rows for " +
                            std::to_string(n) + " tokens (want " + std::to_string(want) + ")");
    }
  }
  if (n > 0 && !has_logits()) return internal_error("decode state covers tokens but has no logits");
  return {};
}

std::vector<float> DecodeState::host_logits() const {
  if (!next_logits.empty() || next_logits_device.numel() == 0) return next_logits;
  const auto vocab = static_cast<std::size_t>(next_logits_device.cols());
  std::vector<float> row(vocab);
  const auto* src = static_cast<const float*>(next_logits_device.raw()) +
                    static_cast<std::size_t>(next_logits_row) * vocab;
  next_logits_device.memory()->to_host(row.data(), src, vocab * sizeof(float));
  return row;
}

void DecodeState::materialize_logits() {
  if (next_logits.empty()) next_logits = host_logits();
  next_logits_device = Tensor{};
  next_logits_row = 0;
}

DecodeState DecodeState::clone() const {
  DecodeState c;
  c.tokens = tokens;
  c.trunk = trunk ? trunk->clone() : nullptr;
  c.mtp_history = mtp_history ? mtp_history->clone() : nullptr;
  c.next_logits = next_logits;
  c.next_logits_device = next_logits_device;
  c.next_logits_row = next_logits_row;
  c.next_argmax = next_argmax;
  c.last_hidden = last_hidden;
  return c;
}

DecodeState new_decode_state(Model& model) {
  DecodeState s;
  s.trunk = model.new_state();
  if (MtpHead* head = model.mtp()) s.mtp_history = head->new_history();
  return s;
}

Status absorb(Model& model, DecodeState& state, std::span<const TokenId> tokens,
              ForwardOutput&& out) {
  if (tokens.empty()) return {};
  const auto n = static_cast<std::int64_t>(tokens.size());
  const auto vocab = model.info().vocab_size;
  const bool on_backend = out.logits.empty() && !out.argmax.empty();
  if (out.rows < 1 ||
      (on_backend ? out.device_logits.cols() != vocab || out.device_logits.rows() != out.rows
                  : static_cast<std::int64_t>(out.logits.size()) < vocab)) {
    return internal_error("forward returned no logits row");
  }
  // The hidden rows on the host (out.hidden), or in the backend's memory (out.device_hidden,
  // HiddenRows::kBackend, with the last row in out.hidden): the MTP history takes them there.
  const auto w = out.hidden_width;
  const bool rows_on_backend = out.device_hidden.numel() > 0;
  if (rows_on_backend && (out.device_hidden.rows() != n || out.device_hidden.cols() != w ||
                          static_cast<std::int64_t>(out.hidden.size()) != w)) {
    return internal_error("forward returned backend hidden rows of the wrong shape");
  }
  if (state.mtp_history && rows_on_backend) {
    MtpHead* head = model.mtp();
    if (!head || w != head->hidden_width())
      return internal_error("forward returned no hidden rows for the MTP history");
    const std::span<const float> before =
        state.tokens.empty() ? std::span<const float>{} : std::span<const float>(state.last_hidden);
    if (auto s = head->absorb_rows(*state.mtp_history, before, out.device_hidden, tokens);
        !s.ok()) {
      return s.with_context("MTP history");
    }
  } else if (state.mtp_history) {
    MtpHead* head = model.mtp();
    if (!head || w != head->hidden_width() ||
        static_cast<std::int64_t>(out.hidden.size()) != n * w) {
      return internal_error("forward returned no hidden rows for the MTP history");
    }
    // Row for tokens[i] pairs it with the hidden of the position before it: the previous call's
    // last hidden for i = 0, this call's row i-1 otherwise. The very first token has no row.
    std::vector<float> pair_hidden;
    std::vector<TokenId> pair_tokens;
    if (!state.tokens.empty()) {
      pair_hidden.insert(pair_hidden.end(), state.last_hidden.begin(), state.last_hidden.end());
      pair_tokens.push_back(tokens[0]);
    }
    for (std::int64_t i = 1; i < n; ++i) {
      const auto row = out.hidden.begin() + (i - 1) * w;
      pair_hidden.insert(pair_hidden.end(), row, row + w);
      pair_tokens.push_back(tokens[static_cast<std::size_t>(i)]);
    }
    if (!pair_tokens.empty()) {
      ForwardOutput ignored;
      if (auto s = head->forward(*state.mtp_history, pair_hidden, pair_tokens, LogitsRows::kNone,
                                 ignored);
          !s.ok()) {
        return s.with_context("MTP history");
      }
    }
  }
  state.tokens.insert(state.tokens.end(), tokens.begin(), tokens.end());
  if (on_backend) {
    state.next_logits.clear();
    state.next_logits_device = std::move(out.device_logits);
    state.next_logits_row = out.rows - 1;
    state.next_argmax = out.argmax.back();
  } else {
    const auto last = out.logits.end() - vocab;
    state.next_logits.assign(last, out.logits.end());
    state.next_logits_device = Tensor{};
    state.next_logits_row = 0;
    state.next_argmax.reset();
  }
  if (out.hidden_width > 0 && static_cast<std::int64_t>(out.hidden.size()) >= out.hidden_width) {
    state.last_hidden.assign(out.hidden.end() - out.hidden_width, out.hidden.end());
  }
  return {};
}

Status extend(Model& model, DecodeState& state, std::span<const TokenId> tokens, std::int64_t chunk,
              LogitsRows last) {
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t step = chunk > 0 ? chunk : std::max<std::int64_t>(n, 1);
  for (std::int64_t at = 0; at < n; at += step) {
    const auto part = tokens.subspan(static_cast<std::size_t>(at),
                                     static_cast<std::size_t>(std::min(step, n - at)));
    ForwardOutput out;
    // The hidden rows stay on the backend: absorb hands them to the MTP history there.
    if (auto s = model.forward(*state.trunk, part, last, out, HiddenRows::kBackend); !s.ok())
      return s;
    if (auto s = absorb(model, state, part, std::move(out)); !s.ok()) return s;
  }
  return {};
}

RollbackPoint RollbackPoint::take(ModelState& state, std::int64_t tokens) {
  RollbackPoint p;
  p.length_ = state.cache_count() ? state.cache(0).covered_tokens() : 0;
  // Attention-like caches keep their rows and truncate to any shorter length; recurrent caches
  // are asked to keep their positions through the verify. (can_truncate(0) asks the former:
  // a recurrent cache answers it only when empty, or from the window of its last forward, which
  // the verify replaces.)
  bool in_place = true;
  for (std::size_t i = 0; i < state.cache_count(); ++i) {
    LayerCache& c = state.cache(i);
    if (!c.keep_positions(tokens) && !c.can_truncate(0)) in_place = false;
  }
  if (in_place) return p;
  p.clones_.resize(state.cache_count());
  for (std::size_t i = 0; i < state.cache_count(); ++i) {
    LayerCache& c = state.cache(i);
    c.keep_positions(0);  // withdraws the request
    if (!c.can_truncate(0)) p.clones_[i] = c.clone();
  }
  return p;
}

Status RollbackPoint::rewind(ModelState& state, std::int64_t kept) const {
  if (!in_place()) return internal_error("rollback point holds clones: restore, not rewind");
  return state.truncate(length_ + kept);
}

Status RollbackPoint::restore(ModelState& state) const {
  if (state.cache_count() != clones_.size())
    return internal_error("rollback point taken on another state");
  for (std::size_t i = 0; i < clones_.size(); ++i) {
    if (clones_[i]) {
      state.replace_cache(i, clones_[i]->clone());
    } else if (auto s = state.cache(i).truncate(length_); !s.ok()) {
      return s;
    }
  }
  return {};
}

ForwardOutput first_rows(ForwardOutput&& out, std::int64_t rows, std::int64_t vocab) {
  ForwardOutput o = std::move(out);
  if (rows >= o.rows) return o;
  o.rows = rows;
  if (!o.logits.empty()) o.logits.resize(static_cast<std::size_t>(rows * vocab));
  if (!o.argmax.empty()) o.argmax.resize(static_cast<std::size_t>(rows));
  if (o.device_logits.numel() > 0) o.device_logits.shrink_rows(rows);
  if (o.hidden_width > 0) o.hidden.resize(static_cast<std::size_t>(rows * o.hidden_width));
  return o;
}

}  // namespace fs
