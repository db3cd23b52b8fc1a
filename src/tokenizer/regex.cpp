#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "tokenizer/utf8.h"

namespace fs {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0)
    return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* c) const { pcre2_match_context_free(c); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};

}  // namespace

Expected<std::string> translate_js_regex(std::string_view pattern) {
  static constexpr std::string_view kCaseless = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
  static constexpr std::string_view kAsciiContractions =
      "(?:'(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))";
  std::string p(pattern);
  for (std::size_t at = p.find(kCaseless); at != std::string::npos; at = p.find(kCaseless, at)) {
    p.replace(at, kCaseless.size(), kAsciiContractions);
    at += kAsciiContractions.size();
  }
  const std::string space_body = utf8::kJsSpaceClassBody;
  std::string out;
  out.reserve(p.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? space_body : "[" + space_body + "]";
      } else if (e == 'S') {
        if (in_class) return unsupported("\\S inside a character class is not supported");
        out += "[^" + space_body + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

void Regex::CodeDeleter::operator()(void* code) const {
  pcre2_code_free(static_cast<pcre2_code*>(code));
}

Expected<Regex> Regex::compile(std::string_view pattern, const std::string& source) {
  auto translated = translate_js_regex(pattern);
  if (!translated.ok()) return translated.status().with_context(source);
  Regex r;
  r.pattern_ = std::move(*translated);
  r.source_ = source;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(r.pattern_.data()), r.pattern_.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    return invalid_argument(source + ": cannot compile the regex at offset " +
                            std::to_string(offset) + ": " + pcre2_message(error));
  }
  r.code_.reset(code);
  // JIT makes the split several times faster; when the platform has no JIT the interpreter
  // gives the same matches, so a failure here is not an error.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return r;
}

template <typename OnMatch>
Status Regex::for_each_match(std::string_view subject, OnMatch&& on_match) const {
  auto* code = static_cast<const pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(
      pcre2_match_data_create_from_pattern(code, nullptr));
  if (!md) return internal_error(source_ + ": out of memory for regex match data");
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context;
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack;
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::size_t start = 0;
  while (start <= subject.size()) {
    int rc =
        pcre2_match(code, subj, subject.size(), start, PCRE2_NO_UTF_CHECK, md.get(), context.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !jit_stack) {
      // A very long run (e.g. megabytes of spaces) can outgrow the default 32 KiB JIT stack;
      // retry this and later matches with a larger one.
      context.reset(pcre2_match_context_create(nullptr));
      jit_stack.reset(pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr));
      if (!context || !jit_stack)
        return internal_error(source_ + ": out of memory for the regex JIT stack");
      pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return internal_error(source_ + ": regex match failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const std::size_t b = ov[0], e = ov[1];
    on_match(b, e);
    if (e > b) {
      start = e;
    } else {
      // An empty match: step over one code point, as JavaScript's matchAll does.
      if (e >= subject.size()) break;
      std::size_t next = e;
      utf8::next(subject, next);
      start = next;
    }
  }
  return {};
}

Status Regex::split_isolated(std::string_view subject, std::vector<std::string_view>& out) const {
  std::size_t prev = 0;
  Status s = for_each_match(subject, [&](std::size_t b, std::size_t e) {
    if (b > prev) out.push_back(subject.substr(prev, b - prev));
    if (e > b) out.push_back(subject.substr(b, e - b));
    prev = e;
  });
  if (!s.ok()) return s;
  if (prev < subject.size()) out.push_back(subject.substr(prev));
  return {};
}

Status Regex::split_removed(std::string_view subject, std::vector<std::string_view>& out) const {
  std::size_t prev = 0;
  Status s = for_each_match(subject, [&](std::size_t b, std::size_t e) {
    if (b > prev) out.push_back(subject.substr(prev, b - prev));
    prev = e;
  });
  if (!s.ok()) return s;
  if (prev < subject.size()) out.push_back(subject.substr(prev));
  return {};
}

}  // namespace fs
