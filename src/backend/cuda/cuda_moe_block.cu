// Qwen's MoE block at 1-4 tokens (Backend::moe_block; a decode step and an MTP verify): five
// kernels instead of the sequence's seven (eight into the streams), the same bits.
//
// The sequence (route_experts, moe_experts, shared_expert) runs at 1-4 tokens:
//   1. the router GEMV (linear), 2. route_warp_kernel (softmax, top-k), 3-5. the routed experts'
//   gate/up, down and combine (moe_experts' fused path), 6-7. the shared expert's gate/up and its
//   down, accumulated into y (shared_expert's fused path).
// Decode at batch 1 is bound by launches, not bytes (a kernel of the chain costs ~3-4 us), so two
// of them are folded into others:
//   - The shared expert's gate/up reads only x: its blocks join the routing's grid. Block 0 (of
//     kGemvThreads threads, 8 warps: token s takes warp s) runs route_warp_rows, the later
//     blocks shared_gate_up_units with their block index less one: the same device functions as
//     the separate kernels (cuda_route_warp.cuh, cuda_shared_expert.cuh), the same threads per
//     unit and chunks, so the same sums.
//   - The routed combine becomes the shared down's accumulated base: for column c the down
//     GEMV's group sums its row as multi_gemv does (the lanes `linear` picks: a row's sum depends
//     on nothing else), then lane 0 computes the combine's value exactly as
//     moe_combine_fused_kernel<1> does (fmaf over the pairs in top-k order, from 0) and finishes
//     the row with the multi-GEMV's epilogue (cuda_epilogue.cuh) accumulating into that value:
//     y[c] = combine + sigmoid(logit) * (down row c · act), what combine-then-accumulate wrote.
//   - At 2-4 tokens (session 20; an MTP verify ran the sequence before, and
//     FLASHSERVE_CUDA_MOE_BLOCK_ONE_TOKEN=1 still does) the same device functions take kS tokens,
//     whose per-token sums are the one-token ones (rows_dot's contract), and the routed experts
//     run over the tokens' (token, expert) pairs as moe_experts does: each token of a verify gets
//     the bits of its decode step, in three kernels fewer.
// So the block is: the router GEMV -> routing + shared gate/up -> routed gate/up -> routed down
// -> shared down + combine. One token of FP8 experts beside an FP8 shared expert as wide as they
// (the released Qwen shapes) takes four (session 22): the routed down joins the shared down and
// the combine in routed_down_combine_fp8_kernel, whose weights all load before its wait
// (FLASHSERVE_CUDA_MOE_DOWN_COMBINE=0: the five).
//
// Taken only where every op of the sequence would run the kernels named above (route_experts'
// warp router, moe_experts' fused path of 1-4 tokens, shared_expert's fused kernels with its down
// on warp or 8-lane groups); otherwise, and with FLASHSERVE_CUDA_MOE_BLOCK=0, the sequence runs.
// Nothing here synchronises or allocates outside the pool, and the op returns before queueing
// when a step graph's replay walks it (docs/GPU.md, rules for new CUDA ops).
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_epilogue.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_moe_common.cuh"
#include "backend/cuda/cuda_moe_packed.h"
#include "backend/cuda/cuda_route_warp.cuh"
#include "backend/cuda/cuda_shared_expert.cuh"
#include "backend/cuda/cuda_switches.h"
#include "backend/cuda/cuda_weight_checks.cuh"

namespace fs::cuda {
namespace {

// route_experts' warp router takes k <= 64, as moe_experts (kMaxTopK).
constexpr std::int64_t kMaxRouteK = 64;
// Tokens the block takes: a decode step and an MTP verify of depth 1-3 (the router's block has a
// warp per token; moe_token_parts takes 1-4 tokens' pairs).
constexpr std::int64_t kBlockTokens = 4;

// The routing and the shared expert's gate/up (f32 or bf16) in one grid of kGemvThreads-thread
// blocks. The shared units wait for x inside rows_dot, after their first weight loads.
template <int kPer, typename T, int kG, int kS>
__global__ void __launch_bounds__(kGemvThreads)
    route_shared_gate_up_kernel(const RouteArgs route, const float* x, const T* gate, const T* up,
                                const T* expert_gate, std::int64_t H, std::int64_t I, float* act,
                                float* logit) {
  if (blockIdx.x < route.blocks) {
    wait_for_inputs();  // the router's logits
    release_dependents();
    route_warp_rows<kPer>(route, blockIdx.x);
    return;
  }
  shared_gate_up_units<T, kS, kG>(x, gate, up, expert_gate, H, I, act, logit,
                                  blockIdx.x - route.blocks);
}

// The same with FP8 gate and up beside a float expert gate (TG).
template <int kPer, typename TG, int kG, int kS>
__global__ void __launch_bounds__(kGemvThreads)
    route_shared_gate_up_fp8_kernel(const RouteArgs route, const float* x, const e4m3_bits* gate,
                                    const float* gate_scales, const e4m3_bits* up,
                                    const float* up_scales, std::int64_t grid_cols,
                                    const TG* expert_gate, std::int64_t H, std::int64_t I,
                                    float* act, float* logit) {
  wait_for_inputs();  // the router's logits and x
  release_dependents();
  if (blockIdx.x < route.blocks) {
    route_warp_rows<kPer>(route, blockIdx.x);
    return;
  }
  shared_gate_up_fp8_units<TG, kS, kG>(x, gate, gate_scales, up, up_scales, grid_cols, expert_gate,
                                       H, I, act, logit, blockIdx.x - route.blocks);
}

// The routed experts' combine (moe_combine_fused_kernel<1>, cuda_moe.cu): token s's pairs are
// the k from s * k.
struct RoutedCombine {
  const float* part;        // [P, H]: the routed down products
  const std::int32_t* ids;  // [P]
  const float* weights;     // [P]
  int k;                    // pairs a token (P = S * k)
  std::int64_t E;
};

// y[s, c] = finish(down row c · act[s]) accumulated into the routed combine's column c of token
// s, with the shared expert's epilogue (token gate sigmoid(logit[s])): a group of kG lanes a row,
// as the multi-GEMV's (kR = 1; its row sums depend on kG only, not on the tokens). Every thread
// reaches rows_dot (staging). kStreams: y[s, c] goes into the hyper-connection streams instead
// (moe_block_into_streams); at one token its h values and gates are read before the wait
// (StreamsAhead, cuda_epilogue.cuh), at 2-4 at the write.
template <typename T, int kS, int kG, bool kStaged, bool kStreams>
__global__ void __launch_bounds__(kGemvThreads)
    shared_down_combine_kernel(const float* act, const T* down, const float* scales,
                               std::int64_t grid_cols, std::int64_t H, std::int64_t I,
                               const float* logit, const RoutedCombine routed, float* y,
                               const StreamsOut streams) {
  constexpr int kU = 8;  // the multi-GEMV's chunks in flight at one row a group
  const std::int64_t c = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kG;
  const int lane = static_cast<int>(threadIdx.x % kG);
  [[maybe_unused]] StreamsAhead ahead;
  if constexpr (kStreams && kS == 1) {
    if (lane == 0 && c < H) ahead.read(streams, H, c);
  }
  const T* rows[1] = {c < H ? down + c * I : nullptr};
  const float* xs[1] = {act};
  const float* scale_rows[1] = {c < H && scales != nullptr ? scales + (c / kFp8Block) * grid_cols
                                                           : nullptr};
  float acc[1][kS] = {};
  // Weights only before the wait (inside rows_dot); act, logit, the routing and part after it.
  rows_dot<T, true, kS, 1, kG, kU, true, true, kStaged>(rows, xs, scale_rows, I,
                                                        I / WeightChunk<T, true>::kN, lane, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float v = group_sum<kG>(acc[0][s]);
    if (lane != 0 || c >= H) continue;
    float out = 0.0f;
    for (int j = s * routed.k; j < (s + 1) * routed.k; ++j)
      if (routed.ids[j] >= 0 && routed.ids[j] < routed.E)
        out = fmaf(routed.weights[j], routed.part[j * H + c], out);
    Epilogue ep;
    ep.token_gate = logit;
    ep.accumulate = true;
    const float value = finish(ep, v, c, s, out);
    if constexpr (kStreams && kS == 1)
      ahead.write(streams, H, c, value);
    else if constexpr (kStreams)
      StreamsAhead::write_streams(streams, H, s, c, value);
    else
      y[s * H + c] = value;
  }
}

template <typename T, int kS, int kG, bool kStreams>
void launch_shared_down_combine(const float* act, const Weight& down, std::int64_t H,
                                std::int64_t I, const float* logit, const RoutedCombine& routed,
                                float* y, const StreamsOut& streams, cudaStream_t stream) {
  auto kernel = shared_down_combine_kernel<T, kS, kG, false, kStreams>;
  std::size_t smem = 0;
  if constexpr (kStagesX<T, true, kG, kS>) {
    smem = staged_x_launch_bytes<T, true, kG, kS>(I / WeightChunk<T, true>::kN);
    if (smem) kernel = shared_down_combine_kernel<T, kS, kG, true, kStreams>;
  }
  const float* scales =
      down.block_scaled() ? reinterpret_cast<const float*>(down.scales.data) : nullptr;
  const std::int64_t grid_cols = down.block_scaled() ? down.scales.grid_cols(I) : 0;
  launch_overlapped(kernel, grid_for(H * kG, kGemvThreads), kGemvThreads, smem, stream, act,
                    reinterpret_cast<const T*>(down.data), scales, grid_cols, H, I, logit, routed,
                    y, streams);
}

// The routed experts' down products, the shared expert's down and the combine of one token in
// one kernel (session 22; before it, moe_down_part_kernel then shared_down_combine_kernel): the
// block's rows are known before its wait, since the ids come from the routing two kernels back
// (the routed gate/up runs between), so all of its weight loads go out while the gate/up still
// runs, and the routed parts meet the combine in shared memory instead of a kernel boundary.
// Block b takes `cols` output columns; its items are (row set j, column c), j < k the routed slot
// j's expert row c, j = k the shared down's row c; a group of kFp8DownLanes lanes takes items
// group, group + groups, ... . Each row's sum is the one its kernel before computed: groups of 8
// lanes over 16-byte FP8 chunks, a lane's chunks lane, lane + 8, ... in order (rows_dot's
// contract: a row's sum depends on the group width only), and the combine and the epilogue are
// shared_down_combine_kernel's at one token. So the bits are the two kernels'
// (CudaMoeBlock.EqualsItsSequenceBitForBit, and the test of this kernel against them).
constexpr int kFp8DownLanes = 8;  // the FP8 routed down's and shared down's groups (640 wide)
constexpr int kFp8DownLoads = 5;  // chunks in flight a row: a 640-wide row's 40 chunks at once
constexpr int kDownCombineGroups = kGemvThreads / kFp8DownLanes;
constexpr int kDownCombineItems = 4;  // rows a group: (k + 1) * cols <= 128 items a block

struct DownCombineArgs {
  const float* act;  // [k, I]: the routed slots' swiglu(gate_up · x)
  const e4m3_bits* down;
  const float* down_scales;  // the [E, H, I] experts' 128x128 grid
  const float* shared_act;   // [Is = I]
  const e4m3_bits* shared_down;
  const float* shared_scales;  // [H, I]'s grid
  std::int64_t shared_grid_cols;
  const std::int32_t* ids;  // [k], written two kernels back
  const float* weights;     // [k]
  const float* logit;       // the shared expert's gate logit
  int k;
  std::int64_t E, H, I;
  int cols;  // output columns a block
  float* y;  // or the streams
  StreamsOut streams;
};

template <bool kStreams>
__global__ void __launch_bounds__(kGemvThreads, 2)
    routed_down_combine_fp8_kernel(const DownCombineArgs a) {
  constexpr int kItems = kDownCombineItems;
  using Chunk = WeightChunk<e4m3_bits, true>;
  __shared__ float sums[kItems * kDownCombineGroups];
  const int group = static_cast<int>(threadIdx.x) / kFp8DownLanes;
  const int lane = static_cast<int>(threadIdx.x) % kFp8DownLanes;
  const std::int64_t c0 = static_cast<std::int64_t>(blockIdx.x) * a.cols;
  const int items = (a.k + 1) * a.cols;
  const std::int64_t chunks = a.I / Chunk::kN;  // <= kFp8DownLanes * kFp8DownLoads (the host)
  // Before the wait: every weight chunk of the group's rows, and lane u's the scale of each row's
  // chunks u (a lane's chunk u lies in 128-column block u), shuffled to the group after it.
  Chunk::Raw raw[kItems][kFp8DownLoads];
  float scale[kItems];
  int source[kItems];  // the row's x: a routed slot j < k, k the shared act, -1 none
#pragma unroll
  for (int m = 0; m < kItems; ++m) {
    source[m] = -1;
    scale[m] = 0.0f;
    const e4m3_bits* row = nullptr;
    const float* scale_row = nullptr;
    const int it = group + m * kDownCombineGroups;
    const int j = it / a.cols;
    const std::int64_t c = c0 + it % a.cols;
    if (it < items && c < a.H) {
      if (j < a.k) {
        // The routing finished before the gate/up could stop waiting (cuda_common.h); read
        // through L2, no L1 line of an earlier layer's ids.
        const std::int64_t e = __ldcg(a.ids + j);
        if (e >= 0 && e < a.E) {
          row = a.down + (e * a.H + c) * a.I;
          scale_row = ExpertGrid{a.H, a.I}.row(a.down_scales, e, c);
          source[m] = j;
        }
      } else {
        row = a.shared_down + c * a.I;
        scale_row = a.shared_scales + (c / kFp8Block) * a.shared_grid_cols;
        source[m] = a.k;
      }
    }
#pragma unroll
    for (int u = 0; u < kFp8DownLoads; ++u) {
      const std::int64_t ch = lane + static_cast<std::int64_t>(u) * kFp8DownLanes;
      raw[m][u] = row != nullptr && ch < chunks ? Chunk::load(row + ch * Chunk::kN) : Chunk::Raw{};
    }
    const std::int64_t own = static_cast<std::int64_t>(lane) * kFp8DownLanes * Chunk::kN;
    if (row != nullptr && lane < kFp8DownLoads && own < a.I)
      scale[m] = __ldg(scale_row + own / kFp8Block) * Chunk::kScaleFactor;
  }
  const std::int64_t my_col = c0 + threadIdx.x;
  const bool writer = static_cast<int>(threadIdx.x) < a.cols && my_col < a.H;
  [[maybe_unused]] StreamsAhead ahead;
  if constexpr (kStreams) {
    if (writer) ahead.read(a.streams, a.H, my_col);
  }
  wait_for_inputs();  // act (the gate/up) and shared_act, the logit (the routing's grid)
  release_dependents();
  // The k + 1 x rows (the slots' act, then shared_act) copied into shared memory in StagedX's
  // order, so a group's lanes read consecutive float4s: one L2 round trip for the block, where
  // reading them from global memory a chunk at a time measured 3% slower on the step
  // (bench/NOTES.md, session 22).
  using Staged = StagedX<Chunk::kN, kFp8DownLanes>;
  const std::int64_t tw = Staged::token_words(chunks);
  const std::int64_t words = chunks * Staged::kWords;
  for (std::int64_t w = threadIdx.x; w < (a.k + 1) * words; w += blockDim.x) {
    const std::int64_t j = index_quotient(w, words), at = w - j * words;
    const auto* src = reinterpret_cast<const float4*>(j < a.k ? a.act + j * a.I : a.shared_act);
    staged_x[j * tw + Staged::at(at / Staged::kWords, static_cast<int>(at % Staged::kWords))] =
        src[at];
  }
  __syncthreads();
  // rows_dot's arithmetic for one token: a chunk's dot product from zero a word at a time, then
  // one product by its block scale into the lane's sum, chunks in order.
#pragma unroll
  for (int m = 0; m < kItems; ++m) {
    const std::int64_t row_words = (source[m] < 0 ? a.k : source[m]) * tw;
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < kFp8DownLoads; ++u) {
      const float block_scale = __shfl_sync(0xffffffffu, scale[m], u, kFp8DownLanes);
      const std::int64_t ch = lane + static_cast<std::int64_t>(u) * kFp8DownLanes;
      if (ch >= chunks) continue;
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < Chunk::kN / 4; ++i) {
        float w4[4], xv[4];
        Chunk::widen_word(raw[m][u], i, w4);
        const float4 v = staged_x[row_words + Staged::at(ch, i)];
        xv[0] = v.x;
        xv[1] = v.y;
        xv[2] = v.z;
        xv[3] = v.w;
#pragma unroll
        for (int q = 0; q < 4; ++q) d = fmaf(w4[q], xv[q], d);
      }
      acc = fmaf(d, block_scale, acc);
    }
    const float v = group_sum<kFp8DownLanes>(acc);
    if (lane == 0) sums[group + m * kDownCombineGroups] = v;
  }
  __syncthreads();
  if (!writer) return;
  const int t = static_cast<int>(threadIdx.x);
  float out = 0.0f;
  for (int j = 0; j < a.k; ++j)
    if (a.ids[j] >= 0 && a.ids[j] < a.E) out = fmaf(a.weights[j], sums[j * a.cols + t], out);
  Epilogue ep;
  ep.token_gate = a.logit;
  ep.accumulate = true;
  const float value = finish(ep, sums[a.k * a.cols + t], my_col, 0, out);
  if constexpr (kStreams)
    ahead.write(a.streams, a.H, my_col, value);
  else
    a.y[my_col] = value;
}

// An uploaded, unpacked weight.
bool uploaded(const Weight& w) {
  return w.device == Device::kCuda && w.data != nullptr && !w.is_packed();
}
// The chunk width of the multi-GEMV's rows over `dtype`.
std::int64_t chunk_elements(DType dtype) {
  return dtype == DType::kF8E4M3 ? WeightChunk<e4m3_bits, true>::kN
         : dtype == DType::kBF16 ? WeightChunk<bf16_bits, true>::kN
                                 : WeightChunk<float, true>::kN;
}

}  // namespace

void CudaBackend::moe_block(const Tensor& x, const Weight& router, std::int64_t top_k,
                            bool normalize, const Weight& gate_up, const Weight& down,
                            const Weight& shared_gate, const Weight& shared_up,
                            const Weight& shared_down, const Weight& shared_expert_gate,
                            Tensor& experts, Tensor& weights, Tensor& y) {
  moe_block_to(x, router, top_k, normalize, gate_up, down, shared_gate, shared_up, shared_down,
               shared_expert_gate, experts, weights, &y, nullptr);
}

void CudaBackend::moe_block_into_streams(const Tensor& x, const Weight& router, std::int64_t top_k,
                                         bool normalize, const Weight& gate_up, const Weight& down,
                                         const Weight& shared_gate, const Weight& shared_up,
                                         const Weight& shared_down,
                                         const Weight& shared_expert_gate, Tensor& experts,
                                         Tensor& weights, const StreamsWrite& out) {
  moe_block_to(x, router, top_k, normalize, gate_up, down, shared_gate, shared_up, shared_down,
               shared_expert_gate, experts, weights, nullptr, &out);
}

// y, or (y null) the streams of `into`: the five kernels' last one writes either.
void CudaBackend::moe_block_to(const Tensor& x, const Weight& router, std::int64_t top_k,
                               bool normalize, const Weight& gate_up, const Weight& down,
                               const Weight& shared_gate, const Weight& shared_up,
                               const Weight& shared_down, const Weight& shared_expert_gate,
                               Tensor& experts, Tensor& weights, Tensor* y_out,
                               const StreamsWrite* into) {
  constexpr const char* kOp = "moe_block";
  if (failed()) return;
  const auto sequence = [&] {
    if (y_out != nullptr)
      Backend::moe_block(x, router, top_k, normalize, gate_up, down, shared_gate, shared_up,
                         shared_down, shared_expert_gate, experts, weights, *y_out);
    else
      Backend::moe_block_into_streams(x, router, top_k, normalize, gate_up, down, shared_gate,
                                      shared_up, shared_down, shared_expert_gate, experts, weights,
                                      *into);
  };
  // 1-4 tokens (a decode step, an MTP verify of depth 1-3; FLASHSERVE_CUDA_MOE_BLOCK_ONE_TOKEN=1:
  // one, as before session 20) of f32 activations in device memory; the streams (h [S, streams *
  // H] and the gates [S, streams], f32 on the device) apart from x and the routing
  // (FLASHSERVE_CUDA_FUSED_HC_WRITE=0: the block to y, then add_scaled_streams).
  const auto S = x.shape().size() == 2 ? x.rows() : 0;
  const std::int64_t max_tokens =
      env_flag("FLASHSERVE_CUDA_MOE_BLOCK_ONE_TOKEN") ? 1 : kBlockTokens;
  Tensor scratch_y;
  Tensor& y = y_out != nullptr ? *y_out : scratch_y;
  const bool streams_ok =
      into == nullptr ||
      (env_flag_default_on("FLASHSERVE_CUDA_FUSED_HC_WRITE") && into->h.dtype() == DType::kF32 &&
       into->h.device() == Device::kCuda && into->h.shape().size() == 2 && into->h.rows() == S &&
       into->inject.dtype() == DType::kF32 && into->inject.device() == Device::kCuda &&
       into->inject.shape().size() == 2 && into->inject.rows() == S && into->inject.cols() >= 1 &&
       into->h.cols() == into->inject.cols() * x.cols() && &into->h != &x && &into->h != &experts &&
       &into->h != &weights && into->h.raw() != x.raw());
  if (!moe_block_enabled() || !streams_ok || S < 1 || S > max_tokens || x.cols() < 1 ||
      x.dtype() != DType::kF32 || x.device() != Device::kCuda || x.raw() == nullptr || &y == &x ||
      &y == &experts || &y == &weights || &experts == &weights)
    return sequence();
  const auto H = x.cols();
  // route_experts' warp router (cuda_routing.cu): k <= 64, at most 1,024 experts, not the block
  // form.
  const auto Er = router.shape.size() == 2 ? router.rows() : 0;
  const int slots = route_warp_slots(Er);
  const bool route_ok = uploaded(router) && Er >= 1 && top_k >= 1 && top_k <= kMaxRouteK &&
                        slots != 0 && router.cols() == H;
  // moe_experts' one-token fused path (cuda_moe.cu): stacked unpacked f32, bf16 or FP8 experts
  // matching x, and not FLASHSERVE_CUDA_MOE_PAIRS.
  const bool stacked = gate_up.shape.size() == 3 && down.shape.size() == 3;
  const auto E = stacked ? gate_up.shape[0] : 0, I = stacked ? gate_up.shape[1] / 2 : 0;
  const bool routed_ok = stacked && uploaded(gate_up) && uploaded(down) &&
                         (matrix_dtype(gate_up) || fp8_matrix(gate_up)) &&
                         (matrix_dtype(down) || fp8_matrix(down)) && gate_up.shape[2] == H &&
                         gate_up.shape[1] == 2 * I && down.shape[0] == E && down.shape[1] == H &&
                         down.shape[2] == I && E >= 1 && I >= 1 &&
                         !env_flag("FLASHSERVE_CUDA_MOE_PAIRS");
  // shared_expert's fused kernels (cuda_fused.cu) at S rows over y [S, H].
  const auto Is = shared_gate.rows();
  const auto dtype = shared_gate.dtype;
  const bool fp8 = fp8_matrix(shared_gate) &&
                   chunked(dtype, x.data(), {&shared_gate, &shared_up}, H) &&
                   matrix_dtype(shared_expert_gate) &&
                   chunked(shared_expert_gate.dtype, x.data(), {&shared_expert_gate}, H) &&
                   fp8_matrix(shared_down);
  const bool shared_ok =
      uploaded(shared_gate) && uploaded(shared_up) && uploaded(shared_down) &&
      uploaded(shared_expert_gate) && (matrix_dtype(shared_gate) || fp8) &&
      shared_gate.cols() == H && Is >= 1 && shared_up.rows() == Is && shared_up.cols() == H &&
      shared_expert_gate.rows() == 1 && shared_expert_gate.cols() == H && shared_down.rows() == H &&
      shared_down.cols() == Is &&
      (fp8 || chunked(dtype, x.data(), {&shared_gate, &shared_up, &shared_expert_gate}, H)) &&
      shared_down.dtype == dtype;
  // The shared down on groups of 8 or 32 lanes a row: multi_gemv_rows (cuda_fused.cu) gives few
  // long rows (under 1,024 rows of at least 4 * kGemvThreads chunks) a block each instead.
  const auto down_chunks = Is / chunk_elements(dtype);
  const bool block_rows = H < 1024 && down_chunks >= 4 * kGemvThreads;
  // The hyper-connection streams the last kernel writes into, or none (y).
  const StreamsOut streams = into != nullptr ? StreamsOut{.h = into->h.data(),
                                                          .inject = into->inject.data(),
                                                          .streams = into->inject.cols()}
                                             : StreamsOut{};
  // The routing's part of the first grid: block 0 routes the S tokens' logits into experts and
  // weights.
  const auto route_args = [&](const Tensor& logits, std::int64_t tokens) {
    return RouteArgs{.logits = logits.data(),
                     .S = tokens,
                     .E = Er,
                     .k = top_k,
                     .normalize = normalize,
                     .idx = experts.data_as<std::int32_t>(),
                     .val = weights.data(),
                     .blocks = 1,
                     .fast = route_fast_picks()};
  };
  // One token of packed weights (the GGUF mixes): four kernels (cuda_moe_block_packed.cu).
  // FLASHSERVE_CUDA_PACKED_MOE_BLOCK=0: the sequence, as before session 35. An MTP verify's 2-4
  // tokens keep the sequence: the block over them (its down + combine a grid row a token, each
  // as its one-token block) measured slower than the sequence with its routed gate/up streamed
  // (session 37, docs/GPU.md step 26: the down + combine's 207 registers a thread hold one block
  // a multiprocessor, and four tokens' 932 blocks ran in seven waves).
  if (route_ok && S == 1 && env_flag_default_on("FLASHSERVE_CUDA_PACKED_MOE_BLOCK") &&
      reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0 &&
      packed_moe_block_takes(gate_up, down, shared_gate, shared_up, shared_down, shared_expert_gate,
                             H, top_k)) {
    const std::uint8_t* codebook = nullptr;
    for (const Weight* w : {&gate_up, &down, &shared_gate})
      if (w->storage() == quant::QuantType::kIQ2_XXS && (codebook = iq2_grid()) == nullptr) return;
    const auto E = gate_up.shape[0], I = gate_up.shape[1] / 2;
    Tensor shared_act, logit, logits;
    if (!ensure(shared_act, {1, I}) || !ensure(logit, {1, 1})) return;
    linear(x, router, logits);  // the router's GEMV, as route_experts
    if (failed() || !ensure(experts, {1, top_k}, DType::kI32) || !ensure(weights, {1, top_k}) ||
        (y_out != nullptr && !ensure(y, {1, H})))
      return;
    Tensor& act = scratch(moe_act_);
    if (!ensure(act, {top_k, I})) return;
    if (walking()) return;  // a replay: outputs ensured, nothing queued
    const RouteArgs route = route_args(logits, 1);
    launch_route_shared_gate_up_packed(route, slots, x.data(), shared_gate, shared_up,
                                       shared_expert_gate, codebook, H, I, shared_act.data(),
                                       logit.data(), stream());
    if (!launched(kOp)) return;
    launch_packed_gate_up(x.data(), gate_up, codebook, experts.data_as<std::int32_t>(), 1, top_k, E,
                          H, I, 0.0f, act.data(), stream());
    if (!launched(kOp)) return;
    const PackedDownCombine args{.act = act.data(),
                                 .shared_act = shared_act.data(),
                                 .ids = experts.data_as<std::int32_t>(),
                                 .weights = weights.data(),
                                 .logit = logit.data(),
                                 .k = static_cast<int>(top_k),
                                 .E = E,
                                 .H = H,
                                 .I = I,
                                 .y = y_out != nullptr ? y.data() : nullptr,
                                 .streams = streams};
    launch_packed_down_combine(args, down, shared_down, codebook, stream());
    launched(kOp);
    return;
  }
  if (!route_ok || !routed_ok || !shared_ok || block_rows) return sequence();

  Tensor shared_act, logit;
  if (!ensure(shared_act, {S, Is}) || !ensure(logit, {S, 1})) return;
  // y itself only when it is the output (the streams take the values otherwise).
  if (!chunked(dtype, shared_act.data(), {&shared_down}, Is)) return sequence();
  Tensor logits;
  linear(x, router, logits);  // the router's GEMV, as route_experts
  if (failed() || !ensure(experts, {S, top_k}, DType::kI32) || !ensure(weights, {S, top_k}) ||
      (y_out != nullptr && !ensure(y, {S, H})))
    return;
  // The routed experts' scratch, as moe_experts': the members eagerly, the step's in a graph.
  Tensor& act = scratch(moe_act_);
  Tensor& part = scratch(moe_out_);
  if (!ensure(act, {S * top_k, I}) || !ensure(part, {S * top_k, H})) return;
  if (walking()) return;  // a replay: outputs ensured, nothing queued

  // 2. The routing (block 0) and the shared expert's gate/up (the later blocks).
  const RouteArgs route = route_args(logits, S);
  const auto units = Is + 1;
  with_count<kBlockTokens>(S, [&](auto tokens) {
    constexpr int kS = decltype(tokens)::value;
    with_route_slots(slots, [&](auto per) {
      constexpr int kPer = decltype(per)::value;
      if (fp8) {
        const auto* g = as<e4m3_bits>(shared_gate);
        const auto* u = as<e4m3_bits>(shared_up);
        const auto* gs = reinterpret_cast<const float*>(shared_gate.scales.data);
        const auto* us = reinterpret_cast<const float*>(shared_up.scales.data);
        const auto gc = shared_gate.scales.grid_cols(H);
        auto launch = [&](auto tg, auto lanes) {
          using TG = decltype(tg);
          constexpr int kG = decltype(lanes)::value;
          launch_overlapped(route_shared_gate_up_fp8_kernel<kPer, TG, kG, kS>,
                            route.blocks + grid_for(units * kG, kGemvThreads), kGemvThreads, 0,
                            stream(), route, x.data(), g, gs, u, us, gc, as<TG>(shared_expert_gate),
                            H, Is, shared_act.data(), logit.data());
        };
        const bool short_units = shared_units_short<e4m3_bits>(H);
        if (shared_expert_gate.dtype == DType::kBF16) {
          if (short_units)
            launch(bf16_bits{}, std::integral_constant<int, 8>{});
          else
            launch(bf16_bits{}, std::integral_constant<int, kWarp>{});
        } else {
          if (short_units)
            launch(float{}, std::integral_constant<int, 8>{});
          else
            launch(float{}, std::integral_constant<int, kWarp>{});
        }
      } else {
        auto launch = [&](auto t, auto lanes) {
          using T = decltype(t);
          constexpr int kG = decltype(lanes)::value;
          launch_overlapped(route_shared_gate_up_kernel<kPer, T, kG, kS>,
                            route.blocks + grid_for(units * kG, kGemvThreads), kGemvThreads, 0,
                            stream(), route, x.data(), as<T>(shared_gate), as<T>(shared_up),
                            as<T>(shared_expert_gate), H, Is, shared_act.data(), logit.data());
        };
        if (dtype == DType::kBF16) {
          if (shared_units_short<bf16_bits>(H))
            launch(bf16_bits{}, std::integral_constant<int, 8>{});
          else
            launch(bf16_bits{}, std::integral_constant<int, kWarp>{});
        } else {
          if (shared_units_short<float>(H))
            launch(float{}, std::integral_constant<int, 8>{});
          else
            launch(float{}, std::integral_constant<int, kWarp>{});
        }
      }
    });
  });
  if (!launched(kOp)) return;

  // One token of FP8 experts and an FP8 shared expert as wide as they: the routed gate/up, then
  // the routed down, the shared down and the combine in one kernel.
  const int down_combine_cols =
      static_cast<int>(kDownCombineItems * kDownCombineGroups / (top_k + 1));
  const std::size_t stage_bytes =
      static_cast<std::size_t>(top_k + 1) *
      static_cast<std::size_t>(
          StagedX<WeightChunk<e4m3_bits, true>::kN, kFp8DownLanes>::token_words(I / 16)) *
      sizeof(float4);
  const bool one_tail = S == 1 && fp8 && fp8_matrix(down) && Is == I &&
                        I <= std::int64_t{kFp8DownLanes} * kFp8DownLoads * 16 &&
                        vec_ok<e4m3_bits>(act.data(), down.data, I) && down_combine_cols >= 1 &&
                        stage_bytes <= kMaxStagedXBytes &&
                        env_flag_default_on("FLASHSERVE_CUDA_MOE_DOWN_COMBINE");
  if (one_tail) {
    // 3. The routed experts' gate/up (moe_experts' kernel).
    if (!moe_token_parts(kOp, x, gate_up, down, experts, 0.0f, act, part, /*with_down=*/false))
      return;
    // 4. The routed down, the shared down and the combine.
    const DownCombineArgs args{
        .act = act.data(),
        .down = as<e4m3_bits>(down),
        .down_scales = reinterpret_cast<const float*>(down.scales.data),
        .shared_act = shared_act.data(),
        .shared_down = as<e4m3_bits>(shared_down),
        .shared_scales = reinterpret_cast<const float*>(shared_down.scales.data),
        .shared_grid_cols = shared_down.scales.grid_cols(Is),
        .ids = experts.data_as<std::int32_t>(),
        .weights = weights.data(),
        .logit = logit.data(),
        .k = static_cast<int>(top_k),
        .E = E,
        .H = H,
        .I = I,
        .cols = down_combine_cols,
        .y = y_out != nullptr ? y.data() : nullptr,
        .streams = streams};
    const auto blocks = static_cast<unsigned>((H + down_combine_cols - 1) / down_combine_cols);
    if (into != nullptr)
      launch_overlapped(routed_down_combine_fp8_kernel<true>, blocks, kGemvThreads, stage_bytes,
                        stream(), args);
    else
      launch_overlapped(routed_down_combine_fp8_kernel<false>, blocks, kGemvThreads, stage_bytes,
                        stream(), args);
    launched(kOp);
    return;
  }

  // 3-4. The routed experts' gate/up and down (moe_experts' kernels).
  if (!moe_token_parts(kOp, x, gate_up, down, experts, 0.0f, act, part)) return;

  // 5. The shared down, accumulated into the routed combine.
  const RoutedCombine routed{part.data(), experts.data_as<std::int32_t>(), weights.data(),
                             static_cast<int>(top_k), E};
  auto down_combine = [&](auto t, auto tokens) {
    using T = decltype(t);
    constexpr int kS = decltype(tokens)::value;
    const auto launch = [&](auto lanes, auto to_streams) {
      launch_shared_down_combine<T, kS, decltype(lanes)::value, decltype(to_streams)::value>(
          shared_act.data(), shared_down, H, Is, logit.data(), routed,
          y_out != nullptr ? y.data() : nullptr, streams, stream());
    };
    const auto by_output = [&](auto lanes) {
      if (into != nullptr)
        launch(lanes, std::true_type{});
      else
        launch(lanes, std::false_type{});
    };
    if (gemv_short_rows(down_chunks))
      by_output(std::integral_constant<int, 8>{});
    else
      by_output(std::integral_constant<int, kWarp>{});
  };
  with_count<kBlockTokens>(S, [&](auto tokens) {
    if (dtype == DType::kF8E4M3)
      down_combine(e4m3_bits{}, tokens);
    else if (dtype == DType::kBF16)
      down_combine(bf16_bits{}, tokens);
    else
      down_combine(float{}, tokens);
  });
  launched(kOp);
}

}  // namespace fs::cuda
