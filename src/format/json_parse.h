// JSON text from outside (request bodies, checkpoint and safetensors headers, tool-call
// arguments) parsed with bounds: nesting depth, input size and value count are checked while
// parsing, and the document is built in time linear in its size (nlohmann's own ordered_json
// parser inserts each key with a linear scan of its object, which is quadratic in the key count).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>

#include "util/status.h"

namespace fs {

struct JsonLimits {
  // Arrays and objects open at once. Deep enough for any request or tool schema seen in
  // practice; shallow enough that the recursive walks nlohmann does on a built document (copy,
  // dump, comparison) stay far from the stack limit.
  std::size_t max_depth = 64;
  std::size_t max_bytes = std::size_t{64} << 20;  // input text
  std::size_t max_values = std::size_t{1} << 22;  // scalars, arrays and objects together
};

// Parses `text` as one JSON document. A repeated object key keeps its first position and its
// last value (as nlohmann's parser does). Refuses (invalid_argument, naming the limit or the
// syntax error and its byte offset) text that is not JSON or exceeds a limit; nothing is
// recursive, so no input can exhaust the stack.
Expected<nlohmann::json> parse_json_bounded(std::string_view text, const JsonLimits& limits = {});
Expected<nlohmann::ordered_json> parse_ordered_json_bounded(std::string_view text,
                                                            const JsonLimits& limits = {});

}  // namespace fs
