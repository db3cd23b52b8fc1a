#include "server/stop_matcher.h"

#include <algorithm>

namespace fs::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  // An empty sequence would match everywhere; validation refuses it, and this keeps it harmless.
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped()) return {};
  held_.append(text);
  // The earliest match wins; among matches at one position, the longest.
  std::size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const std::size_t at = held_.find(s);
    if (at != std::string::npos &&
        (best == std::string::npos || at < best || (at == best && s.size() > matched_.size()))) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of some stop sequence. Stop sequences are
  // valid UTF-8, so such a tail starts at a character boundary.
  std::size_t keep = 0;
  for (const auto& s : stops_) {
    for (std::size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(held_);
  return stopped() ? std::string() : out;
}

}  // namespace fs::server
