// Scanning helpers shared by the tool-call readers (see tool_call_reader.h).
#include <nlohmann/json.hpp>

#include "format/json_parse.h"
#include "tokenizer/chat/tool_call_reader.h"
#include "tokenizer/utf8.h"

namespace fs::chat_detail {

Match starts_with_tag(std::string_view s, std::string_view tag) {
  if (s.size() >= tag.size()) return s.substr(0, tag.size()) == tag ? Match::kYes : Match::kNo;
  return tag.substr(0, s.size()) == s ? Match::kPartial : Match::kNo;
}

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

void skip_space(CallInput& in) {
  const std::string_view s = in.rest();
  std::size_t n = 0;
  while (n < s.size() && is_ascii_space(s[n])) ++n;
  in.consume(n);
}

Match take_tag(CallInput& in, std::string_view tag) {
  const Match m = starts_with_tag(in.rest(), tag);
  if (m == Match::kYes) in.consume(tag.size());
  return m;
}

bool take_until(CallInput& in, std::string_view tag, std::string& value) {
  const std::string_view s = in.rest();
  if (const std::size_t at = s.find(tag); at != std::string_view::npos) {
    value.append(s.substr(0, at));
    in.consume(at + tag.size());
    return true;
  }
  // Hold back the longest suffix that could begin `tag`.
  std::size_t keep = std::min(s.size(), tag.size() - 1);
  while (keep > 0 && starts_with_tag(s.substr(s.size() - keep), tag) != Match::kPartial) --keep;
  value.append(s.substr(0, s.size() - keep));
  in.consume(s.size() - keep);
  return false;
}

int take_until_any(CallInput& in, std::initializer_list<std::string_view> tags, std::string& value,
                   bool consume_tag) {
  const std::string_view s = in.rest();
  for (std::size_t i = s.find('<'); i != std::string_view::npos; i = s.find('<', i + 1)) {
    bool partial = false;
    int index = 0;
    for (const std::string_view tag : tags) {
      const Match m = starts_with_tag(s.substr(i), tag);
      if (m == Match::kYes) {
        value.append(s.substr(0, i));
        in.consume(consume_tag ? i + tag.size() : i);
        return index;
      }
      partial = partial || m == Match::kPartial;
      ++index;
    }
    if (partial) {
      value.append(s.substr(0, i));
      in.consume(i);
      return -1;
    }
  }
  value.append(s);
  in.consume(s.size());
  return -1;
}

Match take_name(CallInput& in, char terminator, std::string& name, std::size_t max_bytes) {
  const std::string_view s = in.rest();
  std::size_t n = 0;
  Match m = Match::kPartial;
  for (; n < s.size(); ++n) {
    if (s[n] == terminator) {
      m = Match::kYes;
      break;
    }
    if (s[n] == '<' || s[n] == '\n' || name.size() + n >= max_bytes) {
      m = Match::kNo;
      break;
    }
  }
  name.append(s.substr(0, n));
  in.consume(m == Match::kYes ? n + 1 : n);
  return m;
}

Match take_name_until(CallInput& in, std::string_view tag, std::string& name,
                      std::size_t max_bytes) {
  const std::string_view s = in.rest();
  std::size_t n = 0;
  Match m = Match::kPartial;
  for (; n < s.size(); ++n) {
    if (s[n] == '<') {
      const Match t = starts_with_tag(s.substr(n), tag);
      if (t == Match::kYes) {
        m = Match::kYes;
        break;
      }
      if (t == Match::kPartial) break;  // wait for the rest of the tag
    }
    if (s[n] == '<' || s[n] == '\n' || name.size() + n >= max_bytes) {
      m = Match::kNo;
      break;
    }
  }
  name.append(s.substr(0, n));
  in.consume(m == Match::kYes ? n + tag.size() : n);
  return m;
}

std::string json_quote(std::string_view s) {
  return nlohmann::json(std::string(s))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string json_value_of(std::string_view value) {
  const std::string_view trimmed = utf8::trim(value);
  if (!trimmed.empty()) {
    auto parsed = parse_json_bounded(trimmed);
    if (parsed.ok() && !parsed->is_string()) return std::string(trimmed);
  }
  return json_quote(value);
}

ReadResult ArgumentsStream::read(CallInput& in, CallOutput& out) {
  const std::string_view s = in.rest();
  std::string accepted;
  std::size_t n = 0;
  ReadResult result = ReadResult::kNeedMore;
  for (; n < s.size(); ++n) {
    if (!started_ && s[n] != '{') {
      result = ReadResult::kFailed;
      break;
    }
    started_ = true;
    const JsonScanner::Push p = scanner_.push(s[n]);
    if (p == JsonScanner::Push::kError) {
      result = ReadResult::kFailed;
      break;
    }
    if (p == JsonScanner::Push::kEscaped) {
      accepted += scanner_.escaped();
    } else {
      accepted += s[n];
    }
    if (scanner_.done()) {
      ++n;
      result = ReadResult::kDone;
      break;
    }
  }
  in.consume(n);
  if (!accepted.empty()) out.arguments(accepted);
  if (result == ReadResult::kNeedMore && in.at_end()) result = ReadResult::kFailed;
  return result;
}

}  // namespace fs::chat_detail
