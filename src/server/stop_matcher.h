// Stop sequences on the detokenized stream. Text that could still turn out to be the start of a
// stop sequence is held back, so a client never sees part of a stop sequence, and the text
// before the first match is exactly what a non-streaming response returns.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fs::server {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Appends generated text; returns the text now safe to emit. After a match, returns the text
  // before the match and ignores everything later.
  std::string push(std::string_view text);
  // The text still held back (at the end of generation it is plain text).
  std::string flush();

  bool stopped() const { return !matched_.empty(); }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
};

}  // namespace fs::server
