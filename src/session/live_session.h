// A turn's state, from the tiers: restore the longest banked prefix of the prompt (RAM, else
// disk, else nothing), prefill only the suffix, and after the turn publish the state if and only
// if it is complete.
#pragma once

#include <functional>
#include <string>

#include "decode/decode_state.h"
#include "session/disk_store.h"
#include "session/session_bank.h"

namespace fs {

struct SessionTiers {
  SessionBank* ram = nullptr;
  DiskStore* disk = nullptr;  // optional
};

struct PrepareOptions {
  // Tokens a forward call: on the GPU a prefill's products reach their rate from ~2k rows (FP8 48
  // layers: ~2,500 tok/s in calls of 512, ~3,700 in calls of 4,096; bench/NOTES.md session 21),
  // and the restore points below fall on call boundaries.
  std::int64_t prefill_chunk = 2048;
  // During a long prefill, bank a restore point every this many tokens (a multiple of the chunk).
  std::int64_t restore_point_interval = 2048;
  // Persist to disk after a cold prefill of at least this many tokens.
  std::int64_t persist_after_tokens = 1024;
};

struct PreparedSession {
  DecodeState state;
  std::string tier;  // "ram", "disk" or "cold"
  std::size_t reused_tokens = 0;
};

Expected<PreparedSession> prepare_session(Model& model, const SessionTiers& tiers,
                                          std::span<const TokenId> prompt,
                                          const PrepareOptions& options = {});

// Publishes the state after a turn when `complete` (GenerateResult::state_complete); an
// incomplete state is dropped. Returns whether it was published.
bool commit_session(const SessionTiers& tiers, const DecodeState& state, bool complete);

}  // namespace fs

namespace fs {

// A GenerateOptions::on_commit callback that persists the committed state to disk each time a
// long generation crosses a multiple of `interval` tokens (counting from `start`, the prompt's
// length), so a restart mid-conversation resumes from the last frontier instead of recomputing
// the whole generation. Null without a disk tier.
std::function<void(const DecodeState&)> persist_at_frontiers(const SessionTiers& tiers,
                                                             std::int64_t interval,
                                                             std::int64_t start);

// RAM evictions go to disk, so a restart or a returning conversation still finds them.
void persist_evictions_to_disk(const SessionTiers& tiers);
// Clean shutdown: every RAM state to disk, then wait for the writes.
void persist_all_to_disk(const SessionTiers& tiers);

}  // namespace fs
