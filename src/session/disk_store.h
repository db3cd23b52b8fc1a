// The disk tier of warm sessions: checkpoint files in one folder, within a byte budget, evicted
// least-recently-used, written by a background thread, surviving restarts.
//
// States are encoded on the caller's thread (the model's owner, so no buffer can change under
// the encoder); the writer thread does only file IO. The backlog is bounded in bytes: when full,
// the oldest queued write is dropped (a later persist of the same conversation supersedes it).
// Every load is fully validated (checkpoint.h); a refused file is removed, its reason counted,
// and the caller recomputes cold.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>

#include "session/checkpoint.h"
#include "session/radix_tree.h"
#include "session/session_bank.h"

namespace fs {

struct DiskStoreOptions {
  std::string dir;
  std::uint64_t byte_budget = std::uint64_t{4} << 30;
  std::uint64_t max_backlog_bytes = std::uint64_t{1} << 30;
  CheckpointIdentity identity;
};

class DiskStore {
 public:
  // Creates the folder if needed, removes leftovers of interrupted writes, and indexes every
  // checkpoint whose header parses (others are removed and counted).
  static Expected<std::unique_ptr<DiskStore>> open(DiskStoreOptions options);
  ~DiskStore();  // drains the backlog
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Queues a complete state for writing; an incomplete one is refused.
  Status persist(const DecodeState& state);
  // Waits until every queued write has reached the disk.
  void flush();

  // Longest stored prefix of `prompt`, loaded and validated. nullopt on a miss or a refusal.
  std::optional<SessionBank::Hit> lookup(std::span<const TokenId> prompt, Model& model);
  std::size_t match_length(std::span<const TokenId> prompt);

  struct Stats {
    std::int64_t writes = 0, hits = 0, misses = 0, evictions = 0, dropped_writes = 0,
                 write_errors = 0;
    std::map<std::string, std::int64_t> rejections;  // by reason
  };
  Stats stats();
  std::uint64_t bytes();
  std::size_t entries();

 private:
  explicit DiskStore(DiskStoreOptions options);
  struct FileEntry {
    std::string path;
    std::vector<TokenId> key;
    std::uint64_t bytes = 0;
    std::uint64_t last_use = 0;
  };
  struct Job {
    std::vector<TokenId> key;
    EncodedCheckpoint encoded;
    std::uint64_t bytes = 0;
  };
  void writer_loop();
  void index_locked(FileEntry entry);
  void remove_locked(RadixTree::EntryId id, bool delete_file);
  void enforce_budget_locked();
  std::string path_for(std::span<const TokenId> key) const;

  DiskStoreOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> backlog_;
  std::uint64_t backlog_bytes_ = 0;
  bool writing_ = false;
  bool stopping_ = false;
  RadixTree tree_;
  std::unordered_map<RadixTree::EntryId, FileEntry> files_;
  RadixTree::EntryId next_id_ = 1;
  std::uint64_t clock_ = 0;
  std::uint64_t bytes_ = 0;
  Stats stats_;
  std::thread writer_;
};

}  // namespace fs
