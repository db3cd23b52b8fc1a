// Stored responses of the Responses API (store: true): what previous_response_id continues and
// GET /v1/responses/{id} returns. In RAM only, within a byte budget, least recently used first
// out; a restart forgets them (the session bank's disk tier still holds the model states).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/responses_request.h"
#include "tokenizer/types.h"

namespace fs::server {

struct StoredResponse {
  std::string id;
  nlohmann::ordered_json response;  // the response object as it was answered
  std::size_t response_bytes = 0;   // its serialized size (set by the store when 0)
  // The whole conversation a follow-up continues: the earlier turns' items, this request's
  // input items and this response's output items (instructions are not carried over, as in
  // OpenAI's API).
  std::vector<ResponseItem> conversation;
  // This request's own input items: conversation[input_begin, input_end) (input_items lists them).
  std::size_t input_begin = 0, input_end = 0;
  // The exact token sequence the model state covers after this turn (prompt, then the
  // generated tokens), and the same as text (special tokens written out), so a follow-up whose
  // rendering extends `text` continues from these very tokens. Empty when the turn's state was
  // not complete (cancelled, failed).
  std::vector<TokenId> tokens;
  std::string text;

  std::size_t bytes() const;
};

class ResponseStore {
 public:
  explicit ResponseStore(std::size_t byte_budget) : budget_(byte_budget) {}

  // Stores `r` under r->id, evicting the least recently used entries to make room; false (and
  // nothing stored) when it alone is larger than the budget.
  bool put(std::shared_ptr<StoredResponse> r);
  // The entry, marked as most recently used; null when unknown or evicted.
  std::shared_ptr<const StoredResponse> get(const std::string& id);
  bool erase(const std::string& id);

  struct Stats {
    std::int64_t stored = 0, evicted = 0, oversize = 0;
  };
  Stats stats() const;
  std::size_t bytes() const;
  std::size_t entries() const;

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> value;
    std::size_t bytes = 0;
    std::list<std::string>::iterator lru;
  };
  void erase_locked(std::unordered_map<std::string, Entry>::iterator it);

  const std::size_t budget_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // front: least recently used
  std::size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace fs::server
