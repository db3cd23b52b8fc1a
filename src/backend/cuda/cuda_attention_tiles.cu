// The tiled split-K kernel of block_sparse_attention (session 13). The split kernel before it (a
// warp per query head walking each 16-key tile one key at a time, a warp sum per key, the tile's
// loads issued only once the previous tile was done) ran at ~24 us a layer whatever the context,
// ~0.17 TB/s (bench/NOTES.md): bound by serial global-load latency and per-key reductions, not
// by bytes. Here block (query s, chunk j, KV head g) walks its keys in tiles of 32:
// - the tile's K and V rows arrive by cp.async, all of them in flight at once, and with two
//   stages the next tile's rows load while the current one is computed;
// - each lane scores its own key against the warp's query heads (read from shared memory as
//   broadcasts), so a tile needs one warp max per head for the online softmax, not a warp sum
//   per key;
// - then P.V with the lane holding output dims 4 * (lane + 32 m) .. + 3, the tile's weights
//   passed by shuffles;
// - a warp takes two query heads when `rep` is even: every K and V word read from shared memory
//   serves both (shared-memory reads, not FLOPs, are what a tile costs).
// The visit order and the partials' meaning are the earlier kernel's: a query's picked blocks'
// keys in pick order (-1 picks skipped), then its unfinished tail, as a flat list cut into chunks;
// a split's (max, sum, unnormalised output) go to the same deterministic merge.
#include "backend/cuda/cuda_attention_tiles.h"

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

constexpr int kMaxThreads = 1024;  // rep <= 32 query heads per KV head
constexpr std::int64_t kMaxD = 256;
constexpr std::int64_t kMaxRep = 32;
constexpr std::int64_t kMaxSplits = 128;  // the merge kernel's shared arrays
// The split counts aim at the device's multiprocessors (multiprocessors(): 132 on an H200, where
// they were tuned). A one-tile block with one stage takes ~78 KB of shared memory at the
// released shapes, so two fit an SM; a two-stage block ~141 KB, one.
// Keys of one tile a block per chunk, while that is at most two waves of two blocks an SM (1-4
// query rows at the released shapes: 130-520 blocks); beyond it, fewer longer chunks pipelined.
std::int64_t max_one_tile_blocks() {
  return 4 * multiprocessors();
}

// Row stride of the K tile in floats: a multiple of 32 plus 4, so the 32 lanes' float4 reads of
// 32 different rows at one column fall on distinct banks (8 lanes a phase, 4 banks apart).
__host__ __device__ constexpr std::int64_t k_tile_stride(std::int64_t D) {
  return (D + 31) / 32 * 32 + 4;
}

__host__ __device__ constexpr std::int64_t stage_floats(std::int64_t D) {
  return kTiledKeys * (k_tile_stride(D) + D);
}

std::int64_t smem_floats(std::int64_t rep, std::int64_t D, int stages) {
  return rep * D + stages * stage_floats(D);
}

// kPer4: float4 columns a lane holds (ceil(D / 128)); kHeads: query heads a warp takes (at most
// 32 / kHeads warps, so two heads a warp get 128 registers a thread, no spills).
template <int kPer4, int kHeads>
__global__ void __launch_bounds__(kMaxThreads / kHeads) attention_tiles_kernel(TiledAttention a) {
  wait_for_inputs();  // when launched overlapped (cuda_common.h)
  release_dependents();
  extern __shared__ float4 smem4[];
  __shared__ std::int64_t slot_key[2][kTiledKeys];
  const std::int64_t D = a.D, rep = a.rep, ks = k_tile_stride(D), d4 = D / 4;
  float* qs = reinterpret_cast<float*>(smem4);  // [rep][D]: this KV head's query rows
  float* stages = qs + rep * D;                 // per stage: K [32][ks], then V [32][D]
  const std::int64_t s = blockIdx.x / a.splits, j = blockIdx.x % a.splits, g = blockIdx.y;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp;
  const int threads = static_cast<int>(blockDim.x);

  // This KV head's query rows join the first tile's copies (one round trip for both; a loop of
  // plain loads and stores would wait on each load in turn).
  const float* qg = a.q + s * a.Hq * D + g * rep * D;
  for (std::int64_t i = tid; i < rep * D / 4; i += threads)
    cp_async16(qs + 4 * i, qg + 4 * i, true);

  const std::int64_t pos = a.first.get() + s, tail0 = (pos + 1) / a.block * a.block;
  const std::int64_t n_pick = a.top * a.block, n_all = n_pick + (pos + 1 - tail0);
  const std::int64_t f_begin = j * a.chunk;
  const std::int64_t f_end = f_begin + a.chunk < n_all ? f_begin + a.chunk : n_all;
  const std::int64_t tiles = f_end > f_begin ? (f_end - f_begin + kTiledKeys - 1) / kTiledKeys : 0;

  // The keys of the tile at flat index t0 into slot_key[b] (-1: past the chunk or a -1 pick).
  auto keys_of = [&](std::int64_t t0, int b) {
    if (tid < kTiledKeys) {
      const std::int64_t f = t0 + tid;
      std::int64_t key = -1;
      if (f < f_end) {
        if (f < n_pick) {
          const std::int64_t blk = a.picked[s * a.top + f / a.block];
          if (blk >= 0) key = blk * a.block + f % a.block;
        } else {
          key = tail0 + (f - n_pick);
        }
      }
      slot_key[b][tid] = key;
    }
  };
  // The tile's K and V rows into stage `b`; empty slots are zero-filled (weight 0, never NaN).
  auto fetch = [&](int b) {
    float* kt = stages + b * stage_floats(D);
    float* vt = kt + kTiledKeys * ks;
    for (std::int64_t i = tid; i < kTiledKeys * d4; i += threads) {
      const std::int64_t slot = i / d4, c = (i % d4) * 4, key = slot_key[b][slot];
      const std::int64_t at = key >= 0 ? key * a.kv_stride + g * D + c : 0;
      cp_async16(kt + slot * ks + c, a.k + at, key >= 0);
      cp_async16(vt + slot * D + c, a.v + at, key >= 0);
    }
    cp_async_commit();
  };

  float acc[kHeads][kPer4][4];
  float mx[kHeads], l[kHeads];  // l: this lane's share of the sum (the warp's sum at the end)
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    mx[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int m = 0; m < kPer4; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[hh][m][e] = 0.0f;
  }
  const float* qw = qs + static_cast<std::int64_t>(warp) * kHeads * D;

  if (tiles > 0) {
    keys_of(f_begin, 0);
    __syncthreads();
    fetch(0);  // commits the query rows' copies with the tile's
  } else {
    cp_async_commit();  // a chunk past this query's keys: nothing to read, no copy left pending
    cp_async_wait<0>();
  }
  for (std::int64_t t = 0; t < tiles; ++t) {
    const int b = a.stages == 2 ? static_cast<int>(t & 1) : 0;
    const std::int64_t t0 = f_begin + t * kTiledKeys;
    const bool ahead = a.stages == 2 && t + 1 < tiles;
    // One stage: this tile's loads start only now (tiled_attention_split gives one stage only
    // to one-tile chunks, so this serves other callers' choices).
    if (a.stages == 1 && t > 0) {
      keys_of(t0, 0);
      __syncthreads();
      fetch(0);
    }
    if (ahead) keys_of(t0 + kTiledKeys, b ^ 1);
    __syncthreads();  // the keys of the tile ahead are visible
    if (ahead) {
      fetch(b ^ 1);
      cp_async_wait<1>();  // this tile's rows have landed, the next tile's may be in flight
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of this tile are visible

    const float* kt = stages + b * stage_floats(D);
    const float* vt = kt + kTiledKeys * ks;
    const int n = static_cast<int>(f_end - t0 < kTiledKeys ? f_end - t0 : kTiledKeys);
    const bool valid = lane < n && slot_key[b][lane] >= 0;
    // This lane's key against each of the warp's heads: four partial sums a head (the column
    // order of the earlier kernel is not kept; the sum is fp32 as before).
    float part[kHeads][4] = {};
    const float* kr = kt + lane * ks;
    for (std::int64_t c = 0; c < D; c += 4) {
      const float4 kk = *reinterpret_cast<const float4*>(kr + c);
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) {
        const float4 qq = *reinterpret_cast<const float4*>(qw + hh * D + c);
        part[hh][0] = fmaf(qq.x, kk.x, part[hh][0]);
        part[hh][1] = fmaf(qq.y, kk.y, part[hh][1]);
        part[hh][2] = fmaf(qq.z, kk.z, part[hh][2]);
        part[hh][3] = fmaf(qq.w, kk.w, part[hh][3]);
      }
    }
    float p[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) {
      const float sc =
          valid ? ((part[hh][0] + part[hh][1]) + (part[hh][2] + part[hh][3])) * a.scale : -INFINITY;
      const float m_new = fmaxf(mx[hh], warp_max(sc));
      p[hh] = 0.0f;
      if (m_new == -INFINITY) continue;         // no key yet for this warp (uniform across it)
      const float corr = expf(mx[hh] - m_new);  // 0 on the first keys (mx = -inf)
      p[hh] = valid ? expf(sc - m_new) : 0.0f;
      l[hh] = l[hh] * corr + p[hh];
#pragma unroll
      for (int m = 0; m < kPer4; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[hh][m][e] *= corr;
      mx[hh] = m_new;
    }
    for (int i = 0; i < n; ++i) {
      float pi[kHeads];
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) pi[hh] = __shfl_sync(0xffffffffu, p[hh], i);
      const float* vr = vt + i * D;
#pragma unroll
      for (int m = 0; m < kPer4; ++m) {
        const std::int64_t c = (lane + kWarp * m) * 4;
        if (c >= D) continue;
        const float4 vv = *reinterpret_cast<const float4*>(vr + c);
#pragma unroll
        for (int hh = 0; hh < kHeads; ++hh) {
          acc[hh][m][0] = fmaf(pi[hh], vv.x, acc[hh][m][0]);
          acc[hh][m][1] = fmaf(pi[hh], vv.y, acc[hh][m][1]);
          acc[hh][m][2] = fmaf(pi[hh], vv.z, acc[hh][m][2]);
          acc[hh][m][3] = fmaf(pi[hh], vv.w, acc[hh][m][3]);
        }
      }
    }
    __syncthreads();  // the stage and its keys are refilled by a later tile
  }

#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    const float L = warp_sum(l[hh]);
    const std::int64_t h = g * rep + warp * kHeads + hh;
    if (a.splits == 1) {
      float* os = a.out + s * a.Hq * D + h * D;
#pragma unroll
      for (int m = 0; m < kPer4; ++m) {
        const std::int64_t c = (lane + kWarp * m) * 4;
        if (c >= D) continue;
        float4 o;
        o.x = L > 0 ? acc[hh][m][0] / L : 0.0f;
        o.y = L > 0 ? acc[hh][m][1] / L : 0.0f;
        o.z = L > 0 ? acc[hh][m][2] / L : 0.0f;
        o.w = L > 0 ? acc[hh][m][3] / L : 0.0f;
        if (a.gate != nullptr) {  // MulActivatedOp's product, after the division
          const float4 gv = *reinterpret_cast<const float4*>(a.gate + (os - a.out) + c);
          o.x = __fmul_rn(o.x, apply_act(gv.x, a.gate_act));
          o.y = __fmul_rn(o.y, apply_act(gv.y, a.gate_act));
          o.z = __fmul_rn(o.z, apply_act(gv.z, a.gate_act));
          o.w = __fmul_rn(o.w, apply_act(gv.w, a.gate_act));
        }
        *reinterpret_cast<float4*>(os + c) = o;
      }
      continue;
    }
    const std::int64_t at = (s * a.Hq + h) * a.splits + j;
#pragma unroll
    for (int m = 0; m < kPer4; ++m) {
      const std::int64_t c = (lane + kWarp * m) * 4;
      if (c >= D) continue;
      *reinterpret_cast<float4*>(a.part_acc + at * D + c) =
          make_float4(acc[hh][m][0], acc[hh][m][1], acc[hh][m][2], acc[hh][m][3]);
    }
    if (lane == 0) {
      a.part_ml[at * 2] = mx[hh];
      a.part_ml[at * 2 + 1] = L;
    }
  }
}

// The four instances and their launch: (kPer4, kHeads) from (D, rep).
template <int kPer4, int kHeads>
cudaError_t launch_instance(const TiledAttention& a, std::int64_t S, std::int64_t kv_heads,
                            cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(S * a.splits), static_cast<unsigned>(kv_heads));
  const auto threads = static_cast<unsigned>(a.rep / kHeads * kWarp);
  const auto smem = static_cast<std::size_t>(smem_floats(a.rep, a.D, a.stages)) * sizeof(float);
  return launch_overlapped(attention_tiles_kernel<kPer4, kHeads>, grid, threads, smem, stream, a);
}

template <int kPer4, int kHeads>
bool allow_smem() {
  const auto bytes = smem_floats(kMaxRep, kMaxD, 2) * static_cast<std::int64_t>(sizeof(float));
  return raise_dynamic_shared(attention_tiles_kernel<kPer4, kHeads>,
                              static_cast<std::size_t>(bytes));
}

}  // namespace

bool tiled_attention_takes(std::int64_t rep, std::int64_t D) {
  return rep >= 1 && rep <= kMaxRep && D > 0 && D % 4 == 0 && D <= kMaxD;
}

TiledSplit tiled_attention_split(std::int64_t most, std::int64_t groups) {
  TiledSplit t;
  const std::int64_t tiles = std::max<std::int64_t>((most + kTiledKeys - 1) / kTiledKeys, 1);
  if (tiles <= kMaxSplits && groups * tiles <= max_one_tile_blocks()) {
    t.splits = tiles;  // a tile a block; blocks on one SM overlap each other's loads
    return t;
  }
  // Longer chunks, about one block an SM (or one split when the queries alone fill the device).
  const std::int64_t want = std::clamp<std::int64_t>(
      multiprocessors() / std::max<std::int64_t>(groups, 1), 1, kMaxSplits);
  const std::int64_t per = (most + want - 1) / want;
  t.chunk = std::max<std::int64_t>((per + kTiledKeys - 1) / kTiledKeys * kTiledKeys, kTiledKeys);
  t.splits = std::max<std::int64_t>((most + t.chunk - 1) / t.chunk, 1);  // none wholly past the end
  t.stages = t.chunk > kTiledKeys ? 2 : 1;
  // A prefill's queries fill the device many times over: one stage (78 KB, two blocks an SM)
  // instead of two (141 KB, one), FLASHSERVE_CUDA_ATTENTION_PREFILL_STAGES=2 the form before.
  if (groups >= 2 * multiprocessors()) {
    const char* v = std::getenv("FLASHSERVE_CUDA_ATTENTION_PREFILL_STAGES");
    if (!(v && std::atoi(v) == 2)) t.stages = 1;
  }
  return t;
}

bool reserve_tiled_attention() {
  static OncePerDevice reserved;
  // A refusal is answered by another kernel (the caller's fallback), not an error.
  return reserved.run([] {
    return allow_smem<1, 1>() && allow_smem<1, 2>() && allow_smem<2, 1>() && allow_smem<2, 2>();
  });
}

cudaError_t launch_tiled_attention(const TiledAttention& a, std::int64_t S, std::int64_t kv_heads,
                                   cudaStream_t stream) {
  const bool two_heads = a.rep % 2 == 0;
  if (a.D <= 128) {
    return two_heads ? launch_instance<1, 2>(a, S, kv_heads, stream)
                     : launch_instance<1, 1>(a, S, kv_heads, stream);
  }
  return two_heads ? launch_instance<2, 2>(a, S, kv_heads, stream)
                   : launch_instance<2, 1>(a, S, kv_heads, stream);
}

}  // namespace fs::cuda
