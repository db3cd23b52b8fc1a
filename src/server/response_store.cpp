#include "server/response_store.h"

namespace fs::server {

std::size_t StoredResponse::bytes() const {
  std::size_t n = sizeof(StoredResponse) + id.size() + response_bytes + text.size() +
                  tokens.size() * sizeof(TokenId);
  for (const auto& item : conversation) n += item.bytes();
  return n;
}

bool ResponseStore::put(std::shared_ptr<StoredResponse> r) {
  if (r->response_bytes == 0)
    r->response_bytes =
        r->response.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).size();
  const std::size_t n = r->bytes();
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(r->id); it != entries_.end()) erase_locked(it);
  if (n > budget_) {
    ++stats_.oversize;
    return false;
  }
  while (bytes_ + n > budget_ && !lru_.empty()) {
    erase_locked(entries_.find(lru_.front()));
    ++stats_.evicted;
  }
  lru_.push_back(r->id);
  const std::string id = r->id;
  entries_.emplace(id, Entry{std::move(r), n, std::prev(lru_.end())});
  bytes_ += n;
  ++stats_.stored;
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return it->second.value;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  erase_locked(it);
  return true;
}

void ResponseStore::erase_locked(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

ResponseStore::Stats ResponseStore::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

std::size_t ResponseStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::size_t ResponseStore::entries() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace fs::server
