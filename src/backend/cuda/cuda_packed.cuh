// Host-side helpers for the packed formats' kernels (cuda_linear_packed.cu, cuda_moe_packed.cu):
// which formats the kernels decode, and the lanes a row takes.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_switches.h"
#include "backend/weight.h"

namespace fs::cuda::packed {

// Calls f(F{}) with F the device decoder of w's packed format; false when the kernels have none.
template <typename Fn>
bool with_format(const Weight& w, Fn&& f) {
  if (!w.is_packed()) return false;
  switch (*w.packed) {
    case quant::QuantType::kF4E2M1x2:
      f(Fp4{});
      return true;
    case quant::QuantType::kQ8_0:
      f(Q8_0{});
      return true;
    case quant::QuantType::kQ2_K:
      f(Q2_K{});
      return true;
    case quant::QuantType::kQ4_K:
      f(Q4_K{});
      return true;
    case quant::QuantType::kQ5_K:
      f(Q5_K{});
      return true;
    case quant::QuantType::kQ6_K:
      f(Q6_K{});
      return true;
    case quant::QuantType::kIQ2_XXS:
      f(IQ2_XXS{});
      return true;
    default:
      return false;
  }
}

// Whether w's format has a device decoder and its rows are whole chunks (FP4 rows must be whole
// 32-weight scale blocks; the GGUF types' rows are whole blocks already).
inline bool decodable(const Weight& w) {
  bool whole = false;
  const bool known = with_format(w, [&](auto f) {
    using F = decltype(f);
    whole = F::chunks(w.cols()) * F::kChunk == w.cols();
  });
  return known && whole;
}

// The side data a format's rows read (the decoders' `load` argument): FP4's E8M0 scales, one
// byte per 32 inputs a row; IQ2_XXS's codebook (`iq2_grid`), the same for every row; none for the
// other GGUF types.
struct SideData {
  const std::uint8_t* base = nullptr;
  std::int64_t row_bytes = 0;
};
inline SideData side_data(const Weight& w, const std::uint8_t* iq2_grid) {
  if (w.storage() == quant::QuantType::kIQ2_XXS) return {iq2_grid, 0};
  if (w.block_scaled()) return {w.scales.data, w.scales.grid_cols(w.cols())};
  return {};
}

// Matrix e's rows of a packed weight ([rows, in], or stacked [E, rows, in]) and their side data
// (SideData: FP4's scale rows, IQ2_XXS's codebook, whose row_bytes are 0).
struct Rows {
  const std::uint8_t* data;
  const std::uint8_t* side;
  std::int64_t rows, row_bytes, side_row_bytes;
  __device__ __forceinline__ const std::uint8_t* row(std::int64_t e, std::int64_t r) const {
    return data + (e * rows + r) * row_bytes;
  }
  __device__ __forceinline__ const std::uint8_t* side_row(std::int64_t e, std::int64_t r) const {
    return side != nullptr ? side + (e * rows + r) * side_row_bytes : nullptr;
  }
};
inline Rows rows_of(const Weight& w, const std::uint8_t* iq2_grid) {
  const auto side = side_data(w, iq2_grid);
  const std::int64_t rows = w.shape.size() == 3 ? w.shape[1] : w.rows();
  return {w.data, side.base, rows, static_cast<std::int64_t>(w.row_bytes()), side.row_bytes};
}

// Rows of at least a warp's worth of chunks take a warp, shorter ones 8 lanes. A packed chunk
// (32-64 weights decoded in registers) is several times the instructions of a 16-byte FP8 or
// bf16 chunk, so a row spreads over a warp sooner than gemv_short_rows' 4 chunks a lane
// (session 22; FLASHSERVE_CUDA_PACKED_WIDE=0: that rule, as before).
inline bool short_rows(std::int64_t chunks) {
  const bool wide = env_flag_default_on("FLASHSERVE_CUDA_PACKED_WIDE");
  return chunks < (wide ? kWarp : 4 * kWarp);
}

// One-token GEMVs of rows a warp covers in at most four rounds, and one token's routed gate/up,
// as rows streamed through resident warps (packed_gemv_stream_kernel,
// moe_gate_up_packed_stream_kernel; session 32, docs/GPU.md step 21).
// FLASHSERVE_CUDA_PACKED_STREAM=0: every warp takes one row (packed_gemv_kernel,
// moe_gate_up_packed_kernel). The same bits either way.
inline bool stream_rows_enabled() {
  return env_flag_default_on("FLASHSERVE_CUDA_PACKED_STREAM");
}
// The routed gate/up's streamed items for an MTP verify's 2-4 tokens too (session 37);
// FLASHSERVE_CUDA_PACKED_STREAM_TOKENS=0: one row a warp there, as before.
inline bool stream_tokens_enabled() {
  return env_flag_default_on("FLASHSERVE_CUDA_PACKED_STREAM_TOKENS");
}
// One token's rows of 40 chunks (Q4_K at 2,560 columns, the 32-weight formats at 1,280; not Q5_K
// and Q6_K, whose decoding would spill), whose last round fills a quarter of a warp's lanes,
// share that round: 2 or 3 rows of a GEMV (packed_gemv_tail_kernel), an item's gate and up row
// (moe_gate_up_packed_tail_kernel); session 33. FLASHSERVE_CUDA_PACKED_TAIL=0: a row a warp at a
// time (packed_gemv_stream_kernel, moe_gate_up_packed_stream_kernel). The same bits either way.
inline bool shared_tail_enabled() {
  return env_flag_default_on("FLASHSERVE_CUDA_PACKED_TAIL");
}
// The formats whose decoding fits the shared-last-round kernels at two blocks a multiprocessor.
template <typename F>
inline constexpr bool kSharedTailFits = !std::is_same_v<F, Q5_K> && !std::is_same_v<F, Q6_K>;
// Whether one token's rows of `chunks` chunks take them: a round and a quarter, the switch read
// only then.
inline bool shared_tail_takes(std::int64_t chunks) {
  return chunks == kWarp + kWarp / 4 && shared_tail_enabled();
}
// The rows that share it: 2 (3 rounds for 2 rows instead of 4), or 3 with
// FLASHSERVE_CUDA_PACKED_TAIL_ROWS=3 (4 rounds for 3 rows, at the cost of a spill in Q4_K).
inline int shared_tail_rows() {
  const char* v = std::getenv("FLASHSERVE_CUDA_PACKED_TAIL_ROWS");
  return v != nullptr && std::atoi(v) == 3 ? 3 : 2;
}
// The shared-last-round schedule (session 33) of rows of kFull * 32 + kTail chunks taken kP at a
// time by one warp: round q < kP * kFull is row q / kFull's chunk lane + 32 (q % kFull) on every
// lane, and the last round row lane / kTail's chunk kFull * 32 + lane % kTail on the first
// kP * kTail lanes. A row of one round and a quarter (Q4_K at 2,560 columns) then takes 1.5 rounds
// at kP 2 instead of 2: one row a warp leaves 24 of 32 lanes idle in its last round.
template <int kFull, int kTail, int kP>
struct SharedTail {
  static_assert(kFull >= 1 && kTail > 0 && kP * kTail <= kWarp);
  static constexpr int kRounds = kP * kFull + 1;
  __device__ __forceinline__ static int row(int q, int lane) {
    return q < kRounds - 1 ? q / kFull : lane / kTail;
  }
  __device__ __forceinline__ static std::int64_t chunk(int q, int lane) {
    return q < kRounds - 1 ? lane + static_cast<std::int64_t>(q % kFull) * kWarp
                           : static_cast<std::int64_t>(kFull) * kWarp + lane % kTail;
  }
  __device__ __forceinline__ static bool live(int q, int lane) {
    return q < kRounds - 1 || lane < kP * kTail;
  }
};

// The kP row sums of one group whose rounds are in raw (SharedTail's order), with x staged
// (stage_packed_x, kG 32; from staged_base on), each round's buffer handed to refill(q) as soon as
// it is decoded. The bits are one row a warp's (packed_rows_dot, kG 32): lane l's sum of a row is
// a chain of fused multiply-adds over chunks l, l + 32, ... (packed_chunk_dot), so the chain is
// carried to the lane that decodes the row's last chunk (a shuffle) and back, and the warp then
// adds the same 32 values in the same tree. The whole warp must call it.
template <typename F, int kFull, int kTail, int kP, typename Refill>
__device__ __forceinline__ void shared_tail_sums(
    const typename F::Raw (&raw)[SharedTail<kFull, kTail, kP>::kRounds], int lane, const float* x,
    std::int64_t staged_tw, Refill&& refill, float (&sums)[kP], std::int64_t staged_base = 0) {
  using T = SharedTail<kFull, kTail, kP>;
  constexpr int kLast = T::kRounds - 1;
  float acc[kP][1] = {};
#pragma unroll
  for (int q = 0; q < kLast; ++q) {
    packed_chunk_dot<F, 1, kWarp, true>(raw[q], T::chunk(q, lane), x, 0, staged_tw, acc[q / kFull],
                                        staged_base);
    refill(q);
  }
  float tail[1] = {0.0f};
#pragma unroll
  for (int j = 0; j < kP; ++j) {
    const float v = __shfl_sync(0xffffffffu, acc[j][0], lane % kTail);
    if (lane / kTail == j) tail[0] = v;
  }
  if (T::live(kLast, lane))
    packed_chunk_dot<F, 1, kWarp, true>(raw[kLast], T::chunk(kLast, lane), x, 0, staged_tw, tail,
                                        staged_base);
  refill(kLast);
#pragma unroll
  for (int j = 0; j < kP; ++j) {
    const float v = __shfl_sync(0xffffffffu, tail[0], j * kTail + lane % kTail);
    sums[j] = group_sum<kWarp>(lane < kTail ? v : acc[j][0]);
  }
}

// Blocks of 256 a multiprocessor must hold for the streamed rows (16 warps: fewer hide too little
// of each row's round trip); a kernel whose registers allow fewer is not streamed.
inline constexpr std::int64_t kStreamMinBlocks = 2;

}  // namespace fs::cuda::packed
