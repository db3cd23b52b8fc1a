// A compiled PCRE2 regular expression (UTF + Unicode properties, JIT-compiled) for the
// pre-tokenizer's Split steps.
//
// The reference tokenizers run these patterns as JavaScript regexes, so two constructs are
// rewritten before compiling to keep the same meaning: \s and \S become JavaScript's whitespace
// set (PCRE2's Unicode \s lacks U+FEFF and has U+0085), and the case-insensitive contraction
// group (?i:'s|'t|...) becomes ASCII-only classes (PCRE2's Unicode caseless matching would also
// take U+017F LONG S for 's').
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace fs {

class Regex {
 public:
  // `pattern` is the tokenizer.json pattern; `source` names it in messages.
  static Expected<Regex> compile(std::string_view pattern, const std::string& source);

  // Appends to `out` the pieces of `subject` for the "Isolated" behaviour: every match and every
  // non-empty stretch between matches, in order. `subject` must be valid UTF-8.
  Status split_isolated(std::string_view subject, std::vector<std::string_view>& out) const;
  // "Removed": only the stretches between matches.
  Status split_removed(std::string_view subject, std::vector<std::string_view>& out) const;

  // The pattern as given to PCRE2 (after the rewrites above); for tests and messages.
  const std::string& compiled_pattern() const { return pattern_; }

 private:
  struct CodeDeleter {
    void operator()(void* code) const;
  };
  template <typename OnMatch>
  Status for_each_match(std::string_view subject, OnMatch&& on_match) const;

  std::unique_ptr<void, CodeDeleter>
      code_;  // pcre2_code_8, opaque here to keep PCRE2 out of headers
  std::string pattern_;
  std::string source_;
};

// Exposed for tests: the JavaScript-compatible rewrite described above.
Expected<std::string> translate_js_regex(std::string_view pattern);

}  // namespace fs
