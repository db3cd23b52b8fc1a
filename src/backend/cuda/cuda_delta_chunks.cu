// The chunked (WY / UT-transform) form of the gated delta rule, for a scalar (GDN) or per-key-
// channel (KDA) log decay: gated_delta_rule_chunked from 16 tokens (cuda_backend.h). The math
// is the CPU's (cpu_sequence.cpp). Per chunk of 64 tokens counted from the call's first token,
// with G the in-chunk cumulative log decay (per key channel; a scalar decay is the same value in
// every channel):
//   A[i][j] = beta_i sum_x k_i[x] k_j[x] exp(G_i[x] - G_j[x]) for j < i;  T = (I + A)^-1
//   QK[i][j] = sum_x q_i[x] k_j[x] exp(G_i[x] - G_j[x]) for j <= i, else 0
//   W = T (beta k o exp(G)),  U = T (beta v)
//   Vn = U - W S;  O = (q o exp(G)) S + QK Vn;  S <- diag(exp(G_last)) S + (k o exp(G_last - G))^T
//   Vn
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
// is. No positive exponent is formed for a log decay <= 0. fp32 throughout (products in fp32
// FMAs: the state's precision is what the CPU parity asks for).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"

namespace fs::cuda {
namespace {

constexpr int kChunk = 64;          // tokens per chunk (the reference's chunk_size)
constexpr int kSub = 16;            // rows per sub-chunk and per block of T's inverse
constexpr int kThreads = 256;       // both kernels; the inverse's 16 x 16 steps assume it
constexpr int kMaxHead = 128;       // dk, dv
constexpr int kSegmentChunks = 16;  // chunks per pair of launches (1024 tokens)
constexpr int kLdA = kChunk + 1;    // row stride of the 64 x 64 tiles (odd: no bank conflicts)

// C(m, n) = sum over p < K, in increasing order, of A(m, p) B(p, n) for m < M, n < N, the
// operands in shared memory with element strides: A(m, p) = A[m*am + p*ap], B(p, n) =
// B[p*bp + n*bn]. A thread computes a TM x TN tile, rows m = tm + r*(M/TM) and columns
// n = tn + c*(N/TN), so neighbouring threads read neighbouring columns of B and mostly the same
// row of A. M % TM == 0 and N % TN == 0. out(m, n, sum) takes each result; the same (M, N, TM,
// TN) give every (m, n) to the same thread, so consecutive calls need no barrier between them
// for elements a thread owns.
template <int TM, int TN, typename Out>
__device__ __forceinline__ void block_gemm(int M, int N, int K, const float* A, int am, int ap,
                                           const float* B, int bp, int bn, Out out) {
  const int Mg = M / TM, Ng = N / TN;
  for (int tile = threadIdx.x; tile < Mg * Ng; tile += blockDim.x) {
    const int tm = tile / Ng, tn = tile % Ng;
    float acc[TM][TN] = {};
    for (int p = 0; p < K; ++p) {
      float a[TM], b[TN];
#pragma unroll
      for (int r = 0; r < TM; ++r) a[r] = A[(tm + r * Mg) * am + p * ap];
#pragma unroll
      for (int c = 0; c < TN; ++c) b[c] = B[p * bp + (tn + c * Ng) * bn];
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
    }
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) out(tm + r * Mg, tn + c * Ng, acc[r][c]);
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
  extern __shared__ float smem[];
  const int tid = threadIdx.x;
  const int chunk = blockIdx.x;
  const std::int64_t h = blockIdx.y, kh = h / rep, t0 = static_cast<std::int64_t>(chunk) * kChunk;
  const int C = static_cast<int>(S - t0 < kChunk ? S - t0 : kChunk);
  const std::int64_t b = static_cast<std::int64_t>(chunk) * Hv + h;
  const std::int64_t v_stride = Hv * dv, g_stride = kPerChannel ? Hv * dk : Hv;
  const int ld = (dk > dv ? dk : dv) + 1;
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
      // F rows 0..r-1: k_j exp(G_r - G_j); r..r+15: k_i exp(G_i - G_r); r+16..r+31: q_i ...
      for (int e = tid; e < (r + 2 * kSub) * dk; e += blockDim.x) {
        const int row = e / dk, x = e % dk;
        float f;
        if (row < r) {
          f = Ks[row * ld + x] * expf(G(r, x) - G(row, x));
        } else if (row < r + kSub) {
          const int i = row;
          f = Ks[i * ld + x] * expf(G(i, x) - G(r, x));
        } else {
          const int i = row - kSub;
          f = Qs[i * ld + x] * expf(G(i, x) - G(r, x));
        }
        F[row * ld + x] = f;
      }
      __syncthreads();
      block_gemm<2, 2>(2 * kSub, r, dk, F + r * ld, ld, 1, F, 1, ld, [&](int m, int n, float s) {
        if (m < kSub) {
          A[(r + m) * kLdA + n] = bs[r + m] * s;
        } else {
          QKs[(r + m - kSub) * kLdA + n] = s;
        }
      });
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
    block_gemm<4, 4>(kChunk, kChunk, dk, Ks, ld, 1, Ks, 1, ld, [&](int m, int n, float s) {
      A[m * kLdA + n] = n < m ? bs[m] * s * expf(Gs[m] - Gs[n]) : 0.0f;
    });
    block_gemm<4, 4>(kChunk, kChunk, dk, Qs, ld, 1, Ks, 1, ld, [&](int m, int n, float s) {
      QKs[m * kLdA + n] = n <= m ? s * expf(Gs[m] - Gs[n]) : 0.0f;
    });
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
  block_gemm<4, 4>(kChunk, dk, kChunk, T, kLdA, 1, Ks, ld, 1,
                   [&](int m, int n, float s) { W[m * dk + n] = s; });
  block_gemm<4, 4>(kChunk, dv, kChunk, T, kLdA, 1, Qs, ld, 1,
                   [&](int m, int n, float s) { U[m * dv + n] = s; });
}

// The second kernel's shared memory, in floats: the state slice [dk][cols+1], one [64][dk+1]
// operand (W, then Qe, then Kd), Vn and the outputs [64][cols+1], QK, exp(G_last).
std::int64_t state_smem_floats(std::int64_t dk, int cols) {
  return dk * (cols + 1) + kChunk * (dk + 1) + 2 * kChunk * (cols + 1) + kChunk * kLdA + dk;
}

// Value head blockIdx.x, state columns n0 .. n0 + kCols - 1 (n0 = blockIdx.y * kCols), over the
// segment's chunks in order.
template <int kCols>
__global__ void __launch_bounds__(kThreads)
    chunk_state_kernel(ChunkScratch sc, std::int64_t S, std::int64_t Hv, int dk, int dv,
                       float* state, float* out) {
  extern __shared__ float smem[];
  constexpr int kLdS = kCols + 1;
  const int tid = threadIdx.x;
  const std::int64_t h = blockIdx.x;
  const int n0 = blockIdx.y * kCols, ldb = dk + 1;
  const std::int64_t o_stride = Hv * dv;
  float* Ss = smem;                 // [dk][kLdS]
  float* Buf = Ss + dk * kLdS;      // [64][dk + 1]
  float* Vn = Buf + kChunk * ldb;   // [64][kLdS]
  float* Os = Vn + kChunk * kLdS;   // [64][kLdS]
  float* QKs = Os + kChunk * kLdS;  // [64][kLdA]
  float* eg = QKs + kChunk * kLdA;  // [dk]
  float* St = state + h * dk * dv;
  for (int e = tid; e < dk * kCols; e += blockDim.x)
    Ss[(e / kCols) * kLdS + e % kCols] = St[(e / kCols) * dv + n0 + e % kCols];
  auto load_rows = [&](const float* src) {  // [64][dk] from scratch into Buf
    for (int e = tid; e < kChunk * dk; e += blockDim.x) Buf[(e / dk) * ldb + e % dk] = src[e];
  };
  const std::int64_t chunks = (S + kChunk - 1) / kChunk;
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    const std::int64_t b = chunk * Hv + h, t0 = chunk * kChunk;
    const int C = static_cast<int>(S - t0 < kChunk ? S - t0 : kChunk);
    load_rows(sc.W + b * kChunk * dk);
    for (int e = tid; e < kChunk * kCols; e += blockDim.x)
      Vn[(e / kCols) * kLdS + e % kCols] = sc.U[(b * kChunk + e / kCols) * dv + n0 + e % kCols];
    for (int e = tid; e < kChunk * kChunk; e += blockDim.x)
      QKs[(e / kChunk) * kLdA + e % kChunk] = sc.QK[b * kChunk * kChunk + e];
    for (int e = tid; e < dk; e += blockDim.x) eg[e] = sc.EG[b * dk + e];
    __syncthreads();
    // Vn = U - W S.
    block_gemm<4, kCols / 16>(kChunk, kCols, dk, Buf, ldb, 1, Ss, kLdS, 1,
                              [&](int m, int n, float s) { Vn[m * kLdS + n] -= s; });
    __syncthreads();
    load_rows(sc.Qe + b * kChunk * dk);
    __syncthreads();
    // O = Qe S + QK Vn.
    block_gemm<4, kCols / 16>(kChunk, kCols, dk, Buf, ldb, 1, Ss, kLdS, 1,
                              [&](int m, int n, float s) { Os[m * kLdS + n] = s; });
    block_gemm<4, kCols / 16>(kChunk, kCols, kChunk, QKs, kLdA, 1, Vn, kLdS, 1,
                              [&](int m, int n, float s) {
                                if (m < C)
                                  out[(t0 + m) * o_stride + h * dv + n0 + n] = Os[m * kLdS + n] + s;
                              });
    __syncthreads();
    load_rows(sc.Kd + b * kChunk * dk);
    __syncthreads();
    // S <- diag(exp(G_last)) S + Kd^T Vn.
    block_gemm<4, 4>(dk, kCols, kChunk, Buf, 1, ldb, Vn, kLdS, 1, [&](int m, int n, float s) {
      Ss[m * kLdS + n] = fmaf(eg[m], Ss[m * kLdS + n], s);
    });
    __syncthreads();
  }
  for (int e = tid; e < dk * kCols; e += blockDim.x)
    St[(e / kCols) * dv + n0 + e % kCols] = Ss[(e / kCols) * kLdS + e % kCols];
}

template <typename Kernel>
bool allow_smem(Kernel kernel, std::int64_t floats) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(floats * sizeof(float))) == cudaSuccess;
}

// The most shared memory each kernel takes (heads of 128), reserved once per device, so that a
// call inside a stream capture makes no attribute calls.
bool reserve_smem() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  static std::mutex mutex;
  static std::vector<bool> reserved;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto d = static_cast<std::size_t>(device);
  if (d < reserved.size() && reserved[d]) return true;
  const std::int64_t ld = kMaxHead + 1;
  const bool ok = allow_smem(chunk_prepare_kernel<true>, prepare_smem_floats(true, ld)) &&
                  allow_smem(chunk_prepare_kernel<false>, prepare_smem_floats(false, ld)) &&
                  allow_smem(chunk_state_kernel<32>, state_smem_floats(kMaxHead, 32)) &&
                  allow_smem(chunk_state_kernel<16>, state_smem_floats(kMaxHead, 16));
  if (ok) {
    if (reserved.size() <= d) reserved.resize(d + 1, false);
    reserved[d] = true;
  }
  return ok;
}

}  // namespace

// Below 16 tokens the token-by-token kernel is as fast (a chunk costs two launches and a
// triangular inverse); heads over 128 do not fit the first kernel's shared memory.
bool CudaBackend::delta_chunks_take(std::int64_t S, std::int64_t dk, std::int64_t dv) {
  return S >= 16 && dk % 16 == 0 && dv % 16 == 0 && dk <= kMaxHead && dv <= kMaxHead;
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
  const std::int64_t ld = std::max(dk, dv) + 1;
  const auto prep_floats = prepare_smem_floats(per_channel, ld);
  const int cols = dv % 32 == 0 ? 32 : 16;
  const auto state_floats = state_smem_floats(dk, cols);
  auto prepare = per_channel ? chunk_prepare_kernel<true> : chunk_prepare_kernel<false>;
  auto walk = cols == 32 ? chunk_state_kernel<32> : chunk_state_kernel<16>;
  if (!check(reserve_smem(), kOp, "cannot reserve the chunk kernels' shared memory")) return;
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
