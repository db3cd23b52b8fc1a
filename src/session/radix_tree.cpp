#include "session/radix_tree.h"

#include <algorithm>

namespace fs {

RadixTree::RadixTree() : root_(std::make_unique<Node>()) {}
RadixTree::~RadixTree() = default;

void RadixTree::insert(std::span<const TokenId> key, EntryId id) {
  Node* node = root_.get();
  std::size_t at = 0;
  while (at < key.size()) {
    auto it = node->children.find(key[at]);
    if (it == node->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(key.begin() + static_cast<std::ptrdiff_t>(at), key.end());
      leaf->value = id;
      node->children.emplace(key[at], std::move(leaf));
      ++size_;
      return;
    }
    Node* child = it->second.get();
    const auto rest = key.subspan(at);
    const auto common = static_cast<std::size_t>(
        std::mismatch(child->edge.begin(), child->edge.end(), rest.begin(), rest.end()).first -
        child->edge.begin());
    if (common < child->edge.size()) {
      // Split the edge: a new middle node holds the shared part.
      auto middle = std::make_unique<Node>();
      middle->edge.assign(child->edge.begin(),
                          child->edge.begin() + static_cast<std::ptrdiff_t>(common));
      std::unique_ptr<Node> old = std::move(it->second);
      old->edge.erase(old->edge.begin(), old->edge.begin() + static_cast<std::ptrdiff_t>(common));
      const TokenId old_first = old->edge.front();
      middle->children.emplace(old_first, std::move(old));
      it->second = std::move(middle);
      child = it->second.get();
    }
    node = child;
    at += common;
  }
  if (!node->value) ++size_;
  node->value = id;
}

bool RadixTree::erase(std::span<const TokenId> key) {
  // Walk down remembering the path, then clear the value and prune empty leaves. (Single-child
  // nodes are left unmerged: correct, and the tree stays small between compactions.)
  std::vector<std::pair<Node*, TokenId>> path;
  Node* node = root_.get();
  std::size_t at = 0;
  while (at < key.size()) {
    auto it = node->children.find(key[at]);
    if (it == node->children.end()) return false;
    Node* child = it->second.get();
    if (key.size() - at < child->edge.size() ||
        !std::equal(child->edge.begin(), child->edge.end(),
                    key.begin() + static_cast<std::ptrdiff_t>(at))) {
      return false;
    }
    path.emplace_back(node, key[at]);
    node = child;
    at += child->edge.size();
  }
  if (!node->value) return false;
  node->value.reset();
  --size_;
  while (!path.empty()) {
    auto [parent, first] = path.back();
    path.pop_back();
    Node* child = parent->children.at(first).get();
    if (child->value || !child->children.empty()) break;
    parent->children.erase(first);
  }
  return true;
}

std::optional<RadixTree::Match> RadixTree::longest_prefix(std::span<const TokenId> query) const {
  std::optional<Match> best;
  const Node* node = root_.get();
  std::size_t at = 0;
  if (node->value) best = Match{*node->value, 0};
  while (at < query.size()) {
    auto it = node->children.find(query[at]);
    if (it == node->children.end()) break;
    const Node* child = it->second.get();
    if (query.size() - at < child->edge.size() ||
        !std::equal(child->edge.begin(), child->edge.end(),
                    query.begin() + static_cast<std::ptrdiff_t>(at))) {
      break;
    }
    at += child->edge.size();
    node = child;
    if (node->value) best = Match{*node->value, at};
  }
  return best;
}

}  // namespace fs
