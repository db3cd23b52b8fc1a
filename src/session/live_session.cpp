#include "session/live_session.h"

#include <algorithm>
#include <memory>

namespace fs {

Expected<PreparedSession> prepare_session(Model& model, const SessionTiers& tiers,
                                          std::span<const TokenId> prompt,
                                          const PrepareOptions& options) {
  if (prompt.empty()) return invalid_argument("the prompt has no tokens");
  PreparedSession p;
  const std::size_t ram_match = tiers.ram ? tiers.ram->match_length(prompt) : 0;
  const std::size_t disk_match = tiers.disk ? tiers.disk->match_length(prompt) : 0;
  std::optional<SessionBank::Hit> hit;
  // Disk only when it beats RAM: loading is far slower than a RAM copy.
  if (tiers.disk && disk_match > ram_match) {
    hit = tiers.disk->lookup(prompt, model);
    if (hit) p.tier = "disk";
  }
  if (!hit && tiers.ram && ram_match > 0) {
    hit = tiers.ram->lookup(prompt);
    if (hit) p.tier = "ram";
  }
  if (hit) {
    p.state = std::move(hit->state);
    p.reused_tokens = hit->matched;
  } else {
    p.state = new_decode_state(model);
    p.tier = "cold";
  }

  // Prefill the suffix in chunks, banking restore points at interval boundaries.
  const auto n = static_cast<std::int64_t>(prompt.size());
  const std::int64_t chunk = std::max<std::int64_t>(options.prefill_chunk, 1);
  std::int64_t at = static_cast<std::int64_t>(p.reused_tokens);
  while (at < n) {
    std::int64_t end = std::min(n, at + chunk);
    if (options.restore_point_interval > 0) {
      // Stop exactly at the next boundary so the point is banked there.
      const std::int64_t boundary =
          (at / options.restore_point_interval + 1) * options.restore_point_interval;
      end = std::min(end, boundary);
    }
    if (auto s = extend(
            model, p.state,
            prompt.subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(end - at)));
        !s.ok()) {
      return s;
    }
    at = end;
    if (tiers.ram && options.restore_point_interval > 0 &&
        at % options.restore_point_interval == 0 && at < n) {
      (void)tiers.ram->put(p.state);  // best effort: a full bank evicts or refuses
    }
  }
  if (tiers.disk && p.tier == "cold" && n >= options.persist_after_tokens)
    (void)tiers.disk->persist(p.state);
  return p;
}

bool commit_session(const SessionTiers& tiers, const DecodeState& state, bool complete) {
  if (!complete || !state.check_invariant().ok()) return false;
  bool published = false;
  if (tiers.ram) published = tiers.ram->put(state).ok();
  return published;
}

}  // namespace fs

namespace fs {

std::function<void(const DecodeState&)> persist_at_frontiers(const SessionTiers& tiers,
                                                             std::int64_t interval,
                                                             std::int64_t start) {
  if (!tiers.disk || interval <= 0) return nullptr;
  DiskStore* disk = tiers.disk;
  auto last = std::make_shared<std::int64_t>(start / interval);
  return [disk, interval, last](const DecodeState& s) {
    const auto frontier = static_cast<std::int64_t>(s.tokens.size()) / interval;
    if (frontier > *last) {
      *last = frontier;
      (void)disk->persist(s);
    }
  };
}

void persist_evictions_to_disk(const SessionTiers& tiers) {
  if (!tiers.ram || !tiers.disk) return;
  DiskStore* disk = tiers.disk;
  tiers.ram->set_on_evict([disk](const DecodeState& s) { (void)disk->persist(s); });
}

void persist_all_to_disk(const SessionTiers& tiers) {
  if (!tiers.ram || !tiers.disk) return;
  tiers.ram->for_each([&](const DecodeState& s) { (void)tiers.disk->persist(s); });
  tiers.disk->flush();
}

}  // namespace fs
