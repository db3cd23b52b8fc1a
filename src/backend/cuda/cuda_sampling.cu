// Sampling on the device: the greedy pick of each logits row, so that only token ids cross to
// the host (DESIGN "On the GPU", rule 3); each row's softmax denominator, which the sampler
// needs beside the row's top (Backend::topk) to draw from the top alone; and the penalties
// applied to the rows where they lie (penalise_entries).
#include <algorithm>
#include <climits>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_ranking.cuh"
#include "backend/cuda/cuda_switches.h"

namespace fs::cuda {
namespace {

constexpr int kArgmaxThreads = 1024;

// Entries rank as cuda_ranking.cuh says (the CPU sampler's order, so device and host pick the same
// token); NaN entries never enter.

// The best of p[begin, end) by ranks_above (NaN never wins; bi < 0: none), to thread 0. Each thread
// keeps the best of its strided entries (scanned in increasing index, so a strict > keeps the
// lowest of equals), then warps and the block merge by ranks_above. The whole block calls it.
__device__ void block_best(const float* p, std::int64_t begin, std::int64_t end, float& bv,
                           std::int32_t& bi) {
  __shared__ float best_v[kArgmaxThreads / kWarp];
  __shared__ std::int32_t best_i[kArgmaxThreads / kWarp];
  bv = 0;
  bi = -1;
#pragma unroll 8
  for (std::int64_t c = begin + threadIdx.x; c < end; c += blockDim.x) {
    const float v = p[c];
    if (v == v && (bi < 0 || v > bv)) {  // v == v: NaN never wins
      bv = v;
      bi = static_cast<std::int32_t>(c);
    }
  }
  warp_best(bv, bi);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    best_v[warp] = bv;
    best_i[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    const int warps = (blockDim.x + kWarp - 1) / kWarp;
    bv = lane < warps ? best_v[lane] : 0.0f;
    bi = lane < warps ? best_i[lane] : -1;
    warp_best(bv, bi);
  }
}

// A block per row (short rows).
__global__ void argmax_rows_kernel(const float* x, std::int64_t cols, std::int32_t* ids) {
  float bv;
  std::int32_t bi;
  block_best(x + blockIdx.x * cols, 0, cols, bv, bi);
  if (threadIdx.x == 0) ids[blockIdx.x] = bi < 0 ? 0 : bi;  // an all-NaN row: 0, as the CPU's
}

// Long rows (a vocabulary) in two passes, so that the whole GPU reads the row, not one
// multiprocessor (97 us for 248,320 logits with one block, bench/NOTES.md 2026-12-02): a block
// per slice of kArgmaxSlice entries writes its best; then a warp per row merges the slices in
// order. Slices are contiguous and merged by ranks_above, so the pick is the one-block pick.
constexpr int kSliceThreads = 256;
constexpr std::int64_t kArgmaxSlice = 4096;

__global__ void argmax_slices_kernel(const float* x, std::int64_t cols, float* part_v,
                                     std::int32_t* part_i) {
  const std::int64_t row = blockIdx.y, slice = blockIdx.x;
  const std::int64_t begin = slice * kArgmaxSlice;
  const std::int64_t end = begin + kArgmaxSlice < cols ? begin + kArgmaxSlice : cols;
  float bv;
  std::int32_t bi;
  block_best(x + row * cols, begin, end, bv, bi);
  if (threadIdx.x == 0) {
    part_v[row * gridDim.x + slice] = bv;
    part_i[row * gridDim.x + slice] = bi;
  }
}

__global__ void argmax_merge_kernel(const float* part_v, const std::int32_t* part_i,
                                    std::int64_t slices, std::int32_t* ids) {
  const std::int64_t row = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  float bv = 0;
  std::int32_t bi = -1;
  for (std::int64_t j = lane; j < slices; j += kWarp) {
    const float v = part_v[row * slices + j];
    const std::int32_t i = part_i[row * slices + j];
    if (i >= 0 && ranks_above(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  }
  warp_best(bv, bi);
  if (lane == 0) ids[row] = bi < 0 ? 0 : bi;
}

constexpr int kTotalThreads = 1024;

// A block per row: the row's maximum (a float, exact), then sum exp((x - max) / T) in double,
// strided per thread and merged as a tree. The order differs from the CPU's column order, so
// totals agree to double rounding (~1e-16 relative), not bit for bit.
__global__ void softmax_denominators_kernel(const float* x, std::int64_t cols, double temperature,
                                            double* totals) {
  __shared__ float max_part[kTotalThreads / kWarp];
  __shared__ double sum_part[kTotalThreads / kWarp];
  const float* p = x + blockIdx.x * cols;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = (blockDim.x + kWarp - 1) / kWarp;
  float m = -INFINITY;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, p[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) max_part[warp] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < warps; ++w) m = fmaxf(m, max_part[w]);
  const double mx = static_cast<double>(m);
  double s = 0;
  for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    s += exp((static_cast<double>(p[c]) - mx) / temperature);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) sum_part[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < warps; ++w) t += sum_part[w];
    totals[blockIdx.x] = t;
  }
}

// Long rows (a vocabulary) over the whole GPU: one block of 1,024 threads took 136 us for a row
// of 248,320 (a double exp an entry on one multiprocessor; H100, bench/NOTES.md session 30). A
// block per slice of kSumSlice entries: first each slice's maximum; then each block takes the
// row's maximum from those (fmaxf, exact in any order, so the one-block kernel's) and sums its
// slice's terms in double; then a warp per row adds the slices' sums in slice order. A fixed
// order, so the same bits every run; against the one-block kernel and the CPU, double rounding.
// FLASHSERVE_CUDA_OLD_SOFTMAX_TOTALS=1 runs the one-block kernel at every width.
constexpr std::int64_t kSumSlice = 2048;
constexpr int kSumThreads = 256;

__global__ void slice_max_kernel(const float* x, std::int64_t cols, float* part_max) {
  __shared__ float warp_max[kSumThreads / kWarp];
  const std::int64_t row = blockIdx.y, slice = blockIdx.x;
  const float* p = x + row * cols;
  const std::int64_t begin = slice * kSumSlice;
  const std::int64_t end = begin + kSumSlice < cols ? begin + kSumSlice : cols;
  float m = -INFINITY;
  for (std::int64_t c = begin + threadIdx.x; c < end; c += kSumThreads) m = fmaxf(m, p[c]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 0; w < kSumThreads / kWarp; ++w) m = fmaxf(m, warp_max[w]);
    part_max[row * gridDim.x + slice] = m;
  }
}

// The row's maximum from its slices' maxima (fmaxf: the same in any order), to every lane of the
// warp that calls it.
__device__ float slices_max(const float* part_max, std::int64_t slices, int lane) {
  float m = -INFINITY;
  for (std::int64_t j = lane; j < slices; j += kWarp) m = fmaxf(m, part_max[j]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

// The terms a slice's sum and a draw read, unnormalised: softmax's exp((x - max) / T) of a row
// of logits. Row holds what a whole row sets (its maximum, from the slices' maxima), which one
// warp computes once a block (row()) before any term is read.
struct SoftmaxTerms {
  const float* x = nullptr;
  std::int64_t cols = 0;
  double temperature = 1;
  const float* part_max = nullptr;  // [rows, slices] of slice_max_kernel
  std::int64_t slices = 0;

  struct Row {
    double max;
  };
  __device__ Row row(std::int64_t r, int lane) const {
    return {static_cast<double>(slices_max(part_max + r * slices, slices, lane))};
  }
  __device__ double operator()(const Row& w, std::int64_t r, std::int64_t c) const {
    return exp((static_cast<double>(x[r * cols + c]) - w.max) / temperature);
  }
};

// The sum of a row's slice sums in slice order (a lane's strided sums, then the warp's), to every
// lane of the warp that calls it: the order of sum_slices_kernel, so the row's total.
__device__ double slices_total(const double* part_sum, std::int64_t slices, int lane) {
  double s = 0;
  for (std::int64_t j = lane; j < slices; j += kWarp) s += part_sum[j];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// The residual's terms max(P - Q, 0) of a row pair, P and Q each softmax(x / T) over its row
// divided by its total; Q is 0 past q's columns (a draft vocabulary) and where its term is.
struct ResidualTerms {
  SoftmaxTerms p, q;
  const double* p_part_sum = nullptr;  // [rows, p.slices] of slice_sum_kernel over p
  const double* q_part_sum = nullptr;

  struct Row {
    SoftmaxTerms::Row p, q;
    double p_total, q_total;
  };
  __device__ Row row(std::int64_t r, int lane) const {
    return {p.row(r, lane), q.row(r, lane), slices_total(p_part_sum + r * p.slices, p.slices, lane),
            slices_total(q_part_sum + r * q.slices, q.slices, lane)};
  }
  __device__ double operator()(const Row& w, std::int64_t r, std::int64_t c) const {
    const double tp = p(w.p, r, c);
    if (!(tp > 0)) return 0.0;
    const double tq = c < q.cols ? q(w.q, r, c) : 0.0;
    const double v = tp / w.p_total - (tq > 0 ? tq / w.q_total : 0.0);
    return v > 0 ? v : 0.0;
  }
};

// part_sum[row, slice] = the sum of the slice's terms in double (a thread's strided terms, the
// warp's, then the warps' in order).
template <class Terms>
__global__ void slice_sum_kernel(Terms terms, std::int64_t cols, double* part_sum) {
  __shared__ typename Terms::Row row_consts;
  __shared__ double warp_sum_part[kSumThreads / kWarp];
  const std::int64_t row = blockIdx.y, slice = blockIdx.x, slices = gridDim.x;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (warp == 0) {
    const auto w = terms.row(row, lane);
    if (lane == 0) row_consts = w;
  }
  __syncthreads();
  const std::int64_t begin = slice * kSumSlice;
  const std::int64_t end = begin + kSumSlice < cols ? begin + kSumSlice : cols;
  double s = 0;
  for (std::int64_t c = begin + threadIdx.x; c < end; c += kSumThreads)
    s += terms(row_consts, row, c);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) warp_sum_part[warp] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < kSumThreads / kWarp; ++w) t += warp_sum_part[w];
    part_sum[row * slices + slice] = t;
  }
}

__global__ void sum_slices_kernel(const double* part_sum, std::int64_t slices, double* totals) {
  const std::int64_t row = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  const double s = slices_total(part_sum + row * slices, slices, lane);
  if (lane == 0) totals[row] = s;
}

// A draw, a block a row, after slice_sum_kernel over the same terms: thread 0 walks the slices'
// sums in order to the slice where u * (their total) falls, then the block scans that slice's
// terms (kSumSlice / kSumThreads contiguous entries a thread) in double and takes the first id
// whose running sum passes the target, which has a term > 0 (the sum rose there). Where rounding
// leaves the target past the slice's scanned end, its last id with a term > 0; where it leaves it
// past every slice, the last slice with mass. A row with no term > 0 takes `none`. With
// `unset_only`, rows whose id is already >= 0 are left as they are (the residual's fallback).
constexpr int kDrawPer = static_cast<int>(kSumSlice / kSumThreads);

template <class Terms>
__global__ void draw_in_slices_kernel(Terms terms, std::int64_t cols, const double* part_sum,
                                      std::int64_t slices, const double* u, std::int32_t none,
                                      bool unset_only, std::int32_t* ids) {
  __shared__ typename Terms::Row row_consts;
  __shared__ std::int64_t at_slice;
  __shared__ double before, target;
  __shared__ double warp_total[kSumThreads / kWarp];
  __shared__ int first_past, last_positive;
  const std::int64_t row = blockIdx.x;
  if (unset_only && ids[row] >= 0) return;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (warp == 0) {
    const auto w = terms.row(row, lane);
    if (lane == 0) row_consts = w;
  }
  if (threadIdx.x == 0) {
    const double* sums = part_sum + row * slices;
    double total = 0;
    for (std::int64_t j = 0; j < slices; ++j) total += sums[j];
    const double t = u[row] * total;
    double cum = 0;
    std::int64_t pick = -1, last = -1;
    double last_before = 0;
    for (std::int64_t j = 0; j < slices && pick < 0; ++j) {
      if (sums[j] > 0) {
        last = j;
        last_before = cum;
      }
      if (t < cum + sums[j]) {
        pick = j;
        before = cum;
      }
      cum += sums[j];
    }
    if (pick < 0) before = last_before;
    at_slice = pick >= 0 ? pick : last;
    target = t;
    first_past = INT_MAX;
    last_positive = -1;
  }
  __syncthreads();
  if (at_slice < 0) {  // no term > 0 (a row of NaN; a residual with no mass)
    if (threadIdx.x == 0) ids[row] = none;
    return;
  }
  const std::int64_t begin =
      at_slice * kSumSlice + static_cast<std::int64_t>(threadIdx.x) * kDrawPer;
  double term[kDrawPer], run = 0;
#pragma unroll
  for (int i = 0; i < kDrawPer; ++i) {
    const std::int64_t c = begin + i;
    term[i] = c < cols ? terms(row_consts, row, c) : 0.0;
    run += term[i];
  }
  // The exclusive prefix of the threads' sums, in thread order.
  double incl = run;
  for (int o = 1; o < kWarp; o <<= 1) {
    const double v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == kWarp - 1) warp_total[warp] = incl;
  __syncthreads();
  double cum = before;
  for (int w = 0; w < warp; ++w) cum += warp_total[w];
  cum += incl - run;
  const double t = target;
#pragma unroll
  for (int i = 0; i < kDrawPer; ++i) {
    if (!(term[i] > 0)) continue;
    cum += term[i];
    const int c = static_cast<int>(begin + i);
    atomicMax(&last_positive, c);
    if (t < cum) {
      atomicMin(&first_past, c);
      break;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) ids[row] = first_past != INT_MAX ? first_past : last_positive;
}

// token_probs' last step, a warp a row: the row's maximum and total from its slices (the
// denominators' sum, in their order), then the id's term over the total.
__global__ void token_prob_kernel(SoftmaxTerms terms, const double* part_sum,
                                  const std::int32_t* ids, double* probs) {
  const std::int64_t row = blockIdx.x;
  const int lane = static_cast<int>(threadIdx.x);
  const auto w = terms.row(row, lane);
  const double s = slices_total(part_sum + row * terms.slices, terms.slices, lane);
  if (lane == 0) {
    const double term = terms(w, row, ids[row]);
    probs[row] = term > 0 ? term / s : 0.0;
  }
}

constexpr int kEntryThreads = 256;

// A thread an entry; the entries name distinct elements, so no two threads touch one. The float
// operations of EntryPenalty::apply (backend.h), which the host's apply_penalties runs.
__global__ void penalise_entries_kernel(float* x, std::int64_t cols, const EntryPenalty* entries,
                                        std::int64_t n) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const EntryPenalty e = entries[i];
  float* p = x + static_cast<std::int64_t>(e.row) * cols + e.col;
  float v = *p;
  if (e.repetition != 1.0f) v = v > 0.0f ? __fdiv_rn(v, e.repetition) : __fmul_rn(v, e.repetition);
  *p = __fsub_rn(v, e.amount);
}

}  // namespace

void CudaBackend::penalise_entries(Tensor& x, std::span<const EntryPenalty> entries) {
  constexpr const char* kOp = "penalise_entries";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(entries_inside(x, entries), kOp, "an entry lies outside x")) return;
  if (entries.empty()) return;
  static_assert(sizeof(EntryPenalty) == 4 * sizeof(std::int32_t));
  const auto n = static_cast<std::int64_t>(entries.size());
  // The entries as rows of four 4-byte words in device memory (pooled, freed in stream order).
  Tensor device_entries;
  if (!ensure(device_entries, {n, 4}, DType::kI32)) return;
  if (!stage_to_device(entries.data(), entries.size_bytes(), device_entries.raw(), kOp)) return;
  penalise_entries_kernel<<<grid_for(n, kEntryThreads), kEntryThreads, 0, stream()>>>(
      x.data(), x.cols(), reinterpret_cast<const EntryPenalty*>(device_entries.raw()), n);
  launched(kOp);
}

bool CudaBackend::softmax_slices(const Tensor& x, double temperature, Tensor& part_max,
                                 Tensor& part_sum) {
  const auto rows = x.rows(), slices = (x.cols() + kSumSlice - 1) / kSumSlice;
  if (!ensure(part_max, {rows, slices}) || !ensure(part_sum, {rows, slices}, DType::kI64))
    return false;
  if (walking()) return false;
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(rows));
  slice_max_kernel<<<grid, kSumThreads, 0, stream()>>>(x.data(), x.cols(), part_max.data());
  slice_sum_kernel<<<grid, kSumThreads, 0, stream()>>>(
      SoftmaxTerms{x.data(), x.cols(), temperature, part_max.data(), slices}, x.cols(),
      reinterpret_cast<double*>(part_sum.raw()));
  return true;
}

namespace {
SoftmaxTerms softmax_terms(const Tensor& x, double temperature, const Tensor& part_max) {
  return {x.data(), x.cols(), temperature, part_max.data(), part_max.cols()};
}
const double* sums_of(const Tensor& part_sum) {
  return reinterpret_cast<const double*>(part_sum.raw());
}
}  // namespace

void CudaBackend::softmax_denominators(const Tensor& x, double temperature, Tensor& totals) {
  constexpr const char* kOp = "softmax_denominators";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(temperature > 0 && x.cols() > 0, kOp, "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = x.shape().empty() ? 0 : x.rows();
  if (!ensure(totals, {rows, 1}, DType::kI64)) return;
  if (rows == 0) return;
  const auto slices = (x.cols() + kSumSlice - 1) / kSumSlice;
  if (slices >= 4 && rows <= 65535 && !env_flag("FLASHSERVE_CUDA_OLD_SOFTMAX_TOTALS")) {
    Tensor part_max, part_sum;
    if (!softmax_slices(x, temperature, part_max, part_sum)) return;
    sum_slices_kernel<<<static_cast<unsigned>(rows), kWarp, 0, stream()>>>(
        sums_of(part_sum), slices, reinterpret_cast<double*>(totals.raw()));
    launched(kOp);
    return;
  }
  if (walking()) return;
  softmax_denominators_kernel<<<static_cast<unsigned>(rows), kTotalThreads, 0, stream()>>>(
      x.data(), x.cols(), temperature, reinterpret_cast<double*>(totals.raw()));
  launched(kOp);
}

void CudaBackend::sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                              Tensor& ids) {
  constexpr const char* kOp = "sample_rows";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(temperature > 0 && x.cols() > 0, kOp, "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = x.shape().empty() ? 0 : x.rows();
  if (!check(static_cast<std::int64_t>(u.size()) == rows && rows <= 65535, kOp,
             "one uniform a row (at most 65,535 rows)"))
    return;
  if (!ensure(ids, {rows, 1}, DType::kI32)) return;
  if (rows == 0) return;
  Tensor part_max, part_sum, device_u;
  if (!ensure(device_u, {rows}, DType::kI64)) return;
  if (!stage_to_device(u.data(), u.size_bytes(), device_u.raw(), kOp)) return;
  if (!softmax_slices(x, temperature, part_max, part_sum)) return;
  draw_in_slices_kernel<<<static_cast<unsigned>(rows), kSumThreads, 0, stream()>>>(
      softmax_terms(x, temperature, part_max), x.cols(), sums_of(part_sum), part_sum.cols(),
      reinterpret_cast<const double*>(device_u.raw()), 0, false, ids.data_as<std::int32_t>());
  launched(kOp);
}

void CudaBackend::token_probs(const Tensor& x, double temperature,
                              std::span<const std::int32_t> ids, Tensor& probs) {
  constexpr const char* kOp = "token_probs";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(temperature > 0 && x.cols() > 0, kOp, "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = x.shape().empty() ? 0 : x.rows();
  const auto cols = x.cols();
  if (!check(static_cast<std::int64_t>(ids.size()) == rows && rows <= 65535 &&
                 std::all_of(ids.begin(), ids.end(),
                             [&](std::int32_t id) { return id >= 0 && id < cols; }),
             kOp, "one id a row, inside the row (at most 65,535 rows)"))
    return;
  if (!ensure(probs, {rows, 1}, DType::kI64)) return;
  if (rows == 0) return;
  Tensor part_max, part_sum, device_ids;
  if (!ensure(device_ids, {rows}, DType::kI32)) return;
  if (!stage_to_device(ids.data(), ids.size_bytes(), device_ids.raw(), kOp)) return;
  if (!softmax_slices(x, temperature, part_max, part_sum)) return;
  token_prob_kernel<<<static_cast<unsigned>(rows), kWarp, 0, stream()>>>(
      softmax_terms(x, temperature, part_max), sums_of(part_sum),
      device_ids.data_as<std::int32_t>(), reinterpret_cast<double*>(probs.raw()));
  launched(kOp);
}

void CudaBackend::sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                                       std::span<const double> u, Tensor& ids) {
  constexpr const char* kOp = "sample_residual_rows";
  if (failed() || !on_device(kOp, {&p, &q})) return;
  if (!check(temperature > 0 && p.cols() > 0 && q.cols() > 0, kOp,
             "temperature must be > 0, rows non-empty"))
    return;
  const auto rows = p.shape().empty() ? 0 : p.rows();
  if (!check((q.shape().empty() ? 0 : q.rows()) == rows && q.cols() <= p.cols() &&
                 static_cast<std::int64_t>(u.size()) == rows && rows <= 65535,
             kOp,
             "rows of p and q in pairs, q no wider than p, one uniform a row (at most 65,535 "
             "rows)"))
    return;
  if (!ensure(ids, {rows, 1}, DType::kI32)) return;
  if (rows == 0) return;
  Tensor p_max, p_sum, q_max, q_sum, residual_sum, device_u;
  const auto slices = (p.cols() + kSumSlice - 1) / kSumSlice;
  if (!ensure(device_u, {rows}, DType::kI64) || !ensure(residual_sum, {rows, slices}, DType::kI64))
    return;
  if (!stage_to_device(u.data(), u.size_bytes(), device_u.raw(), kOp)) return;
  if (!softmax_slices(p, temperature, p_max, p_sum) ||
      !softmax_slices(q, temperature, q_max, q_sum))
    return;
  const SoftmaxTerms p_terms = softmax_terms(p, temperature, p_max);
  const ResidualTerms terms{p_terms, softmax_terms(q, temperature, q_max), sums_of(p_sum),
                            sums_of(q_sum)};
  const auto* device_uniforms = reinterpret_cast<const double*>(device_u.raw());
  const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(rows));
  slice_sum_kernel<<<grid, kSumThreads, 0, stream()>>>(
      terms, p.cols(), reinterpret_cast<double*>(residual_sum.raw()));
  // A residual with no mass (P == Q everywhere) leaves -1, which the draw from P then fills.
  draw_in_slices_kernel<<<static_cast<unsigned>(rows), kSumThreads, 0, stream()>>>(
      terms, p.cols(), sums_of(residual_sum), slices, device_uniforms, -1, false,
      ids.data_as<std::int32_t>());
  draw_in_slices_kernel<<<static_cast<unsigned>(rows), kSumThreads, 0, stream()>>>(
      p_terms, p.cols(), sums_of(p_sum), slices, device_uniforms, 0, true,
      ids.data_as<std::int32_t>());
  launched(kOp);
}

void CudaBackend::argmax_rows(const Tensor& x, Tensor& ids) {
  constexpr const char* kOp = "argmax_rows";
  if (failed() || !on_device(kOp, {&x})) return;
  if (!check(&ids != &x, kOp, "ids must not alias x")) return;
  const auto rows = x.shape().empty() ? 0 : x.rows();
  if (!ensure(ids, {rows, 1}, DType::kI32)) return;
  if (rows == 0) return;
  if (x.cols() == 0) {
    cuda_memory_->zero(ids.raw(), ids.bytes());
    return;
  }
  const auto slices = (x.cols() + kArgmaxSlice - 1) / kArgmaxSlice;
  if (slices >= 4 && rows <= 65535) {
    Tensor part_v, part_i;
    if (!ensure(part_v, {rows, slices}) || !ensure(part_i, {rows, slices}, DType::kI32)) return;
    if (walking()) return;
    argmax_slices_kernel<<<dim3(static_cast<unsigned>(slices), static_cast<unsigned>(rows)),
                           kSliceThreads, 0, stream()>>>(x.data(), x.cols(), part_v.data(),
                                                         part_i.data_as<std::int32_t>());
    argmax_merge_kernel<<<static_cast<unsigned>(rows), kWarp, 0, stream()>>>(
        part_v.data(), part_i.data_as<std::int32_t>(), slices, ids.data_as<std::int32_t>());
    launched(kOp);
    return;
  }
  if (walking()) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream()>>>(
      x.data(), x.cols(), ids.data_as<std::int32_t>());
  launched(kOp);
}

}  // namespace fs::cuda
