#include "session/disk_store.h"

#include <algorithm>
#include <filesystem>

#include "util/atomic_file.h"
#include "util/hash.h"
#include "util/log.h"
#include "util/mapped_file.h"

namespace fs {

namespace stdfs = std::filesystem;

DiskStore::DiskStore(DiskStoreOptions options) : options_(std::move(options)) {}

Expected<std::unique_ptr<DiskStore>> DiskStore::open(DiskStoreOptions options) {
  std::error_code ec;
  stdfs::create_directories(options.dir, ec);
  if (ec) return io_error("cannot create session folder " + options.dir + ": " + ec.message());
  std::unique_ptr<DiskStore> store(new DiskStore(std::move(options)));
  // Oldest first, so last_use keeps the files' relative age.
  std::vector<std::pair<stdfs::file_time_type, stdfs::path>> files;
  for (const auto& e : stdfs::directory_iterator(store->options_.dir, ec)) {
    const auto name = e.path().filename().string();
    if (name.size() > std::string(kTempSuffix).size() && name.ends_with(kTempSuffix)) {
      stdfs::remove(e.path(), ec);  // an interrupted write
      continue;
    }
    if (e.path().extension() == ".fsck") files.emplace_back(e.last_write_time(ec), e.path());
  }
  std::sort(files.begin(), files.end());
  std::lock_guard lock(store->mu_);
  for (const auto& [time, path] : files) {
    auto mapped = MappedFile::open(path.string());
    auto header = mapped.ok() ? parse_checkpoint(mapped->bytes())
                              : Expected<CheckpointHeader>(mapped.status());
    if (!header.ok() || header->family != store->options_.identity.family ||
        header->model_fingerprint != store->options_.identity.model_fingerprint) {
      // Unreadable, or another model's: it can never serve this store.
      const std::string reason = header.ok() ? "fingerprint" : "header";
      ++store->stats_.rejections[reason];
      log_warning("session checkpoint " + path.string() + " removed (" + reason +
                  "): " + (header.ok() ? "made for another model" : header.status().to_string()));
      stdfs::remove(path, ec);
      continue;
    }
    store->index_locked({path.string(), header->key, mapped->size(), ++store->clock_});
  }
  store->enforce_budget_locked();
  store->writer_ = std::thread([s = store.get()] { s->writer_loop(); });
  return store;
}

DiskStore::~DiskStore() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string DiskStore::path_for(std::span<const TokenId> key) const {
  const std::span<const std::uint8_t> bytes(reinterpret_cast<const std::uint8_t*>(key.data()),
                                            key.size_bytes());
  return (stdfs::path(options_.dir) /
          (hex64(xxh3_64(bytes)) + "-" + std::to_string(key.size()) + ".fsck"))
      .string();
}

void DiskStore::index_locked(FileEntry entry) {
  // One file per key: an entry already indexed under this key under another name (a copy, or a
  // file named by another scheme) is deleted, or it would stay on disk outside the budget.
  if (auto m = tree_.longest_prefix(entry.key); m && m->length == entry.key.size())
    remove_locked(m->id, files_.at(m->id).path != entry.path);
  const auto id = next_id_++;
  tree_.insert(entry.key, id);
  bytes_ += entry.bytes;
  files_.emplace(id, std::move(entry));
}

void DiskStore::remove_locked(RadixTree::EntryId id, bool delete_file) {
  const auto it = files_.find(id);
  if (it == files_.end()) return;
  tree_.erase(it->second.key);
  bytes_ -= it->second.bytes;
  if (delete_file) {
    std::error_code ec;
    stdfs::remove(it->second.path, ec);
  }
  files_.erase(it);
}

void DiskStore::enforce_budget_locked() {
  while (bytes_ > options_.byte_budget && !files_.empty()) {
    auto oldest = std::min_element(files_.begin(), files_.end(), [](const auto& a, const auto& b) {
      return a.second.last_use < b.second.last_use;
    });
    remove_locked(oldest->first, true);
    ++stats_.evictions;
  }
}

Status DiskStore::persist(const DecodeState& state) {
  auto encoded = encode_checkpoint(state, options_.identity);
  if (!encoded.ok()) return encoded.status();
  Job job{state.tokens, std::move(encoded).value(), 0};
  job.bytes = job.encoded.head.size() + job.encoded.payload.size();
  if (job.bytes > options_.byte_budget) return out_of_range("state larger than the disk budget");
  {
    std::lock_guard lock(mu_);
    while (!backlog_.empty() && backlog_bytes_ + job.bytes > options_.max_backlog_bytes) {
      backlog_bytes_ -= backlog_.front().bytes;
      backlog_.pop_front();
      ++stats_.dropped_writes;
    }
    backlog_bytes_ += job.bytes;
    backlog_.push_back(std::move(job));
  }
  cv_.notify_all();
  return {};
}

void DiskStore::writer_loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !backlog_.empty(); });
    if (backlog_.empty()) return;  // stopping, and everything written
    Job job = std::move(backlog_.front());
    backlog_.pop_front();
    backlog_bytes_ -= job.bytes;
    writing_ = true;
    lock.unlock();
    const std::string path = path_for(job.key);
    const std::span<const std::uint8_t> parts[2] = {job.encoded.head, job.encoded.payload};
    const Status s = write_file_atomically(path, parts);
    lock.lock();
    writing_ = false;
    if (s.ok()) {
      ++stats_.writes;
      index_locked({path, std::move(job.key), job.bytes, ++clock_});
      enforce_budget_locked();
    } else {
      ++stats_.write_errors;
    }
    cv_.notify_all();
  }
}

void DiskStore::flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return backlog_.empty() && !writing_; });
}

std::size_t DiskStore::match_length(std::span<const TokenId> prompt) {
  std::lock_guard lock(mu_);
  const auto m = tree_.longest_prefix(prompt);
  return m ? m->length : 0;
}

std::optional<SessionBank::Hit> DiskStore::lookup(std::span<const TokenId> prompt, Model& model) {
  std::unique_lock lock(mu_);
  for (;;) {
    const auto m = tree_.longest_prefix(prompt);
    if (!m) {
      ++stats_.misses;
      return std::nullopt;
    }
    FileEntry& f = files_.at(m->id);
    f.last_use = ++clock_;
    const std::string path = f.path;
    lock.unlock();
    std::string reason;
    auto loaded = load_checkpoint(path, model, options_.identity, &reason);
    lock.lock();
    // The file must hold exactly the key it is indexed under (it may have been replaced since it
    // was indexed): the tokens, not only their count.
    const auto want = prompt.first(m->length);
    if (loaded.ok() && std::equal(loaded->state.tokens.begin(), loaded->state.tokens.end(),
                                  want.begin(), want.end())) {
      ++stats_.hits;
      std::error_code ec;
      stdfs::last_write_time(path, stdfs::file_time_type::clock::now(), ec);  // LRU across restarts
      return SessionBank::Hit{std::move(loaded->state), m->length};
    }
    // Never trusted: the file goes, the reason is counted, and a shorter entry may still serve.
    const std::string why = loaded.ok() ? "key_coverage" : reason;
    ++stats_.rejections[why];
    log_warning(
        "session checkpoint " + path + " refused (" + why + "): " +
        (loaded.ok() ? "its key does not match its index entry" : loaded.status().to_string()) +
        "; recomputing");
    remove_locked(m->id, true);
  }
}

DiskStore::Stats DiskStore::stats() {
  std::lock_guard lock(mu_);
  return stats_;
}

std::uint64_t DiskStore::bytes() {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::size_t DiskStore::entries() {
  std::lock_guard lock(mu_);
  return files_.size();
}

}  // namespace fs
