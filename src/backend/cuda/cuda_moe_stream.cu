// The routed experts of 1-4 tokens as one persistent kernel whose weights stream through shared
// memory (issue 14; docs/GPU.md "Step 8").
//
// Why. The two kernels before it (cuda_moe.cu: gate/up, then down) each loaded one round of
// weights into registers, waited a DRAM latency, reduced, and only then asked for more; their
// 800-block grids ran in 2-3 waves, the last nearly empty, and the down kernel could not start
// fetching until every gate/up block had finished. Together 27.8 us a layer for 49 MB of FP8
// experts (1.8 TB/s, bench --marginal, session 12).
//
// How. One block per multiprocessor slot (a grid the device holds at once), 8 warps. Each warp
// takes a contiguous share of the gate/up items (slot u, row r: the gate and up rows) and then a
// share of the down items (slot u, kRows consecutive down rows), and streams them through a ring
// of kStages item-sized stages in shared memory with cp.async: the bytes of the next kStages - 1
// items are in flight while the warp computes the current one, so a warp never waits a whole
// round trip between items and registers no longer bound the bytes in flight. A down item needs
// its slot's whole act row: the gate/up warps publish their finished rows on a per-slot counter
// (release), and a down warp's first item of a slot waits on it (acquire), its weights already
// on the way. Every block is resident (the grid is the occupancy), and a warp publishes all of
// its gate/up rows before its first down item, so the waits always end.
//
// The sums are the two kernels' bit for bit: a lane takes the same chunks in the same order
// (lane, lane + 32, ... of a gate/up row; lane, lane + kLanes, ... of a down row), sums a chunk as
// rows_dot does (cuda_gemv.cuh), and the group sums are the same shuffles
// (CudaMoeStream.EqualsTheTwoKernelsBitForBit).
//
// Measured slower than the two kernels (bench/NOTES.md session 13), so it is opt-in:
// FLASHSERVE_CUDA_MOE_STREAM=1.

// nvcc's front end reports discarded [[nodiscard]] class values in the headers (cuda_backend.h).
#pragma nv_diag_suppress 2810

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_moe_common.cuh"
#include "backend/cuda/cuda_moe_stream.h"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

// Warps a block: 8, or 16 with FLASHSERVE_CUDA_MOE_STREAM_WARPS=16 (twice the warps computing
// the items of a multiprocessor, half the stages each).
constexpr int kDefaultWarps = 8;
constexpr int kMaxStages = 4;

// Lanes per down row, sized to its chunks as the down kernel's groups are (640 wide: 40 FP8
// chunks over 8 lanes, 80 bf16 chunks over 16; 5 each).
template <typename T>
inline constexpr int kRowLanes = std::is_same_v<T, e4m3_bits> ? 8 : 16;

// What the host computes once per launch.
struct Layout {
  std::int64_t E, H, I;
  int pairs, per_token, tokens;
  std::int64_t gate_items;     // pairs * I
  std::int64_t down_per_slot;  // ceil(H / kRows)
  std::int64_t down_items;     // pairs * down_per_slot
  int gc_h, gc_i;              // scale-grid widths of gate_up and down (FP8)
  std::int64_t gr_gu, gr_dn;   // scale-grid heights of one expert's gate_up and down
  int stage_bytes;             // one item, 16-byte multiple
  int x_words, act_words;      // float4s of a staged token row, of a warp's staged act row
};

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, cached in L2 only (each weight is read once).
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_address(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void copy4_async(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared_address(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Returns once at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}
// counter += n, ordered after this thread's earlier writes (the act rows it stored).
__device__ __forceinline__ void publish(int* counter, int n) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(counter), "r"(n) : "memory");
}
__device__ __forceinline__ int observe(const int* counter) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  return v;
}

// The dot product of one 16-byte chunk with 4-float words of x (xw(i) gives word i), added into
// acc as rows_dot adds it: block-scaled FP8 sums the chunk from zero and multiplies by its scale
// once, the others add each weight's product in order.
template <typename T, typename X>
__device__ __forceinline__ float chunk_dot(const uint4& raw, float scale, X&& xw, float acc) {
  using C = WeightChunk<T, true>;
  if constexpr (C::kDeferredScale) {
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < C::kN / 4; ++i) {
      float w[4];
      C::widen_word(raw, i, w);
      const float4 xv = xw(i);
      d = fmaf(w[0], xv.x, d);
      d = fmaf(w[1], xv.y, d);
      d = fmaf(w[2], xv.z, d);
      d = fmaf(w[3], xv.w, d);
    }
    return fmaf(d, scale, acc);
  } else {
    float w[C::kN];
    C::widen(raw, w);
#pragma unroll
    for (int i = 0; i < C::kN / 4; ++i) {
      const float4 xv = xw(i);
      acc = fmaf(w[4 * i], xv.x, acc);
      acc = fmaf(w[4 * i + 1], xv.y, acc);
      acc = fmaf(w[4 * i + 2], xv.z, acc);
      acc = fmaf(w[4 * i + 3], xv.w, acc);
    }
    return acc;
  }
}

template <typename T, int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps* kWarp, 1)
    moe_stream_kernel(const float* x, const T* gate_up, const float* gu_scales, const T* down,
                      const float* dn_scales, const std::int32_t* ids, float limit, float* act,
                      float* part, int* sync, const Layout L) {
  using C = WeightChunk<T, true>;
  constexpr int kN = C::kN, kWords = kN / 4;
  constexpr int kLanes = kRowLanes<T>, kRows = kWarp / kLanes;
  using XLayout = StagedX<kN, kWarp>;     // x as a gate/up lane reads it
  using ActLayout = StagedX<kN, kLanes>;  // act as a down lane reads it
  constexpr auto kElem = static_cast<std::int64_t>(sizeof(T));
  extern __shared__ float4 stream_smem[];
  __shared__ std::int64_t slot_expert[kMoeStreamSlots];  // -1: the slot has no expert

  wait_for_inputs();  // the ids and x are the kernels' before
  release_dependents();
  const int lane = static_cast<int>(threadIdx.x % kWarp),
            warp = static_cast<int>(threadIdx.x / kWarp);
  const std::int64_t H = L.H, I = L.I, gchunks = H / kN, dchunks = I / kN;
  float4* xs = stream_smem;
  float4* my_act = xs + L.tokens * L.x_words + warp * L.act_words;
  char* stages = reinterpret_cast<char*>(xs + L.tokens * L.x_words + kWarps * L.act_words) +
                 static_cast<std::int64_t>(warp) * kStages * L.stage_bytes;

  for (int u = static_cast<int>(threadIdx.x); u < L.pairs; u += kWarps * kWarp) {
    const std::int64_t e = ids[u];
    slot_expert[u] = e >= 0 && e < L.E ? e : -1;
  }
  for (int s = 0; s < L.tokens; ++s) {
    const auto* src = reinterpret_cast<const float4*>(x + s * H);
    for (std::int64_t j = threadIdx.x; j < gchunks * kWords; j += kWarps * kWarp)
      xs[s * L.x_words + XLayout::at(j / kWords, static_cast<int>(j % kWords))] = src[j];
  }
  __syncthreads();

  // This warp's items: gate/up items [a0, a0 + na), then down items [b0, b0 + n - na).
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * kWarps,
                     gw = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  const std::int64_t a0 = L.gate_items * gw / warps, na = L.gate_items * (gw + 1) / warps - a0;
  const std::int64_t b0 = L.down_items * gw / warps, n = na + L.down_items * (gw + 1) / warps - b0;
  const auto stage = [&](std::int64_t t) { return stages + (t % kStages) * L.stage_bytes; };

  // Queues item t's copies (rows, then their scales) and commits them as one group; past the end
  // an empty group, so that wait_copies<kStages - 1> always means "item t has landed".
  const auto issue = [&](std::int64_t t) {
    if (t < n) {
      char* st = stage(t);
      if (t < na) {
        const std::int64_t a = a0 + t, u = a / I, r = a % I, e = slot_expert[u];
        if (e >= 0) {
          const T* g = gate_up + (e * 2 * I + r) * H;
          const T* up = g + I * H;
          for (std::int64_t j = lane; j < gchunks; j += kWarp) {
            copy16_async(st + j * 16, g + j * kN);
            copy16_async(st + H * kElem + j * 16, up + j * kN);
          }
          if constexpr (C::kScaled) {
            auto* sc = reinterpret_cast<float*>(st + 2 * H * kElem);
            const float* gs = gu_scales + (e * L.gr_gu + r / kFp8Block) * L.gc_h;
            const float* us = gu_scales + (e * L.gr_gu + (I + r) / kFp8Block) * L.gc_h;
            for (int j = lane; j < L.gc_h; j += kWarp) {
              copy4_async(sc + j, gs + j);
              copy4_async(sc + L.gc_h + j, us + j);
            }
          }
        }
      } else {
        const std::int64_t b = b0 + (t - na), u = b / L.down_per_slot,
                           c0 = b % L.down_per_slot * kRows, e = slot_expert[u];
        if (e >= 0) {
          // kRows consecutive rows are one contiguous run (and one 128-row block of scales).
          const T* d = down + (e * H + c0) * I;
          const std::int64_t chunks = (H - c0 < kRows ? H - c0 : kRows) * dchunks;
          for (std::int64_t j = lane; j < chunks; j += kWarp) copy16_async(st + j * 16, d + j * kN);
          if constexpr (C::kScaled) {
            auto* sc = reinterpret_cast<float*>(st + kRows * I * kElem);
            const float* ds = dn_scales + (e * L.gr_dn + c0 / kFp8Block) * L.gc_i;
            for (int j = lane; j < L.gc_i; j += kWarp) copy4_async(sc + j, ds + j);
          }
        }
      }
    }
    commit_copies();
  };

  for (int t = 0; t < kStages - 1; ++t) issue(t);
  std::int64_t pending_slot = -1, act_slot = -1;
  int pending_rows = 0;  // gate/up rows of pending_slot done and not yet published
  for (std::int64_t t = 0; t < n; ++t) {
    issue(t + kStages - 1);
    wait_copies<kStages - 1>();
    __syncwarp();
    const char* st = stage(t);
    if (t < na) {
      const std::int64_t a = a0 + t, u = a / I, r = a % I;
      if (slot_expert[u] >= 0) {
        const float4* xt = xs + (u / L.per_token) * L.x_words;
        [[maybe_unused]] const auto* sc = reinterpret_cast<const float*>(st + 2 * H * kElem);
        float ag = 0.0f, au = 0.0f;
#pragma unroll 5
        for (std::int64_t c = lane; c < gchunks; c += kWarp) {
          const auto xw = [&](int i) { return xt[XLayout::at(c, i)]; };
          float sg = 0.0f, su = 0.0f;
          if constexpr (C::kDeferredScale) {
            sg = sc[c * kN / kFp8Block] * C::kScaleFactor;
            su = sc[L.gc_h + c * kN / kFp8Block] * C::kScaleFactor;
          }
          ag = chunk_dot<T>(*reinterpret_cast<const uint4*>(st + c * 16), sg, xw, ag);
          au = chunk_dot<T>(*reinterpret_cast<const uint4*>(st + H * kElem + c * 16), su, xw, au);
        }
        const float g = group_sum<kWarp>(ag), up = group_sum<kWarp>(au);
        if (lane == 0) act[u * I + r] = clamped_swiglu(g, up, limit);
        if (u != pending_slot) {
          if (lane == 0 && pending_rows > 0) publish(sync + pending_slot, pending_rows);
          pending_slot = u;
          pending_rows = 0;
        }
        ++pending_rows;
      }
      // Every row published before this warp's first down item, which may wait on them.
      if (t == na - 1 && lane == 0 && pending_rows > 0) publish(sync + pending_slot, pending_rows);
    } else {
      const std::int64_t b = b0 + (t - na), u = b / L.down_per_slot,
                         c0 = b % L.down_per_slot * kRows;
      if (slot_expert[u] >= 0) {
        if (u != act_slot) {  // the slot's act row, once all its gate/up rows are published
          while (observe(sync + u) < I) __nanosleep(64);
          const auto* src = reinterpret_cast<const float4*>(act + u * I);
          for (std::int64_t j = lane; j < dchunks * kWords; j += kWarp)
            my_act[ActLayout::at(j / kWords, static_cast<int>(j % kWords))] = __ldcg(src + j);
          __syncwarp();
          act_slot = u;
        }
        const int row = lane / kLanes, l = lane % kLanes;
        const char* w = st + row * I * kElem;
        [[maybe_unused]] const auto* sc = reinterpret_cast<const float*>(st + kRows * I * kElem);
        float acc = 0.0f;
#pragma unroll 5
        for (std::int64_t c = l; c < dchunks; c += kLanes) {
          const auto xw = [&](int i) { return my_act[ActLayout::at(c, i)]; };
          float s = 0.0f;
          if constexpr (C::kDeferredScale) s = sc[c * kN / kFp8Block] * C::kScaleFactor;
          acc = chunk_dot<T>(*reinterpret_cast<const uint4*>(w + c * 16), s, xw, acc);
        }
        const float v = group_sum<kLanes>(acc);
        if (l == 0 && c0 + row < H) part[u * H + c0 + row] = v;
      }
    }
    __syncwarp();  // the stage is refilled by the next iteration's issue, my_act by a new slot
  }
  wait_copies<0>();

  // The last block out resets the counters for the next launch (no block reads them any more).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(sync + kMoeStreamSlots, 1) == static_cast<int>(gridDim.x) - 1) {
      for (int u = 0; u < L.pairs; ++u) sync[u] = 0;
      sync[kMoeStreamSlots] = 0;
    }
  }
}

// Off unless FLASHSERVE_CUDA_MOE_STREAM=1: measured slower than the two kernels on the H200
// (bench/NOTES.md session 13: 34.7 against 28.9 us a token, FP8 48 layers 144.3 against 157.6
// tok/s), kept as an opt-in for the measurements that follow it.
bool stream_enabled() {
  const char* v = std::getenv("FLASHSERVE_CUDA_MOE_STREAM");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

int stream_warps() {
  const char* v = std::getenv("FLASHSERVE_CUDA_MOE_STREAM_WARPS");
  return v != nullptr && std::strcmp(v, "16") == 0 ? 16 : kDefaultWarps;
}

std::atomic<std::uint64_t> launches{0};

template <typename T, int kWarps, int kStages>
bool launch_stages(const MoeStreamArgs& a, const Layout& L, std::size_t smem, cudaStream_t stream) {
  const auto kernel = moe_stream_kernel<T, kWarps, kStages>;
  // Opt in to the device's shared memory once per kernel (what its static table leaves); the
  // grid is as many blocks as the device holds at once, so every block is resident (the down
  // items wait on other blocks).
  static const cudaError_t opted = [&] {
    cudaFuncAttributes attributes{};
    const cudaError_t e = cudaFuncGetAttributes(&attributes, kernel);
    if (e != cudaSuccess) return e;
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                a.smem_optin - static_cast<int>(attributes.sharedSizeBytes));
  }();
  int per_sm = 0;
  if (opted != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kWarps * kWarp, smem) !=
          cudaSuccess ||
      per_sm < 1) {
    cudaGetLastError();
    return false;
  }
  const auto grid = static_cast<unsigned>(a.multiprocessors * per_sm);
  launches.fetch_add(1, std::memory_order_relaxed);
  launch_overlapped(kernel, grid, kWarps * kWarp, smem, stream, a.x,
                    static_cast<const T*>(a.gate_up), a.gate_up_scales,
                    static_cast<const T*>(a.down), a.down_scales, a.ids, a.limit, a.act, a.part,
                    a.sync, L);
  return true;
}

template <typename T>
bool launch_typed(const MoeStreamArgs& a, cudaStream_t stream) {
  using C = WeightChunk<T, true>;
  constexpr int kN = C::kN, kLanes = kRowLanes<T>, kRows = kWarp / kLanes;
  constexpr auto kElem = static_cast<std::int64_t>(sizeof(T));
  Layout L{};
  L.E = a.E;
  L.H = a.H;
  L.I = a.I;
  L.pairs = a.pairs;
  L.per_token = a.per_token;
  L.tokens = a.tokens;
  L.gate_items = a.pairs * a.I;
  L.down_per_slot = (a.H + kRows - 1) / kRows;
  L.down_items = a.pairs * L.down_per_slot;
  const auto blocks = [](std::int64_t n) { return (n + kFp8Block - 1) / kFp8Block; };
  L.gc_h = C::kScaled ? static_cast<int>(blocks(a.H)) : 0;
  L.gc_i = C::kScaled ? static_cast<int>(blocks(a.I)) : 0;
  L.gr_gu = blocks(2 * a.I);
  L.gr_dn = blocks(a.H);
  const std::int64_t gate = 2 * a.H * kElem + 2 * L.gc_h * 4,
                     down = kRows * a.I * kElem + L.gc_i * 4;
  L.stage_bytes = static_cast<int>((std::max(gate, down) + 15) / 16 * 16);
  L.x_words = static_cast<int>(StagedX<kN, kWarp>::token_words(a.H / kN));
  L.act_words = static_cast<int>(StagedX<kN, kLanes>::token_words(a.I / kN));
  // The stages that fit beside the staged x and act rows and the static slot table (a margin
  // for the rest): 2-4, with the warps asked for when they fit, else 8.
  const auto plan = [&](int warps, std::size_t& smem) -> int {
    const auto fixed = static_cast<std::int64_t>(L.tokens * L.x_words + warps * L.act_words) *
                       static_cast<std::int64_t>(sizeof(float4));
    const std::int64_t budget = a.smem_optin - fixed -
                                static_cast<std::int64_t>(kMoeStreamSlots * sizeof(std::int64_t)) -
                                1024;
    const std::int64_t per_stage = static_cast<std::int64_t>(warps) * L.stage_bytes;
    const std::int64_t stages = std::min<std::int64_t>(kMaxStages, budget / per_stage);
    smem = static_cast<std::size_t>(fixed + stages * per_stage);
    return static_cast<int>(stages);
  };
  std::size_t smem = 0;
  if (stream_warps() == 16) {
    const int stages = plan(16, smem);
    if (stages == 2) return launch_stages<T, 16, 2>(a, L, smem, stream);
    if (stages == 3) return launch_stages<T, 16, 3>(a, L, smem, stream);
    if (stages >= 4) return launch_stages<T, 16, 4>(a, L, smem, stream);
  }
  const int stages = plan(kDefaultWarps, smem);
  if (stages == 2) return launch_stages<T, kDefaultWarps, 2>(a, L, smem, stream);
  if (stages == 3) return launch_stages<T, kDefaultWarps, 3>(a, L, smem, stream);
  if (stages >= 4) return launch_stages<T, kDefaultWarps, 4>(a, L, smem, stream);
  return false;
}

}  // namespace

std::uint64_t moe_stream_launches() {
  return launches.load(std::memory_order_relaxed);
}

bool launch_moe_stream(const MoeStreamArgs& a, cudaStream_t stream) {
  if (!stream_enabled() || a.pairs < 1 || a.pairs > kMoeStreamSlots || a.per_token < 1 ||
      a.tokens < 1 || a.tokens * a.per_token < a.pairs || a.multiprocessors < 1 || a.H < 1 ||
      a.I < 1 || a.sync == nullptr)
    return false;
  const int chunk = a.fp8 ? 16 : 8;  // elements a 16-byte chunk
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (a.H % chunk != 0 || a.I % chunk != 0 || a.H % 4 != 0 || !aligned(a.x) ||
      !aligned(a.gate_up) || !aligned(a.down) || !aligned(a.act))
    return false;
  if (a.fp8) {
    if (a.gate_up_scales == nullptr || a.down_scales == nullptr) return false;
    return launch_typed<e4m3_bits>(a, stream);
  }
  return launch_typed<bf16_bits>(a, stream);
}

}  // namespace fs::cuda
