// The chunked (WY / UT-transform) form of the gated delta rule, for a scalar (GDN) or per-key-
// channel (KDA) log decay: gated_delta_rule_chunked from 16 tokens (cuda_backend.h). The math
// is the CPU's (cpu_sequence.cpp). Per chunk of 64 tokens counted from the call's first token,
// with G the in-chunk cumulative log decay (per key channel; a scalar decay is the same value in
// every channel):
//   A[i][j] = beta_i sum_x k_i[x] k_j[x] exp(G_i[x] - G_j[x]) for j < i;  T = (I + A)^-1
//   QK[i][j] = sum_x q_i[x] k_j[x] exp(G_i[x] - G_j[x]) for j <= i, else 0
//   W = T (beta k o exp(G)),  U = T (beta v)
//   Vn = U - W S;  O = (q o exp(G)) S + QK Vn
//   S <- diag(exp(G_last)) S + (k o exp(G_last - G))^T Vn
// Two kernels per segment of at most 16 chunks (which bounds the scratch: 150 MB at 64 heads):
// - chunk_prepare_kernel, a block per (chunk, value head), every chunk of the segment at once:
//   the in-chunk products, T by blocks of 16, and the chunk's W, U, QK, Qe = q o exp(G),
//   Kd = k o exp(G_last - G) and exp(G_last) into scratch;
// - chunk_state_kernel, a block per (value head, 16 or 32 state columns), walks the chunks in
//   order with its slice of the state in shared memory: Vn, the outputs, the state update.
// A scalar decay factors out of the dot products; a per-channel one does not, and splitting
// exp(G_i - G_j) into exp(G_i) exp(-G_j) would overflow (G falls to -320 over a chunk at GLM's
// bound of -5 per token). So, as on the CPU, rows are taken in sub-chunks of 16 relative to the
// sub-chunk's first row r: for j < r, exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j), both
// factors <= 1, one product per sub-chunk; pairs inside a sub-chunk take exp(G_i - G_j) as it
// is. No positive exponent is formed for a log decay <= 0. The products run on the tensor cores
// as 3xTF32 (fp32 in precision, see below): the state stays fp32 and within the CPU parity's
// tolerance (a single TF32 product is not: 4e-4 on the state).
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

constexpr int kChunk = 64;          // tokens per chunk (the reference's chunk_size)
constexpr int kSub = 16;            // rows per sub-chunk and per block of T's inverse
constexpr int kThreads = 256;       // both kernels; the inverse's 16 x 16 steps assume it
constexpr int kMaxHead = 128;       // dk, dv
constexpr int kSegmentChunks = 16;  // chunks per pair of launches (1024 tokens)
// Row strides in shared memory: multiples of 4 floats (the tensor-core loads), 4 mod 32 so that
// rows fall on different banks.
constexpr int kLdA = kChunk + 4;                                // the 64 x 64 tiles
__host__ __device__ constexpr int row_stride(int dk, int dv) {  // the [64][dk or dv] rows
  return (dk > dv ? dk : dv) + 4;
}

// The products on the tensor cores: 16 x 16 x 8 TF32 tiles (WMMA), each operand split as
// x = hi + lo with both parts rounded to TF32, and hi*lo + lo*hi + hi*hi accumulated in fp32
// ("3xTF32": the dropped lo*lo term is below fp32's rounding), so the state keeps fp32
// precision. Fragments are loaded from shared memory or straight from scratch (global memory,
// L2 resident); every pointer is 32-byte aligned and every leading dimension a multiple of 4
// floats. A warp computes whole tiles, so a tile loop is per warp and needs no block barrier
// between loading and storing a tile it owns.
namespace wm = nvcuda::wmma;
using FragA = wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, wm::row_major>;
using FragAt = wm::fragment<wm::matrix_a, 16, 16, 8, wm::precision::tf32, wm::col_major>;
using FragB = wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, wm::row_major>;
using FragBt = wm::fragment<wm::matrix_b, 16, 16, 8, wm::precision::tf32, wm::col_major>;
using FragC = wm::fragment<wm::accumulator, 16, 16, 8, float>;
constexpr int kWarps = kThreads / kWarp;

// f <- sign * f rounded to TF32 (hi), lo <- the rest rounded to TF32.
template <typename Frag>
__device__ __forceinline__ void split_tf32(Frag& f, Frag& lo, float sign) {
  for (int i = 0; i < f.num_elements; ++i) {
    const float x = sign * f.x[i];
    const float hi = wm::__float_to_tf32(x);
    f.x[i] = hi;
    lo.x[i] = wm::__float_to_tf32(x - hi);
  }
}

// c += sign * A B for one 16 x 16 tile over K (a multiple of 8), a and b at the tile's origin:
// A(m, p) = a[m*lda + p] (FragA) or a[m + p*lda] (FragAt, a transposed operand); B(p, n) =
// b[p*ldb + n] (FragB) or b[p + n*ldb] (FragBt).
template <typename FragAType, typename FragBType>
__device__ __forceinline__ void mma_3xtf32(FragC& c, const float* a, unsigned lda, const float* b,
                                           unsigned ldb, int K, float sign) {
  constexpr bool kAt = std::is_same_v<FragAType, FragAt>, kBt = std::is_same_v<FragBType, FragBt>;
  for (int p = 0; p < K; p += 8) {
    FragAType ah, al;
    FragBType bh, bl;
    wm::load_matrix_sync(ah, a + (kAt ? p * lda : p), lda);
    wm::load_matrix_sync(bh, b + (kBt ? p : p * ldb), ldb);
    split_tf32(ah, al, sign);
    split_tf32(bh, bl, 1.0f);
    wm::mma_sync(c, ah, bl, c);
    wm::mma_sync(c, al, bh, c);
    wm::mma_sync(c, ah, bh, c);
  }
}

// T = (I + A)^-1 for the unit lower-triangular I + A (A strictly lower, [64][kLdA]; its diagonal
// and upper part are not read), by blocks of 16: the four diagonal blocks by forward
// substitution (a thread per column), then block (I, J) for I - J = 1, 2, 3 from
// T_IJ = -T_II sum over J <= K < I of A_IK T_KJ. X is [16][17] scratch. Needs 256 threads.
__device__ void unit_lower_inverse(const float* A, float* T, float* X) {
  const int tid = threadIdx.x;
  for (int i = tid; i < kChunk * kLdA; i += blockDim.x) T[i] = 0.0f;
  __syncthreads();
  if (tid < kChunk) {
    const int base = tid / kSub * kSub, col = tid % kSub;
    float t[kSub];
#pragma unroll
    for (int r = 0; r < kSub; ++r) {
      float s = r == col ? 1.0f : 0.0f;
      if (r > col) {
#pragma unroll
        for (int m = 0; m < r; ++m)
          if (m >= col) s = fmaf(-A[(base + r) * kLdA + base + m], t[m], s);
      }
      t[r] = s;
      T[(base + r) * kLdA + base + col] = s;
    }
  }
  __syncthreads();
  const int r = tid / kSub, c = tid % kSub;
  for (int d = 1; d < kChunk / kSub; ++d) {
    for (int I = d; I < kChunk / kSub; ++I) {
      const int J = I - d;
      float s = 0.0f;
      for (int K = J; K < I; ++K)
        for (int m = 0; m < kSub; ++m)
          s = fmaf(A[(I * kSub + r) * kLdA + K * kSub + m], T[(K * kSub + m) * kLdA + J * kSub + c],
                   s);
      X[r * (kSub + 1) + c] = s;
      __syncthreads();
      float t = 0.0f;
      for (int m = 0; m < kSub; ++m)
        t = fmaf(T[(I * kSub + r) * kLdA + I * kSub + m], X[m * (kSub + 1) + c], t);
      T[(I * kSub + r) * kLdA + J * kSub + c] = -t;
      __syncthreads();
    }
  }
}

// Per (chunk, value head) outputs, each block of scratch [chunks * Hv] tiles (b = chunk*Hv + h).
struct ChunkScratch {
  float* W;   // [64][dk]
  float* U;   // [64][dv]
  float* QK;  // [64][64]
  float* Qe;  // [64][dk]: q o exp(G)
  float* Kd;  // [64][dk]: k o exp(G_last - G)
  float* EG;  // [dk]: exp(G_last)
};

std::int64_t scratch_floats(std::int64_t tiles, std::int64_t dk, std::int64_t dv) {
  return tiles * (kChunk * (3 * dk + dv + kChunk) + dk);
}

ChunkScratch scratch_views(float* base, std::int64_t tiles, std::int64_t dk, std::int64_t dv) {
  ChunkScratch s;
  s.W = base;
  s.U = s.W + tiles * kChunk * dk;
  s.QK = s.U + tiles * kChunk * dv;
  s.Qe = s.QK + tiles * kChunk * kChunk;
  s.Kd = s.Qe + tiles * kChunk * dk;
  s.EG = s.Kd + tiles * kChunk * dk;
  return s;
}

// The first kernel's shared memory, in floats: K, Q (then beta v), G (per channel: [64][ld],
// scalar: [64]), the factor rows of a sub-chunk (per channel), A, T, QK, X, beta.
std::int64_t prepare_smem_floats(bool per_channel, std::int64_t ld) {
  return 2 * kChunk * ld + (per_channel ? kChunk * ld + (kChunk + 2 * kSub) * ld : kChunk) +
         3 * kChunk * kLdA + kSub * (kSub + 1) + kChunk;
}

// The chunk's tokens are rows t0 .. t0+C-1 of the call; rows C..63 are zero (k, q, v, beta and
// g), as the reference pads the last chunk, so they add nothing and G_63 = G_{C-1}.
template <bool kPerChannel>
__global__ void __launch_bounds__(kThreads)
    chunk_prepare_kernel(const float* q, const float* k, const float* v, const float* g,
                         const float* beta, std::int64_t S, std::int64_t Hv, int dk, int dv,
                         std::int64_t rep, std::int64_t qk_stride, ChunkScratch sc) {
  extern __shared__ __align__(32) float smem[];
  const int tid = threadIdx.x, warp = tid / kWarp;
  const int chunk = blockIdx.x;
  const std::int64_t h = blockIdx.y, kh = h / rep, t0 = static_cast<std::int64_t>(chunk) * kChunk;
  const int C = static_cast<int>(S - t0 < kChunk ? S - t0 : kChunk);
  const std::int64_t b = static_cast<std::int64_t>(chunk) * Hv + h;
  const std::int64_t v_stride = Hv * dv, g_stride = kPerChannel ? Hv * dk : Hv;
  const int ld = row_stride(dk, dv);
  float* Ks = smem;                                      // [64][ld]
  float* Qs = Ks + kChunk * ld;                          // [64][ld]: q, then beta v
  float* Gs = Qs + kChunk * ld;                          // [64][ld] per channel, [64] scalar
  float* F = Gs + (kPerChannel ? kChunk * ld : kChunk);  // [r + 32][ld], per channel
  float* A = F + (kPerChannel ? (kChunk + 2 * kSub) * ld : 0);
  float* T = A + kChunk * kLdA;
  float* QKs = T + kChunk * kLdA;
  float* X = QKs + kChunk * kLdA;
  float* bs = X + kSub * (kSub + 1);
  auto G = [&](int i, int x) { return kPerChannel ? Gs[i * ld + x] : Gs[i]; };

  for (int e = tid; e < kChunk * dk; e += blockDim.x) {
    const int i = e / dk, x = e % dk;
    const bool in = i < C;
    const std::int64_t t = t0 + i;
    Ks[i * ld + x] = in ? k[t * qk_stride + kh * dk + x] : 0.0f;
    Qs[i * ld + x] = in ? q[t * qk_stride + kh * dk + x] : 0.0f;
    if constexpr (kPerChannel) Gs[i * ld + x] = in ? g[t * g_stride + h * dk + x] : 0.0f;
  }
  for (int i = tid; i < kChunk; i += blockDim.x) {
    bs[i] = i < C ? beta[(t0 + i) * Hv + h] : 0.0f;
    if constexpr (!kPerChannel) Gs[i] = i < C ? g[(t0 + i) * g_stride + h] : 0.0f;
  }
  for (int e = tid; e < kChunk * kLdA; e += blockDim.x) A[e] = QKs[e] = 0.0f;
  __syncthreads();
  // G: the cumulative sum down each channel (rows in order, as the CPU sums them).
  if constexpr (kPerChannel) {
    for (int x = tid; x < dk; x += blockDim.x) {
      float acc = 0.0f;
      for (int i = 0; i < kChunk; ++i) Gs[i * ld + x] = acc += Gs[i * ld + x];
    }
  } else if (tid == 0) {
    float acc = 0.0f;
    for (int i = 0; i < kChunk; ++i) Gs[i] = acc += Gs[i];
  }
  __syncthreads();
  // The chunk's reads of the state: Qe, Kd and exp(G_last).
  for (int e = tid; e < kChunk * dk; e += blockDim.x) {
    const int i = e / dk, x = e % dk;
    const float gi = G(i, x), gl = G(kChunk - 1, x);
    sc.Qe[b * kChunk * dk + e] = Qs[i * ld + x] * expf(gi);
    sc.Kd[b * kChunk * dk + e] = Ks[i * ld + x] * expf(gl - gi);
    if (i == 0) sc.EG[b * dk + x] = expf(gl);
  }
  // A (times beta below) and QK.
  if constexpr (kPerChannel) {
    for (int r = kSub; r < C; r += kSub) {
      // F rows 0..r-1: k_j exp(G_r - G_j); r..r+15: beta_i k_i exp(G_i - G_r); r+16..r+31:
      // q_i exp(G_i - G_r). Then A and QK rows r..r+15, columns 0..r-1, in 16 x 16 tiles.
      for (int e = tid; e < (r + 2 * kSub) * dk; e += blockDim.x) {
        const int row = e / dk, x = e % dk;
        float f;
        if (row < r) {
          f = Ks[row * ld + x] * expf(G(r, x) - G(row, x));
        } else if (row < r + kSub) {
          const int i = row;
          f = bs[i] * Ks[i * ld + x] * expf(G(i, x) - G(r, x));
        } else {
          const int i = row - kSub;
          f = Qs[i * ld + x] * expf(G(i, x) - G(r, x));
        }
        F[row * ld + x] = f;
      }
      __syncthreads();
      const int col_tiles = r / kSub;
      for (int t = warp; t < 2 * col_tiles; t += kWarps) {
        const bool is_q = t >= col_tiles;
        const int n0 = t % col_tiles * kSub;
        FragC c;
        wm::fill_fragment(c, 0.0f);
        mma_3xtf32<FragA, FragBt>(c, F + (r + (is_q ? kSub : 0)) * ld, ld, F + n0 * ld, ld, dk,
                                  1.0f);
        wm::store_matrix_sync((is_q ? QKs : A) + r * kLdA + n0, c, kLdA, wm::mem_row_major);
      }
      __syncthreads();
    }
    // The pairs inside each sub-chunk, j <= i, a thread per pair, the sum over x in order.
    constexpr int kPairs = kSub * (kSub + 1) / 2;
    for (int p = tid; p < (kChunk / kSub) * kPairs; p += blockDim.x) {
      const int base = p / kPairs * kSub;
      int ii = 0, rest = p % kPairs;
      while (rest > ii) rest -= ++ii;
      const int i = base + ii, j = base + rest;
      if (i >= C) continue;
      float ka = 0.0f, qa = 0.0f;
      for (int x = 0; x < dk; ++x) {
        const float e = expf(G(i, x) - G(j, x)), kj = Ks[j * ld + x] * e;
        ka = fmaf(Ks[i * ld + x], kj, ka);
        qa = fmaf(Qs[i * ld + x], kj, qa);
      }
      if (j < i) A[i * kLdA + j] = bs[i] * ka;
      QKs[i * kLdA + j] = qa;
    }
  } else {
    // K K^T and Q K^T in 16 x 16 tiles, then the decay, beta and the masks.
    constexpr int kTiles = (kChunk / 16) * (kChunk / 16);
    for (int t = warp; t < 2 * kTiles; t += kWarps) {
      const bool is_q = t >= kTiles;
      const int m0 = t % kTiles / (kChunk / 16) * 16, n0 = t % (kChunk / 16) * 16;
      FragC c;
      wm::fill_fragment(c, 0.0f);
      mma_3xtf32<FragA, FragBt>(c, (is_q ? Qs : Ks) + m0 * ld, ld, Ks + n0 * ld, ld, dk, 1.0f);
      wm::store_matrix_sync((is_q ? QKs : A) + m0 * kLdA + n0, c, kLdA, wm::mem_row_major);
    }
    __syncthreads();
    for (int e = tid; e < kChunk * kChunk; e += blockDim.x) {
      const int m = e / kChunk, n = e % kChunk;
      const float decay = n <= m ? expf(Gs[m] - Gs[n]) : 0.0f;
      A[m * kLdA + n] = n < m ? bs[m] * A[m * kLdA + n] * decay : 0.0f;
      QKs[m * kLdA + n] *= decay;
    }
  }
  __syncthreads();
  unit_lower_inverse(A, T, X);
  // [beta k o exp(G) | beta v] in place of K and Q, then W and U.
  for (int e = tid; e < kChunk * dk; e += blockDim.x) {
    const int i = e / dk, x = e % dk;
    Ks[i * ld + x] *= bs[i] * expf(G(i, x));
  }
  for (int e = tid; e < kChunk * dv; e += blockDim.x) {
    const int i = e / dv, y = e % dv;
    Qs[i * ld + y] = i < C ? bs[i] * v[(t0 + i) * v_stride + h * dv + y] : 0.0f;
  }
  for (int e = tid; e < kChunk * kChunk; e += blockDim.x)
    sc.QK[b * kChunk * kChunk + e] = QKs[(e / kChunk) * kLdA + e % kChunk];
  __syncthreads();
  float* W = sc.W + b * kChunk * dk;
  float* U = sc.U + b * kChunk * dv;
  // W = T (beta k o exp(G)) and U = T (beta v), tiles stored straight to scratch.
  const int w_tiles = (kChunk / 16) * (dk / 16), u_tiles = (kChunk / 16) * (dv / 16);
  for (int t = warp; t < w_tiles + u_tiles; t += kWarps) {
    const bool is_u = t >= w_tiles;
    const int cols = is_u ? dv : dk, tt = is_u ? t - w_tiles : t;
    const int m0 = tt / (cols / 16) * 16, n0 = tt % (cols / 16) * 16;
    FragC c;
    wm::fill_fragment(c, 0.0f);
    mma_3xtf32<FragA, FragB>(c, T + m0 * kLdA, kLdA, (is_u ? Qs : Ks) + n0, ld, kChunk, 1.0f);
    wm::store_matrix_sync((is_u ? U : W) + m0 * cols + n0, c, static_cast<unsigned>(cols),
                          wm::mem_row_major);
  }
}

// The second kernel's shared memory, in floats: the state slice [dk][cols+4], Vn and the outputs
// [64][cols+4], exp(G_last).
std::int64_t state_smem_floats(std::int64_t dk, int cols) {
  return dk * (cols + 4) + 2 * kChunk * (cols + 4) + dk;
}

// Value head blockIdx.x, state columns n0 .. n0 + kCols - 1 (n0 = blockIdx.y * kCols), over the
// segment's chunks in order. Warp w computes 16 x 16 output tiles w, w + 8, ... of each product.
template <int kCols>
__global__ void __launch_bounds__(kThreads)
    chunk_state_kernel(ChunkScratch sc, std::int64_t S, std::int64_t Hv, int dk, int dv,
                       float* state, float* out) {
  extern __shared__ __align__(32) float smem[];
  constexpr int kLdS = kCols + 4, kColTiles = kCols / 16;
  const int tid = threadIdx.x, warp = tid / kWarp;
  const std::int64_t h = blockIdx.x;
  const int n0 = blockIdx.y * kCols;
  const std::int64_t o_stride = Hv * dv;
  float* Ss = smem;                // [dk][kLdS]
  float* Vn = Ss + dk * kLdS;      // [64][kLdS]
  float* Os = Vn + kChunk * kLdS;  // [64][kLdS]
  float* eg = Os + kChunk * kLdS;  // [dk]
  float* St = state + h * dk * dv;
  for (int e = tid; e < dk * kCols; e += blockDim.x)
    Ss[(e / kCols) * kLdS + e % kCols] = St[(e / kCols) * dv + n0 + e % kCols];
  __syncthreads();
  const std::int64_t chunks = (S + kChunk - 1) / kChunk;
  constexpr int kRowTiles = kChunk / 16;  // of Vn and O
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    const std::int64_t b = chunk * Hv + h, t0 = chunk * kChunk;
    const int C = static_cast<int>(S - t0 < kChunk ? S - t0 : kChunk);
    const float* W = sc.W + b * kChunk * dk;
    const float* U = sc.U + b * kChunk * dv + n0;
    const float* QK = sc.QK + b * kChunk * kChunk;
    const float* Qe = sc.Qe + b * kChunk * dk;
    const float* Kd = sc.Kd + b * kChunk * dk;
    for (int e = tid; e < dk; e += blockDim.x) eg[e] = sc.EG[b * dk + e];
    // Vn = U - W S.
    for (int t = warp; t < kRowTiles * kColTiles; t += kWarps) {
      const int m0 = t / kColTiles * 16, c0 = t % kColTiles * 16;
      FragC c;
      wm::load_matrix_sync(c, U + m0 * dv + c0, static_cast<unsigned>(dv), wm::mem_row_major);
      mma_3xtf32<FragA, FragB>(c, W + m0 * dk, static_cast<unsigned>(dk), Ss + c0, kLdS, dk, -1.0f);
      wm::store_matrix_sync(Vn + m0 * kLdS + c0, c, kLdS, wm::mem_row_major);
    }
    __syncthreads();
    // O = Qe S + QK Vn.
    for (int t = warp; t < kRowTiles * kColTiles; t += kWarps) {
      const int m0 = t / kColTiles * 16, c0 = t % kColTiles * 16;
      FragC c;
      wm::fill_fragment(c, 0.0f);
      mma_3xtf32<FragA, FragB>(c, Qe + m0 * dk, static_cast<unsigned>(dk), Ss + c0, kLdS, dk, 1.0f);
      mma_3xtf32<FragA, FragB>(c, QK + m0 * kChunk, kChunk, Vn + c0, kLdS, kChunk, 1.0f);
      wm::store_matrix_sync(Os + m0 * kLdS + c0, c, kLdS, wm::mem_row_major);
    }
    __syncthreads();
    for (int e = tid; e < kChunk * kCols; e += blockDim.x) {
      const int m = e / kCols, n = e % kCols;
      if (m < C) out[(t0 + m) * o_stride + h * dv + n0 + n] = Os[m * kLdS + n];
    }
    // S <- diag(exp(G_last)) S + Kd^T Vn: the decay first, in place, then the product.
    for (int e = tid; e < dk * kCols; e += blockDim.x) {
      const int x = e / kCols, n = e % kCols;
      Ss[x * kLdS + n] *= eg[x];
    }
    __syncthreads();
    for (int t = warp; t < (dk / 16) * kColTiles; t += kWarps) {
      const int x0 = t / kColTiles * 16, c0 = t % kColTiles * 16;
      FragC c;
      wm::load_matrix_sync(c, Ss + x0 * kLdS + c0, kLdS, wm::mem_row_major);
      mma_3xtf32<FragAt, FragB>(c, Kd + x0, static_cast<unsigned>(dk), Vn + c0, kLdS, kChunk, 1.0f);
      wm::store_matrix_sync(Ss + x0 * kLdS + c0, c, kLdS, wm::mem_row_major);
    }
    __syncthreads();
  }
  for (int e = tid; e < dk * kCols; e += blockDim.x)
    St[(e / kCols) * dv + n0 + e % kCols] = Ss[(e / kCols) * kLdS + e % kCols];
}

template <typename Kernel>
bool allow_smem(Kernel kernel, std::int64_t floats) {
  return raise_dynamic_shared(kernel, static_cast<std::size_t>(floats) * sizeof(float));
}

// The most shared memory each kernel of a decay's kind takes (heads of 128), reserved once per
// device, so that a call inside a stream capture makes no attribute calls. The per-channel
// prepare kernel takes 201 KB and the scalar one 119 KB: a GPU that cannot give them (A100: 163
// KB, the scalar one only; Ada and the RTX Blackwells: 99 KB, neither) runs the token-by-token
// kernel (delta_chunks_take).
bool reserve_smem(bool per_channel) {
  static OncePerDevice reserved_scalar, reserved_per_channel;
  return (per_channel ? reserved_per_channel : reserved_scalar).run([per_channel] {
    const std::int64_t ld = row_stride(kMaxHead, kMaxHead);
    const auto prepare = per_channel ? chunk_prepare_kernel<true> : chunk_prepare_kernel<false>;
    return allow_smem(prepare, prepare_smem_floats(per_channel, ld)) &&
           allow_smem(chunk_state_kernel<32>, state_smem_floats(kMaxHead, 32)) &&
           allow_smem(chunk_state_kernel<16>, state_smem_floats(kMaxHead, 16));
  });
}

}  // namespace

// Below 16 tokens the token-by-token kernel is as fast (a chunk costs two launches and a
// triangular inverse); heads over 128 do not fit the first kernel's shared memory, nor do the
// kernels fit every GPU's (reserve_smem).
bool CudaBackend::delta_chunks_take(std::int64_t S, std::int64_t dk, std::int64_t dv,
                                    bool per_channel) {
  return S >= 16 && dk % 16 == 0 && dv % 16 == 0 && dk <= kMaxHead && dv <= kMaxHead &&
         reserve_smem(per_channel);
}

void CudaBackend::delta_rule_chunks(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                    Tensor& state, Tensor& out) {
  constexpr const char* kOp = "gated_delta_rule_chunked";
  const auto S = k.rows(), Hv = beta.cols();
  const auto dk = k.cols() / key_heads, dv = v.cols() / Hv, rep = Hv / key_heads;
  const bool per_channel = g.cols() != Hv;
  const auto segment_chunks = std::min<std::int64_t>(kSegmentChunks, (S + kChunk - 1) / kChunk);
  Tensor& tmp = scratch(delta_chunks_);
  if (!ensure(tmp, {scratch_floats(segment_chunks * Hv, dk, dv)})) return;
  if (walking()) return;
  const auto sc = scratch_views(tmp.data(), segment_chunks * Hv, dk, dv);
  const std::int64_t ld = row_stride(static_cast<int>(dk), static_cast<int>(dv));
  const auto prep_floats = prepare_smem_floats(per_channel, ld);
  const int cols = dv % 32 == 0 ? 32 : 16;
  const auto state_floats = state_smem_floats(dk, cols);
  auto prepare = per_channel ? chunk_prepare_kernel<true> : chunk_prepare_kernel<false>;
  auto walk = cols == 32 ? chunk_state_kernel<32> : chunk_state_kernel<16>;
  if (!check(reserve_smem(per_channel), kOp, "cannot reserve the chunk kernels' shared memory"))
    return;
  const std::int64_t qk_stride = k.cols(), g_stride = g.cols();
  for (std::int64_t s0 = 0; s0 < S; s0 += segment_chunks * kChunk) {
    const auto n = std::min(segment_chunks * kChunk, S - s0);
    const auto chunks = (n + kChunk - 1) / kChunk;
    prepare<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(Hv)), kThreads,
              prep_floats * sizeof(float), stream()>>>(
        q.data() + s0 * qk_stride, k.data() + s0 * qk_stride, v.data() + s0 * v.cols(),
        g.data() + s0 * g_stride, beta.data() + s0 * Hv, n, Hv, static_cast<int>(dk),
        static_cast<int>(dv), rep, qk_stride, sc);
    if (!launched(kOp)) return;
    walk<<<dim3(static_cast<unsigned>(Hv), static_cast<unsigned>(dv / cols)), kThreads,
           state_floats * sizeof(float), stream()>>>(sc, n, Hv, static_cast<int>(dk),
                                                     static_cast<int>(dv), state.data(),
                                                     out.data() + s0 * out.cols());
    if (!launched(kOp)) return;
  }
}

}  // namespace fs::cuda
