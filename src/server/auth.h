// API key checks. The comparison takes the same time wherever the keys differ (and whatever the
// length of the candidate), so response timing does not reveal a prefix of the key.
#pragma once

#include <string_view>

namespace fs::server {

// True when `given` equals `expected`; time depends only on expected.size().
bool constant_time_equal(std::string_view given, std::string_view expected);

// `x_api_key` and `authorization` are the request's header values (empty when absent); the key
// is accepted as "x-api-key: KEY" or "Authorization: Bearer KEY". Both are always compared.
bool api_key_matches(std::string_view x_api_key, std::string_view authorization,
                     std::string_view key);

}  // namespace fs::server
