// The RAM tier of warm sessions: complete decode states keyed by their token sequence, found by
// longest prefix, evicted least-recently-used within a byte budget.
//
// Recurrent state cannot be truncated, so a stored state serves only prompts that extend its
// whole key. Long prefills therefore also bank interior restore points (states at chunk
// boundaries): a prompt that diverges inside a conversation restores from the nearest point at or
// below the divergence, never from a later one.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "decode/decode_state.h"
#include "session/checkpoint.h"
#include "session/radix_tree.h"

namespace fs {

struct SessionBankOptions {
  std::size_t byte_budget = std::size_t{1} << 30;
  std::size_t max_entries = 64;
};

std::size_t decode_state_bytes(const DecodeState& s);

class SessionBank {
 public:
  explicit SessionBank(SessionBankOptions options = {});

  // Banks a copy of `state` under its key, replacing an equal key. Refuses a state whose
  // invariant fails (an incomplete state is never published) and one larger than the budget.
  Status put(const DecodeState& state, std::uint32_t policy_version = kEnginePolicyVersion);

  struct Hit {
    DecodeState state;    // a copy: the caller may mutate it freely
    std::size_t matched;  // tokens of the prompt it covers
  };
  // The entry whose key is the longest prefix of `prompt`. Entries banked under another engine
  // policy version are refused, counted and dropped.
  std::optional<Hit> lookup(std::span<const TokenId> prompt);
  // Length of the longest banked prefix, without copying (0 when none).
  std::size_t match_length(std::span<const TokenId> prompt);

  // Called with each state evicted by the budget (the disk tier persists them).
  void set_on_evict(std::function<void(const DecodeState&)> f) { on_evict_ = std::move(f); }
  // Every banked state, most recently used last (persisted on clean shutdown).
  void for_each(const std::function<void(const DecodeState&)>& f);

  struct Stats {
    std::int64_t hits = 0, misses = 0, puts = 0, evictions = 0, policy_rejections = 0, oversize = 0;
  };
  Stats stats();
  std::size_t bytes();
  std::size_t entries();

 private:
  struct Entry {
    DecodeState state;
    std::size_t bytes = 0;
    std::uint32_t policy = 0;
    std::list<RadixTree::EntryId>::iterator lru;
  };
  void erase_locked(RadixTree::EntryId id);
  void evict_locked();

  SessionBankOptions options_;
  std::mutex mu_;
  RadixTree tree_;
  std::unordered_map<RadixTree::EntryId, Entry> entries_;
  std::list<RadixTree::EntryId> lru_;  // front: least recently used
  RadixTree::EntryId next_id_ = 1;
  std::size_t bytes_ = 0;
  Stats stats_;
  std::function<void(const DecodeState&)> on_evict_;
};

}  // namespace fs
