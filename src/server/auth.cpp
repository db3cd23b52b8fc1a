#include "server/auth.h"

#include <cstddef>

namespace fs::server {

bool constant_time_equal(std::string_view given, std::string_view expected) {
  // Every byte of `expected` is visited; a shorter `given` is read cyclically (never past its
  // end) and its length difference is folded into the result, so neither the position of the
  // first difference nor the candidate's length changes the work done.
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  const std::size_t n = given.size();
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const unsigned char g = n ? static_cast<unsigned char>(given[i % n]) : 0;
    diff = static_cast<unsigned char>(diff | (g ^ static_cast<unsigned char>(expected[i])));
  }
  return diff == 0;
}

bool api_key_matches(std::string_view x_api_key, std::string_view authorization,
                     std::string_view key) {
  constexpr std::string_view kBearer = "Bearer ";
  const bool bearer = authorization.substr(0, kBearer.size()) == kBearer;
  const std::string_view token = bearer ? authorization.substr(kBearer.size()) : std::string_view();
  const bool a = constant_time_equal(x_api_key, key);
  const bool b = constant_time_equal(token, key);
  return (a && !x_api_key.empty()) || (b && bearer);
}

}  // namespace fs::server
