// A radix tree over token ids: keys are token sequences, values are entry ids. It answers the
// bank's one question: which stored key is the longest prefix of this prompt?
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "model/types.h"

namespace fs {

class RadixTree {
 public:
  using EntryId = std::uint64_t;

  RadixTree();
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  // Sets the value of `key` (replacing any value it had).
  void insert(std::span<const TokenId> key, EntryId id);
  // Removes `key`'s value; returns whether it had one.
  bool erase(std::span<const TokenId> key);

  struct Match {
    EntryId id;
    std::size_t length;  // tokens of the matched key
  };
  // The longest stored key that is a prefix of `query` (the whole query included).
  std::optional<Match> longest_prefix(std::span<const TokenId> query) const;
  std::size_t size() const { return size_; }

 private:
  struct Node {
    std::vector<TokenId> edge;  // the labels from the parent to this node
    std::optional<EntryId> value;
    std::map<TokenId, std::unique_ptr<Node>> children;  // keyed by the child's first label
  };
  std::unique_ptr<Node> root_;
  std::size_t size_ = 0;
};

}  // namespace fs
