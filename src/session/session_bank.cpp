#include "session/session_bank.h"

namespace fs {

std::size_t decode_state_bytes(const DecodeState& s) {
  std::size_t b = s.tokens.size() * sizeof(TokenId) +
                  (s.next_logits.size() + s.last_hidden.size()) * sizeof(float) +
                  s.next_logits_device.bytes();
  if (s.trunk) b += s.trunk->bytes();
  if (s.mtp_history) b += s.mtp_history->bytes();
  return b;
}

SessionBank::SessionBank(SessionBankOptions options) : options_(options) {}

Status SessionBank::put(const DecodeState& state, std::uint32_t policy_version) {
  if (auto s = state.check_invariant(); !s.ok())
    return s.with_context("refusing to bank an incomplete state");
  const std::size_t size = decode_state_bytes(state);
  std::lock_guard lock(mu_);
  if (size > options_.byte_budget) {
    ++stats_.oversize;
    return out_of_range("state of " + std::to_string(size) + " bytes exceeds the bank budget of " +
                        std::to_string(options_.byte_budget));
  }
  if (auto m = tree_.longest_prefix(state.tokens); m && m->length == state.tokens.size())
    erase_locked(m->id);
  const auto id = next_id_++;
  Entry e;
  e.state = state.clone();
  e.bytes = size;
  e.policy = policy_version;
  e.lru = lru_.insert(lru_.end(), id);
  tree_.insert(state.tokens, id);
  entries_.emplace(id, std::move(e));
  bytes_ += size;
  ++stats_.puts;
  evict_locked();
  return {};
}

void SessionBank::erase_locked(RadixTree::EntryId id) {
  const auto it = entries_.find(id);
  if (it == entries_.end()) return;
  tree_.erase(it->second.state.tokens);
  lru_.erase(it->second.lru);
  bytes_ -= it->second.bytes;
  entries_.erase(it);
}

void SessionBank::evict_locked() {
  while (!lru_.empty() &&
         (bytes_ > options_.byte_budget || entries_.size() > options_.max_entries)) {
    const auto id = lru_.front();
    if (on_evict_) on_evict_(entries_.at(id).state);
    erase_locked(id);
    ++stats_.evictions;
  }
}

std::optional<SessionBank::Hit> SessionBank::lookup(std::span<const TokenId> prompt) {
  std::lock_guard lock(mu_);
  for (;;) {
    const auto m = tree_.longest_prefix(prompt);
    if (!m) {
      ++stats_.misses;
      return std::nullopt;
    }
    Entry& e = entries_.at(m->id);
    if (e.policy != kEnginePolicyVersion) {
      ++stats_.policy_rejections;
      erase_locked(m->id);
      continue;  // a shorter entry may still serve
    }
    lru_.splice(lru_.end(), lru_, e.lru);
    ++stats_.hits;
    return Hit{e.state.clone(), m->length};
  }
}

std::size_t SessionBank::match_length(std::span<const TokenId> prompt) {
  std::lock_guard lock(mu_);
  const auto m = tree_.longest_prefix(prompt);
  return m ? m->length : 0;
}

void SessionBank::for_each(const std::function<void(const DecodeState&)>& f) {
  std::lock_guard lock(mu_);
  for (const auto id : lru_) f(entries_.at(id).state);
}

SessionBank::Stats SessionBank::stats() {
  std::lock_guard lock(mu_);
  return stats_;
}

std::size_t SessionBank::bytes() {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::size_t SessionBank::entries() {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace fs
