// The decode router's softmax and top-k as a device function (cuda_routing.cu's route_warp_kernel
// and cuda_moe_block.cu's routing + shared gate/up grid run this one body).
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ranking.cuh"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {

// The decode router's rows (E <= 32 * kPer experts, the released models' 256-512): a warp per
// token with its logits in registers (expert c at lane c % 32, slot c / 32), the softmax and each
// of the k picks as warp reductions, no shared memory and no block barrier. The block form
// (route_kernel, cuda_routing.cu) walked the row in global memory once per pick with two barriers
// each (12 us a token on the H200, bench/NOTES.md 2026-12-02); this one computes the same
// numbers: e = exp(x - max) in fp32, their sum in double, p = e / sum, the picks by ranks_above,
// the weights over their fp32 sum in pick order. (Only the double sum's order differs, which can
// move p by an ulp.) Warp w of block `block` takes token block * (blockDim.x / 32) + w; a token's
// result depends on nothing else (not the block size). The caller has waited for the logits.
// fast (session 20, FLASHSERVE_CUDA_OLD_ROUTE_PICKS=1 turns it off): a pick's warp reduction is
// warp_best_nonnegative's two redux.sync instead of warp_best's five rounds of paired shuffles,
// and (k <= 32) lane r keeps pick r in registers, so the weights' sum and division need no
// global round trip a pick: the same picks and the same fp32 sum in pick order, the same bits.
template <int kPer>
__device__ __forceinline__ void route_warp_rows(const float* logits, std::int64_t S, std::int64_t E,
                                                std::int64_t k, bool normalize, std::int32_t* idx,
                                                float* val, std::int64_t block, bool fast = true) {
  const std::int64_t s = block * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (s >= S) return;  // whole warps: the shuffles below see every lane of theirs
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float* row = logits + s * E;
  float p[kPer];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const std::int64_t c = lane + kWarp * j;
    p[j] = c < E ? row[c] : -INFINITY;
    m = fmaxf(m, p[j]);
  }
  m = warp_max(m);
  double sum = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (lane + kWarp * j >= E) continue;
    p[j] = expf(p[j] - m);
    sum += p[j];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int j = 0; j < kPer; ++j) p[j] = static_cast<float>(p[j] / sum);
  std::int32_t* ri = idx + s * k;
  float* rv = val + s * k;
  unsigned taken = 0;  // bit j: this lane's slot j was picked
  const bool in_lanes = fast && k <= kWarp;
  float pick_v = 0.0f, total = 0.0f;  // in_lanes: lane r's pick r (weight 0 where none was left)
  std::int32_t pick_i = -1;
  for (std::int64_t r = 0; r < k; ++r) {
    float bv = -INFINITY;
    std::int32_t bi = -1;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const auto c = static_cast<std::int32_t>(lane + kWarp * j);
      if (c < E && !((taken >> j) & 1u) && ranks_above(p[j], c, bv, bi)) {
        bv = p[j];
        bi = c;
      }
    }
    if (fast)
      warp_best_nonnegative(bv, bi);  // p >= 0
    else
      warp_best(bv, bi);
    if (bi >= 0 && bi % kWarp == lane) taken |= 1u << (bi / kWarp);
    if (in_lanes) {
      if (lane == r) {
        pick_i = bi;
        pick_v = bi >= 0 ? bv : 0.0f;
      }
    } else if (lane == 0) {
      ri[r] = bi;
      rv[r] = bi >= 0 ? bv : 0.0f;
      total += rv[r];
    }
  }
  if (in_lanes) {
    // The same sum in pick order as lane 0's below, then every pick written by its own lane.
    for (int r = 0; r < static_cast<int>(k); ++r) total += __shfl_sync(0xffffffffu, pick_v, r);
    if (lane < k) {
      ri[lane] = pick_i;
      rv[lane] = normalize ? pick_v / total : pick_v;
    }
    return;
  }
  if (normalize && lane == 0)
    for (std::int64_t r = 0; r < k; ++r) rv[r] /= total;
}

// The routing's part of a MoE block's first grid (cuda_moe_block.cu, cuda_moe_block_packed.cu):
// its first `blocks` blocks run route_warp_rows.
struct RouteArgs {
  const float* logits;  // [S, E]
  std::int64_t S, E, k;
  bool normalize;
  std::int32_t* idx;  // [S, k]
  float* val;         // [S, k]
  unsigned blocks;
  bool fast;  // route_warp_rows' picks
};

// route_warp_rows over a MoE block grid's routing arguments, as block `block` of them.
template <int kPer>
__device__ __forceinline__ void route_warp_rows(const RouteArgs& route, std::int64_t block) {
  route_warp_rows<kPer>(route.logits, route.S, route.E, route.k, route.normalize, route.idx,
                        route.val, block, route.fast);
}

// route_warp_rows' `fast` (redux.sync picks) unless FLASHSERVE_CUDA_OLD_ROUTE_PICKS is set.
inline bool route_fast_picks() {
  return !env_flag("FLASHSERVE_CUDA_OLD_ROUTE_PICKS");
}

// The register slots a lane takes (route_warp_rows' kPer: 8, 16 or 32) for a router of E
// experts, or 0 where the warp form does not run: more than 32 * 32 experts, or
// FLASHSERVE_CUDA_OLD_ROUTE (or _OLD_CONTEXT, cuda_switches.h) asked for the block form.
inline int route_warp_slots(std::int64_t E) {
  if (old_kernel_requested("FLASHSERVE_CUDA_OLD_ROUTE") || E > 32 * kWarp) return 0;
  return E <= 8 * kWarp ? 8 : (E <= 16 * kWarp ? 16 : 32);
}
// Calls f(std::integral_constant<int, slots>{}) for slots 8, 16 or 32.
template <typename F>
void with_route_slots(int slots, F&& f) {
  if (slots == 8)
    f(std::integral_constant<int, 8>{});
  else if (slots == 16)
    f(std::integral_constant<int, 16>{});
  else
    f(std::integral_constant<int, 32>{});
}

}  // namespace fs::cuda
