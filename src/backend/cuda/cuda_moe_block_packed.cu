// Qwen's MoE block for one token of packed weights (the GGUF mixes: Q4_K or IQ2_XXS routed
// gate/up, Q8_0 downs, the shared expert in the projections' format), in four kernels where the
// sequence (Backend::moe_block_into_streams over the packed ops) ran ten (session 35;
// docs/GPU.md step 24):
//
//   the sequence                                         the block
//   1. the router GEMV (linear)                          1. the same
//   2. the routing (route_warp_kernel)                   2. one grid: the routing, the expert
//   3-5. the routed gate/up, down and combine               gate's logit, the shared gate/up
//        (moe_experts_packed)                               units (swiglu in their store)
//   6-8. the shared gate/up (a packed multi-GEMV),       3. the routed gate/up (the sequence's
//        the expert gate's logit (linear), swiglu           kernel, launch_packed_gate_up)
//   9. the shared down, gated, accumulated into y        4. the routed and shared downs, the
//   10. add_scaled_streams                                  combine, the gate, the streams write
//
// The bits are the sequence's (QuantOps.PackedMoeBlockEqualsItsSequenceBitForBit): every row's
// sum goes through packed_rows_dot / packed_chunk_dot with the lanes the sequence's kernel gave
// that row (a row's sum depends on its lanes only: rows_dot's contract, kept by every packed
// form), the expert gate's row through rows_dot with linear's lanes, swiglu as SwigluOp, the
// combine as moe_combine_kernel (expert ids ascending, no fused multiply-adds), the shared down's
// epilogue and the streams write as the multi-GEMV's and add_scaled_streams'.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_epilogue.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_moe_common.cuh"
#include "backend/cuda/cuda_moe_packed.h"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_route_warp.cuh"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

// The gate/up rows and the expert gate's row take a warp each (rows of at least a warp's chunks,
// as linear and the packed multi-GEMV give them); the down rows (640 wide: 20 Q8_0 chunks) 8
// lanes, as moe_down_packed_kernel and the shared down's multi-GEMV give them.
constexpr int kUnitLanes = kWarp;
constexpr int kDownLanes = 8;
constexpr int kDownGroups = kGemvThreads / kDownLanes;
// Rows a down group takes, all their first loads in flight before the wait: (k + 1) row sets of
// `cols` columns fill a block's kDownItems * kDownGroups items.
constexpr int kDownItems = 4;

// Block 0..route.blocks-1: the routing. Block route.blocks: the expert gate's row (its first
// warp). The later blocks: unit r = the shared gate and up rows r, act[r] = silu(g) * u.
template <int kPer, typename F, typename TG>
__global__ void __launch_bounds__(kGemvThreads)
    route_shared_gate_up_packed_kernel(const RouteArgs route, const float* x, packed::Rows gate,
                                       packed::Rows up, const TG* expert_gate, std::int64_t H,
                                       std::int64_t I, float* act, float* logit) {
  if (blockIdx.x < route.blocks) {
    wait_for_inputs();  // the router's logits
    release_dependents();
    route_warp_rows<kPer>(route, blockIdx.x);
    return;
  }
  const int lane = static_cast<int>(threadIdx.x % kUnitLanes);
  if (blockIdx.x == route.blocks) {
    // linear's GEMV of the one row (a warp, rows_dot's sums), x read after the wait.
    const TG* rows[1] = {threadIdx.x < kUnitLanes ? expert_gate : nullptr};
    const float* xs[1] = {x};
    float acc[1][1] = {};
    rows_dot<TG, true, 1, 1, kUnitLanes, 8, true, true>(rows, xs, H, H / WeightChunk<TG, true>::kN,
                                                        lane, acc);
    const float v = group_sum<kUnitLanes>(acc[0][0]);
    if (threadIdx.x == 0) *logit = v;
    return;
  }
  const std::int64_t r =
      ((blockIdx.x - route.blocks - 1) * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) /
      kUnitLanes;
  const bool live = r < I;
  const std::uint8_t* rows[2] = {live ? gate.row(0, r) : nullptr, live ? up.row(0, r) : nullptr};
  const std::uint8_t* sides[2] = {live ? gate.side_row(0, r) : nullptr,
                                  live ? up.side_row(0, r) : nullptr};
  const float* xs[2] = {x, x};
  float acc[2][1] = {};
  // The weights' first round before the wait (no kernel writes them), x after it.
  packed_rows_dot<F, 1, 2, kUnitLanes, F::kUnroll, true, true>(rows, sides, xs, H, F::chunks(H),
                                                               lane, acc);
  const float g = group_sum<kUnitLanes>(acc[0][0]), u = group_sum<kUnitLanes>(acc[1][0]);
  if (lane == 0 && live) act[r] = apply_act(g, Activation::kSilu) * u;
}

// Block b takes output columns b * cols ... (b + 1) * cols - 1. Item it = (j, c) = (it / cols,
// c0 + it % cols): j < k the routed slot j's expert row c over act[j], j = k the shared down's
// row c over shared_act; a group of kDownLanes lanes takes items group + m * kDownGroups, m <
// kDownItems. The slots' ids come from the routing two kernels back, so the rows are known and
// every item's first round of loads goes out before the wait (ids read through L2: no L1 line of
// an earlier layer's). After it the k + 1 x vectors are staged in shared memory in
// PackedStagedX's order (x read from global memory a chunk at a time ran the block 1.5-1.9% slower
// than the sequence, session 35), and each row's chunks go through packed_chunk_dot in
// packed_rows_dot's order: lane, lane + kDownLanes, ... .
struct DownCombineRows {
  packed::Rows down, shared_down;
};

// kTwoBlocks (session 38): two blocks a multiprocessor, so the Qwen shapes' 233 blocks run in one
// wave. With every item's first round in flight before the wait, Q8_0's 17-halfword chunks held a
// thread at ~207 registers, one block a multiprocessor: the chain trace (`bench --timeline`, an
// H100) showed the block's blocks starting over ~19 us in two waves, 32.8 us of the Q4_K mix's
// ~184 us a layer. So only the first kPre items load before the wait (the block's blocks are
// mostly not resident before it anyway: 4% were), the rest right after it; each row's chunks
// still go through packed_chunk_dot in the same order, so the sums are the same bits.
template <typename F, bool kStreams, bool kTwoBlocks>
__global__ void __launch_bounds__(kGemvThreads, kTwoBlocks ? 2 : 1)
    packed_down_combine_kernel(const PackedDownCombine a, const DownCombineRows w, int cols) {
  constexpr int kPre = kTwoBlocks ? 1 : kDownItems;  // items whose first round loads early
  static_assert(!F::kHasMin, "the staged vectors leave no room for group sums");
  using L = PackedStagedX<F, kDownLanes>;
  constexpr int kU = F::kUnroll;  // chunks a lane has in flight a round
  __shared__ float sums[kDownItems * kDownGroups];
  __shared__ int order[kMaxTopK];
  __shared__ int count;
  const int group = static_cast<int>(threadIdx.x) / kDownLanes;
  const int lane = static_cast<int>(threadIdx.x) % kDownLanes;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * cols;
  const std::int64_t chunks = F::chunks(a.I), tw = L::token_words(chunks);
  const int items = (a.k + 1) * cols;
  const std::uint8_t* rows[kDownItems];
  const std::uint8_t* sides[kDownItems];
  int slot[kDownItems];  // the staged x a row reads: j, or k for the shared down
  typename F::Raw first[kPre][kU];
#pragma unroll
  for (int m = 0; m < kDownItems; ++m) {
    rows[m] = nullptr;
    sides[m] = nullptr;
    slot[m] = a.k;  // read (times zeros) where there is no row
    const int it = group + m * kDownGroups;
    const int j = it / cols;
    const std::int64_t c = c0 + it % cols;
    if (it < items && c < a.H) {
      if (j < a.k) {
        const std::int64_t e = __ldcg(a.ids + j);
        if (e >= 0 && e < a.E) {
          rows[m] = w.down.row(e, c);
          sides[m] = w.down.side_row(e, c);
          slot[m] = j;
        }
      } else {
        rows[m] = w.shared_down.row(0, c);
        sides[m] = w.shared_down.side_row(0, c);
      }
    }
    if (m < kPre) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t ch = lane + static_cast<std::int64_t>(u) * kDownLanes;
        first[m][u] =
            rows[m] != nullptr && ch < chunks ? F::load(rows[m], sides[m], ch) : typename F::Raw{};
      }
    }
  }
  const std::int64_t my_col = c0 + threadIdx.x;
  const bool writer = static_cast<int>(threadIdx.x) < cols && my_col < a.H;
  [[maybe_unused]] StreamsAhead ahead;
  if constexpr (kStreams) {
    if (writer) ahead.read(a.streams, a.H, my_col);
  }
  wait_for_inputs();  // act (the routed gate/up), shared_act and the logit (the routing's grid)
  release_dependents();
  const std::int64_t words = chunks * L::kK4;
  for (std::int64_t i = threadIdx.x; i < (a.k + 1) * words; i += blockDim.x) {
    const std::int64_t j = index_quotient(i, words);
    const std::int64_t at = i - j * words, c = at / L::kK4;
    const int q = static_cast<int>(at % L::kK4);
    const float* src = j < a.k ? a.act + j * a.I : a.shared_act;
    staged_x[j * tw + L::at(c, q)] =
        *reinterpret_cast<const float4*>(src + F::column(c, q / 8) + 4 * (q % 8));
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kDownItems; ++m) {
    const std::int64_t base = slot[m] * tw;
    float acc[1] = {0.0f};
    if (m < kPre) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t ch = lane + static_cast<std::int64_t>(u) * kDownLanes;
        if (ch < chunks)
          packed_chunk_dot<F, 1, kDownLanes, true>(first[m < kPre ? m : 0][u], ch, nullptr, 0, tw,
                                                   acc, base);
      }
    }
    for (std::int64_t r0 = lane + (m < kPre ? kU * kDownLanes : 0); r0 < chunks;
         r0 += kU * kDownLanes) {
      typename F::Raw raw[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t ch = r0 + static_cast<std::int64_t>(u) * kDownLanes;
        raw[u] =
            rows[m] != nullptr && ch < chunks ? F::load(rows[m], sides[m], ch) : typename F::Raw{};
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const std::int64_t ch = r0 + static_cast<std::int64_t>(u) * kDownLanes;
        if (ch < chunks)
          packed_chunk_dot<F, 1, kDownLanes, true>(raw[u], ch, nullptr, 0, tw, acc, base);
      }
    }
    const float v = group_sum<kDownLanes>(acc[0]);
    if (lane == 0) sums[group + m * kDownGroups] = v;
  }
  // moe_combine_kernel's order: the valid slots by expert id ascending (ties by slot).
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < a.k; ++j) {
      const std::int32_t e = a.ids[j];
      if (e < 0 || e >= a.E) continue;
      int at = n;
      for (; at > 0 && a.ids[order[at - 1]] > e; --at) order[at] = order[at - 1];
      order[at] = j;
      ++n;
    }
    count = n;
  }
  __syncthreads();
  if (!writer) return;
  const int t = static_cast<int>(threadIdx.x);
  float out = 0.0f;
  for (int i = 0; i < count; ++i)
    out = mul_add(a.weights[order[i]], sums[order[i] * cols + t], out);
  Epilogue ep;
  ep.token_gate = a.logit;
  ep.accumulate = true;
  const float value = finish(ep, sums[a.k * cols + t], my_col, 0, out);
  if constexpr (kStreams)
    ahead.write(a.streams, a.H, my_col, value);
  else
    a.y[my_col] = value;
}

// Whether `kernel` keeps anything in local memory (spilled registers, a stack), asked once.
template <auto kKernel>
bool uses_local_memory() {
  static const bool local = [] {
    cudaFuncAttributes attributes{};
    return cudaFuncGetAttributes(&attributes, kKernel) != cudaSuccess ||
           attributes.localSizeBytes != 0;
  }();
  return local;
}

// The shared memory packed_down_combine_kernel stages the k + 1 vectors of I in.
template <typename F>
std::size_t down_combine_staged_bytes(std::int64_t top_k, std::int64_t I) {
  return static_cast<std::size_t>(top_k + 1) *
         static_cast<std::size_t>(PackedStagedX<F, kDownLanes>::token_words(F::chunks(I))) *
         sizeof(float4);
}

// Columns a block of packed_down_combine_kernel: (k + 1) row sets of them in its items.
std::int64_t down_combine_cols(std::int64_t top_k) {
  return kDownItems * kDownGroups / (top_k + 1);
}

// The expert gate's element types the grid takes.
bool expert_gate_ok(const Weight& g, std::int64_t H) {
  if (g.is_packed() || g.block_scaled() || g.shape.size() != 2 || g.rows() != 1 || g.cols() != H ||
      g.device != Device::kCuda || g.data == nullptr)
    return false;
  if (g.dtype == DType::kBF16)
    return vec_ok<bf16_bits>(nullptr, g.data, H) &&
           !gemv_short_rows(H / WeightChunk<bf16_bits, true>::kN);
  if (g.dtype == DType::kF32)
    return vec_ok<float>(nullptr, g.data, H) && !gemv_short_rows(H / WeightChunk<float, true>::kN);
  return false;
}

}  // namespace

bool packed_moe_block_takes(const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                            const Weight& shared_up, const Weight& shared_down,
                            const Weight& expert_gate, std::int64_t H, std::int64_t top_k) {
  const auto on_gpu = [](const Weight& w) {
    return w.device == Device::kCuda && w.data != nullptr;
  };
  if (gate_up.shape.size() != 3 || down.shape.size() != 3 || !gate_up.is_packed() ||
      !down.is_packed() || !packed::decodable(gate_up) || !packed::decodable(down) ||
      !on_gpu(gate_up) || !on_gpu(down))
    return false;
  const auto E = gate_up.shape[0], I = gate_up.shape[1] / 2;
  if (gate_up.shape[1] != 2 * I || gate_up.shape[2] != H || down.shape[0] != E ||
      down.shape[1] != H || down.shape[2] != I || E < 1 || I < 1)
    return false;
  if (!shared_gate.is_packed() || !shared_up.is_packed() || !shared_down.is_packed() ||
      *shared_gate.packed != *shared_up.packed || *shared_down.packed != *down.packed ||
      !packed::decodable(shared_gate) || !packed::decodable(shared_down) ||
      shared_gate.shape.size() != 2 || shared_up.shape.size() != 2 ||
      shared_down.shape.size() != 2 || shared_gate.rows() != I || shared_up.rows() != I ||
      shared_gate.cols() != H || shared_up.cols() != H || shared_down.rows() != H ||
      shared_down.cols() != I || shared_down.row_bytes() != down.row_bytes() ||
      shared_gate.block_scaled() != shared_up.block_scaled() ||
      shared_down.block_scaled() != down.block_scaled() || !on_gpu(shared_gate) ||
      !on_gpu(shared_up) || !on_gpu(shared_down))
    return false;
  if (!expert_gate_ok(expert_gate, H)) return false;
  for (const Weight* w : {&gate_up, &down, &shared_gate, &shared_up, &shared_down})
    if (!w->check_storage().ok()) return false;
  // The lanes the sequence gives each row: a warp for the gate/up rows, 8 for the down rows.
  bool lanes = false;
  packed::with_format(shared_gate, [&](auto f) {
    using F = decltype(f);
    lanes = !packed::short_rows(F::chunks(H));
  });
  packed::with_format(down, [&](auto f) {
    using F = decltype(f);
    lanes = lanes && packed::short_rows(F::chunks(I)) && !F::kHasMin &&
            down_combine_staged_bytes<F>(top_k, I) <= kMaxStagedXBytes;
  });
  return lanes && top_k >= 1 && top_k <= kMaxTopK && down_combine_cols(top_k) >= 1;
}

void launch_route_shared_gate_up_packed(const RouteArgs& route, int route_slots, const float* x,
                                        const Weight& gate, const Weight& up,
                                        const Weight& expert_gate, const std::uint8_t* codebook,
                                        std::int64_t H, std::int64_t I, float* act, float* logit,
                                        cudaStream_t stream) {
  const unsigned blocks = route.blocks + 1 + grid_for(I * kUnitLanes, kGemvThreads);
  with_route_slots(route_slots, [&](auto per) {
    constexpr int kPer = decltype(per)::value;
    packed::with_format(gate, [&](auto f) {
      using F = decltype(f);
      const auto launch = [&](auto tg) {
        using TG = decltype(tg);
        launch_overlapped(route_shared_gate_up_packed_kernel<kPer, F, TG>, blocks, kGemvThreads, 0,
                          stream, route, x, packed::rows_of(gate, codebook),
                          packed::rows_of(up, codebook),
                          reinterpret_cast<const TG*>(expert_gate.data), H, I, act, logit);
      };
      if (expert_gate.dtype == DType::kBF16)
        launch(bf16_bits{});
      else
        launch(float{});
    });
  });
}

void launch_packed_down_combine(const PackedDownCombine& args, const Weight& down,
                                const Weight& shared_down, const std::uint8_t* codebook,
                                cudaStream_t stream) {
  const DownCombineRows rows{packed::rows_of(down, codebook),
                             packed::rows_of(shared_down, codebook)};
  const auto cols = down_combine_cols(args.k);
  const auto blocks = static_cast<unsigned>((args.H + cols - 1) / cols);
  packed::with_format(down, [&](auto f) {
    using F = decltype(f);
    if constexpr (!F::kHasMin) {
      const auto smem = down_combine_staged_bytes<F>(args.k, args.I);
      const auto launch = [&](auto kernel) {
        launch_overlapped(kernel, blocks, kGemvThreads, smem, stream, args, rows,
                          static_cast<int>(cols));
      };
      // Two blocks a multiprocessor where they fit and the registers hold them without local
      // memory (ptxas: FP4's form spills 200-280 bytes a thread; Q8_0's takes 92 registers, IQ2_XXS
      // and Q6_K's 118-126, none spilling). FLASHSERVE_CUDA_PACKED_DOWN_TWO_BLOCKS=0: every
      // item's first round before the wait, one block.
      const auto two = [&](auto tag) {
        constexpr auto kernel = decltype(tag)::kKernel;
        return env_flag_default_on("FLASHSERVE_CUDA_PACKED_DOWN_TWO_BLOCKS") &&
               !uses_local_memory<kernel>() &&
               resident_blocks(reinterpret_cast<const void*>(kernel), kGemvThreads, smem) >= 2;
      };
      if (args.y == nullptr) {
        if (two(KernelTag<packed_down_combine_kernel<F, true, true>>{}))
          launch(packed_down_combine_kernel<F, true, true>);
        else
          launch(packed_down_combine_kernel<F, true, false>);
      } else {
        if (two(KernelTag<packed_down_combine_kernel<F, false, true>>{}))
          launch(packed_down_combine_kernel<F, false, true>);
        else
          launch(packed_down_combine_kernel<F, false, false>);
      }
    }
  });
}

}  // namespace fs::cuda
