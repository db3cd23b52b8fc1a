// The order the top-k and argmax kernels rank entries by (cuda_routing.cu, cuda_sampling.cu): a
// larger value first, equal values by the lower index, as the CPU's selection and sampler do.
#pragma once

#include <cmath>
#include <cstdint>

namespace fs::cuda {

// A key whose unsigned order is the float order (the radix selects, cuda_select.cu and
// cuda_vocab_topk.cu): negative floats flipped, positive ones with the sign bit set. -0 becomes +0
// first, so the two rank as equals (the CPU compares floats). Every real entry's key is at least
// 1 except one NaN pattern's (NaN ranks are unspecified, as on the CPU).
__device__ __forceinline__ std::uint32_t rank_key(float v) {
  std::uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// Whether (v, i) ranks above (bv, bi); bi < 0 is "nothing yet".
__device__ __forceinline__ bool ranks_above(float v, std::int32_t i, float bv, std::int32_t bi) {
  return bi < 0 || v > bv || (v == bv && i < bi);
}

// (v, i) <- the best of the warp's lanes' pairs by ranks_above (i < 0: none), in every lane. The
// whole warp calls it.
__device__ __forceinline__ void warp_best(float& v, std::int32_t& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const std::int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (oi >= 0 && ranks_above(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// warp_best for values that are never negative, in two redux.sync instead of five rounds of
// paired shuffles: the largest value by its bits (which order non-negative floats as the floats),
// then the lowest index holding it. Each lane's (v, i) must be its own best by ranks_above (the
// lowest index of its largest value), as a lane's scan in index order leaves it. (NaN, which
// ranks_above never prefers, is ordered by its bits here.)
__device__ __forceinline__ void warp_best_nonnegative(float& v, std::int32_t& i) {
  const unsigned key = i >= 0 ? __float_as_uint(v) + 1u : 0u;  // 0: nothing in this lane
  const unsigned best = __reduce_max_sync(0xffffffffu, key);
  const unsigned win = __reduce_min_sync(
      0xffffffffu, key == best && best != 0u ? static_cast<unsigned>(i) : 0xffffffffu);
  i = best != 0u ? static_cast<std::int32_t>(win) : -1;
  v = best != 0u ? __uint_as_float(best - 1u) : -INFINITY;
}

}  // namespace fs::cuda
