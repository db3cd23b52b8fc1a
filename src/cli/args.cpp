#include "cli/args.h"

#include <algorithm>
#include <charconv>

namespace fs::cli {

Expected<std::vector<std::int64_t>> parse_list(const std::string& text, const char* what) {
  std::vector<std::int64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const auto end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    std::int64_t v = 0;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size() || v < 0)
      return invalid_argument(std::string(what) + ": '" + item + "' is not a non-negative integer");
    out.push_back(v);
    pos = end + 1;
  }
  return out;
}

}  // namespace fs::cli
