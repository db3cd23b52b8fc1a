#include "decode/philox.h"

namespace fs {
namespace {

// Round multipliers and Weyl key increments from the paper (Random123's philox.h constants).
constexpr std::uint32_t kM0 = 0xD2511F53u;
constexpr std::uint32_t kM1 = 0xCD9E8D57u;
constexpr std::uint32_t kW0 = 0x9E3779B9u;
constexpr std::uint32_t kW1 = 0xBB67AE85u;

PhiloxBlock round(const PhiloxBlock& c, const PhiloxKey& k) {
  const std::uint64_t p0 = static_cast<std::uint64_t>(kM0) * c[0];
  const std::uint64_t p1 = static_cast<std::uint64_t>(kM1) * c[2];
  const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
  const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
  return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock counter, PhiloxKey key) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      key[0] += kW0;
      key[1] += kW1;
    }
    counter = round(counter, key);
  }
  return counter;
}

double Rng::uniform() {
  const PhiloxBlock ctr = {static_cast<std::uint32_t>(draws_),
                           static_cast<std::uint32_t>(draws_ >> 32), stream_, 0};
  const PhiloxKey key = {static_cast<std::uint32_t>(seed_),
                         static_cast<std::uint32_t>(seed_ >> 32)};
  ++draws_;
  const PhiloxBlock out = philox4x32_10(ctr, key);
  const std::uint64_t bits = (static_cast<std::uint64_t>(out[0]) << 32 | out[1]) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}

}  // namespace fs
