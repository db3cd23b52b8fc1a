// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. A draw is a pure function of (key, counter), so a request's seed
// reproduces its samples on any backend and any thread, in any order of computation.
#pragma once

#include <array>
#include <cstdint>

namespace fs {

using PhiloxBlock = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

// One block: ten rounds of the Philox bijection of `counter` under `key`.
PhiloxBlock philox4x32_10(PhiloxBlock counter, PhiloxKey key);

// The request's stream of uniforms. Draw i uses counter (i_lo, i_hi, stream, 0) and key
// (seed_lo, seed_hi), and turns the block's first two words into one double in [0, 1) with 53
// random bits. Each call to uniform() is one draw; the decoder documents which events draw.
class Rng {
 public:
  explicit Rng(std::uint64_t seed, std::uint32_t stream = 0) : seed_(seed), stream_(stream) {}

  double uniform();
  std::uint64_t draws() const { return draws_; }

 private:
  std::uint64_t seed_;
  std::uint32_t stream_;
  std::uint64_t draws_ = 0;
};

}  // namespace fs
