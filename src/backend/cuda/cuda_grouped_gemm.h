// Prefill's products on the tensor cores (cuda_grouped_gemm.cu): the routed experts grouped by
// expert, and the dense layers' products.
//
// Past four tokens an expert is picked by many tokens (~10 a layer at 512 tokens, ~320 at 16k),
// so its weights are read once for up to kGroupedRows of them instead of once a (token, expert)
// pair:
//  1. sort_pairs_by_expert: the S x k pairs in order of expert (a counting sort on the device),
//     and a table of tiles, each up to kGroupedRows pairs of one expert;
//  2. grouped_gate_up: act[p] = swiglu(gate_up[e] . x[p / k]) for each tile's pairs;
//  3. grouped_down: part[p] = down[e] . act[p];
// then the combine in the CPU's order (cuda_moe.cu). The products take x (or act) as two bf16
// parts, hi = bf16(v) and lo = bf16(v - hi), against weights that bf16 holds exactly (bf16, or
// the e4m3 values, with FP8's 128x128 block scales applied per block of 128 columns to f32
// partial sums): each product is exact in the f32 accumulator and v is kept to ~2^-17 of itself,
// so the result sits within ~1e-5 of an f32 product (prefill need not match the decode kernels'
// bits; the op tests bound it against the CPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fs {
struct Weight;
}

namespace fs::cuda {

// Pairs a tile multiplies at most (the M of its product): 64, or 32 where the experts average
// few pairs (a short prefill: ~10 an expert at 512 tokens of Qwen's top-10 of 512), so fewer of a
// tile's rows are padding.
constexpr int kGroupedRows = 64;
constexpr int kGroupedRowsSmall = 32;
constexpr std::int64_t kSmallTileMaxPairs = 32;  // pairs an expert on average, at most

// Experts the sort takes at most (3 ints an expert in shared memory).
constexpr std::int64_t kMaxGroupedExperts = 4096;

// The tile rows for P pairs over E experts (FLASHSERVE_CUDA_GROUPED_ROWS=32 or 64 overrides).
int grouped_tile_rows(std::int64_t P, std::int64_t E);

// The weights a grouped product reads.
enum class GroupedWeights {
  kBf16,       // [E, rows, K] bf16
  kFp8Scaled,  // [E, rows, K] e4m3 with f32 scales [E, ceil(rows/128), ceil(K/128)]
};

// int32 words of the work buffer for P pairs over E experts in tiles of tile_rows: the tile count,
// the tile table (expert, first sorted pair, pairs) and the sorted pairs.
std::int64_t grouped_work_words(std::int64_t P, std::int64_t E, int tile_rows);
// Whether a grid holds the most tiles P pairs over E experts can make (its second dimension).
bool grouped_tiles_fit(std::int64_t P, std::int64_t E, int tile_rows);

// Whether the grouped products take these widths and buffers (16-byte rows of x, act and the
// weights; E small enough for the sort's shared memory).
bool grouped_products_take(GroupedWeights w, std::int64_t H, std::int64_t I, std::int64_t E,
                           const void* x, const void* gate_up, const void* down);

// ids [P] (pair p = token p / k, its j-th pick; ids outside [0, E) are left out: their act and
// part rows are not written, and the combine skips them) -> work. Overlapped launch.
cudaError_t sort_pairs_by_expert(const std::int32_t* ids, std::int64_t P, std::int64_t E,
                                 int tile_rows, std::int32_t* work, cudaStream_t stream);

// act [P, I] for the sorted pairs: act[p, r] = swiglu(gate_up[e] row r . x[p / k],
// gate_up[e] row I + r . x[p / k]) (clamped at `limit` when > 0), x [S, H].
cudaError_t grouped_gate_up(const float* x, std::int64_t k, const void* gate_up,
                            const float* scales, GroupedWeights wt, std::int64_t E, std::int64_t H,
                            std::int64_t I, float limit, const std::int32_t* work, std::int64_t P,
                            int tile_rows, float* act, cudaStream_t stream);

// part [P, H] for the sorted pairs: part[p, c] = down[e] row c . act[p].
cudaError_t grouped_down(const float* act, const void* down, const float* scales, GroupedWeights wt,
                         std::int64_t E, std::int64_t H, std::int64_t I, const std::int32_t* work,
                         std::int64_t P, int tile_rows, float* part, cudaStream_t stream);

// The same products for a dense layer's prefill (linear, S > kGemvRows): y [S, out] = x [S, in]
// . w[out, in]^T, tiles of 64 rows of x in order (no sort), w bf16 or block-scaled FP8.
bool dense_product_takes(GroupedWeights w, std::int64_t S, std::int64_t in, const void* x,
                         const void* weights);
// Whether a grid holds the tiles of S rows.
bool dense_rows_fit(std::int64_t S);
// Narrow products (the hyper-connections' [324, 10240] at 512 tokens made 24 tiles for an H200's
// 132 multiprocessors) cut K into `splits` ranges of k_chunk columns (a multiple of 128, so FP8's
// blocks stay whole), each summed into its own slice of `partials` [splits, S, out], then added in
// order: deterministic. splits 1: no cut (enough tiles, or FLASHSERVE_CUDA_PREFILL_SPLIT_K=0).
struct DenseSplit {
  int splits = 1;
  std::int64_t k_chunk = 0;
};
constexpr std::int64_t kMaxKSplits = 16;
DenseSplit dense_product_split(std::int64_t S, std::int64_t in, std::int64_t out);
// partials: splits * S * out floats when split.splits > 1 (else unused).
cudaError_t dense_product(const float* x, std::int64_t S, const void* w, const float* scales,
                          GroupedWeights wt, std::int64_t in, std::int64_t out, float* y,
                          cudaStream_t stream, DenseSplit split = {}, float* partials = nullptr);
// y [n] = the sum of partials [splits, n] over the splits, in order.
cudaError_t add_splits(const float* partials, int splits, std::int64_t n, float* y,
                       cudaStream_t stream);

// The same products on packed weights (cuda_grouped_packed.cu: FP4 E2M1 + E8M0 and the GGUF
// block types the decode kernels read), each tile's weights decoded from their blocks into
// shared memory: the tensor cores multiply x by each 16-weight group's small exact values and the
// group's factors scale the result (the formats' `factors`), so no weight is rounded to bf16.
// `codebook` is IQ2_XXS's grid on the device (null for the other formats). gate_up and down may
// be in different formats.
// Whether they take w (its format decoded, rows of whole float4s of x) and x (16-byte aligned);
// a dense product also needs dense_rows_fit.
bool packed_products_take(const Weight& w, const void* x);
// The tile rows packed products run at, for `wanted` (grouped_tile_rows): 64-row tiles take ~110
// KB of shared memory, which GPUs of 99 KB a block (Ada, the RTX Blackwells) cannot give; they get
// 32-row tiles (~76 KB), the same sums.
int packed_tile_rows(int wanted);
cudaError_t grouped_gate_up_packed(const float* x, std::int64_t k, const Weight& gate_up,
                                   const std::uint8_t* codebook, std::int64_t E, std::int64_t H,
                                   std::int64_t I, float limit, const std::int32_t* work,
                                   std::int64_t P, int tile_rows, float* act, cudaStream_t stream);
cudaError_t grouped_down_packed(const float* act, const Weight& down, const std::uint8_t* codebook,
                                std::int64_t E, std::int64_t H, std::int64_t I,
                                const std::int32_t* work, std::int64_t P, int tile_rows,
                                float* part, cudaStream_t stream);
cudaError_t dense_product_packed(const float* x, std::int64_t S, const Weight& w,
                                 const std::uint8_t* codebook, float* y, cudaStream_t stream,
                                 DenseSplit split = {}, float* partials = nullptr);

}  // namespace fs::cuda
