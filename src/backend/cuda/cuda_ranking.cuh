// The order the top-k and argmax kernels rank entries by (cuda_routing.cu, cuda_sampling.cu): a
// larger value first, equal values by the lower index, as the CPU's selection and sampler do.
#pragma once

#include <cstdint>

namespace fs::cuda {

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

}  // namespace fs::cuda
