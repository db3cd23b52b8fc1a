// Decode-kernel microbenchmark on the GPU: the device-to-device copy bandwidth, then the CUDA
// backend's few-row GEMV (linear) and fused routed experts (moe_experts) at the released Qwen 3.8
// Flash Next shapes for 1-4 tokens, each beside the kernel it replaced (kept below, verbatim in
// behaviour, as `legacy`), and the QSA context kernels (index_scores, select_blocks,
// block_sparse_attention) at context 1k/16k/64k for 1, 2 and 4 rows, new beside "old" (the
// backend's earlier kernels, chosen with FLASHSERVE_CUDA_OLD_CONTEXT=1), the attention also beside
// "split16" (its split kernel before session 13's tiled one,
// FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION=1). Prints a table and writes JSON; it never passes or fails
// on time.
//
//   cuda_kernel_bench [--json PATH] [--quick] [--fp8 | --quant | --delta | --chain | --forms |
//                     --staged | --tokens | --hc | --context | --sampling]
//
// --fp8: only the products on block-scaled FP8 E4M3 weights (issue 15) beside their bf16 forms.
// --quant: only the packed formats (issue 15: FP4 E2M1 + E8M0, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K) in
// the 2560 -> 10240 GEMV and DeepSeek V4-sized routed experts, beside bf16 and FP8.
// --delta: only the gated delta rule's prefill form (gated_delta_rule_chunked at S = 512 and
// 4096): the chunk kernels beside the token-by-token kernel, us, tokens/s and their ratio (also
// at the end of a full run).
// --context: only the QSA context kernels at 1k/16k/64k (with select_blocks' radix select before
// session 20 as "radix13").
// --sampling: sampled decoding's device work over a 248,320-wide logits row at 1, 2 and 4 rows:
// the top 1,024 (topk: the radix select, and with the grid's narrowing first, "vocab"), the
// softmax denominators, and argmax_rows beside them.
// --chain: what bounds a weight-streaming product inside the decode step's chain of kernels
// (bench_chain below says what each row runs).
// --forms: the one-token FP8 GEMV in other forms (namespace forms below): the backend's ("fma"), a
// plain read stream of the same bytes (the floor), a pipelined grid-stride form and a tensor-core
// form, each with its max relative difference from the backend's output.
//
// Timing: each measurement is a CUDA graph of many calls on the backend's stream, replayed 5
// times (best kept), so launch overhead is that of graph replay, as in a graph-captured decode
// step. Weights are rotated over enough copies that the bytes touched are several times the L2
// (a layer's weights are cold when its token comes back to it); the routed experts use a fresh
// random routing per call. GB/s counts weight bytes read once (distinct experts only); the copy
// counts bytes read plus bytes written, as KINDS.md measured it.
// nvcc reports discarded [[nodiscard]] class values in the headers (see cuda_backend.h).
#pragma nv_diag_suppress 2810

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>  // setenv, unsetenv

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_memory.h"

namespace {

using bf16_bits = std::uint16_t;
constexpr int kWarp = 32;

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

DeviceBuffer device_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    std::fprintf(stderr, "cudaMalloc of %zu bytes failed\n", bytes);
    std::exit(1);
  }
  return DeviceBuffer(p);
}

__device__ std::uint32_t hash32(std::uint64_t i) {
  i ^= i >> 33;
  i *= 0xff51afd7ed558ccdULL;
  i ^= i >> 33;
  i *= 0xc4ceb9fe1a85ec53ULL;
  i ^= i >> 33;
  return static_cast<std::uint32_t>(i);
}

// Uniform values in [-scale, scale), as bf16 (round toward zero: any value will do) or f32.
__global__ void fill_kernel(void* p, std::size_t n, bool bf16, float scale, std::uint64_t seed) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const float v =
        (static_cast<float>(hash32(i * 0x9e3779b97f4a7c15ULL + seed)) * 0x1p-31f - 1.0f) * scale;
    if (bf16)
      static_cast<bf16_bits*>(p)[i] = static_cast<bf16_bits>(__float_as_uint(v) >> 16);
    else
      static_cast<float*>(p)[i] = v;
  }
}

void fill(void* p, std::size_t n, bool bf16, float scale, std::uint64_t seed, cudaStream_t s) {
  fill_kernel<<<4096, 256, 0, s>>>(p, n, bf16, scale, seed);
}

// --- legacy kernels: the GEMV this round replaced (the old MoE path is the op's own switch) --

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

namespace legacy {

template <typename T>
struct Chunk;
template <>
struct Chunk<float> {
  static constexpr int kN = 4;
  __device__ __forceinline__ static void load(const float* p, float (&f)[kN]) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    f[0] = v.x;
    f[1] = v.y;
    f[2] = v.z;
    f[3] = v.w;
  }
};
template <>
struct Chunk<bf16_bits> {
  static constexpr int kN = 8;
  __device__ __forceinline__ static void load(const bf16_bits* p, float (&f)[kN]) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(u[i] << 16);
      f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
};

// The vectorised path only (the shapes benchmarked are multiples of 8).
template <typename T, int kS>
__device__ __forceinline__ void lane_dot(const T* row, const float* x, std::int64_t x_stride,
                                         std::int64_t in, float (&acc)[kS]) {
  const int lane = threadIdx.x % kWarp;
  constexpr int kN = Chunk<T>::kN;
#pragma unroll 2
  for (std::int64_t k = lane * kN; k < in; k += kWarp * kN) {
    float w[kN];
    Chunk<T>::load(row + k, w);
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      const float* xs = x + s * x_stride + k;
#pragma unroll
      for (int q = 0; q < kN; q += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(xs + q);
        acc[s] += w[q] * xv.x;
        acc[s] += w[q + 1] * xv.y;
        acc[s] += w[q + 2] * xv.z;
        acc[s] += w[q + 3] * xv.w;
      }
    }
  }
}

template <typename T, int kS>
__global__ void __launch_bounds__(256)
    gemv_kernel(const float* x, const T* w, float* y, std::int64_t in, std::int64_t out) {
  const std::int64_t r = (blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x) / kWarp;
  if (r >= out) return;
  float acc[kS] = {};
  lane_dot<T, kS>(w + r * in, x, in, in, acc);
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const float v = warp_sum(acc[s]);
    if (threadIdx.x % kWarp == 0) y[s * out + r] = v;
  }
}

template <typename T>
void gemv(int S, const float* x, const T* w, float* y, std::int64_t in, std::int64_t out,
          cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((out * kWarp + 255) / 256);
  switch (S) {
    case 1:
      gemv_kernel<T, 1><<<grid, 256, 0, s>>>(x, w, y, in, out);
      break;
    case 2:
      gemv_kernel<T, 2><<<grid, 256, 0, s>>>(x, w, y, in, out);
      break;
    case 3:
      gemv_kernel<T, 3><<<grid, 256, 0, s>>>(x, w, y, in, out);
      break;
    default:
      gemv_kernel<T, 4><<<grid, 256, 0, s>>>(x, w, y, in, out);
      break;
  }
}

}  // namespace legacy

// --- timing -------------------------------------------------------------------------------------

// Seconds per call of `call(i)` (i = 0 .. n-1, one graph of n calls), best of 5 replays. Falls
// back to timing the calls eagerly when the stream cannot be captured.
double time_calls(cudaStream_t s, int n, const std::function<void(int)>& call,
                  bool graph_them = true) {
  for (int i = 0; i < n; ++i) call(i);  // warm: every scratch buffer is allocated now
  cudaStreamSynchronize(s);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  bool graphed =
      graph_them && cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
  if (graphed) {
    for (int i = 0; i < n; ++i) call(i);
    graphed = cudaStreamEndCapture(s, &graph) == cudaSuccess &&
              cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
  }
  cudaGetLastError();
  float best = 1e30f;
  for (int rep = 0; rep < 6; ++rep) {
    cudaEventRecord(a, s);
    if (graphed)
      cudaGraphLaunch(exec, s);
    else
      for (int i = 0; i < n; ++i) call(i);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (rep > 0) best = std::min(best, ms);  // the first replay uploads the graph
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  if (graph_them && !graphed) std::fprintf(stderr, "note: stream capture failed, timed eagerly\n");
  return best * 1e-3 / n;
}

double copy_bandwidth(cudaStream_t s) {
  constexpr std::size_t kBytes = std::size_t{4} << 30;
  auto src = device_alloc(kBytes), dst = device_alloc(kBytes);
  cudaMemsetAsync(src.get(), 1, kBytes, s);
  // Timed eagerly: captured into a graph, the copy became a memcpy node that ran at 2775 GB/s on
  // 2026-12-01 (against 4.3 TB/s through PyTorch in KINDS.md), below what the GEMVs read.
  for (int i = 0; i < 2; ++i)
    cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, s);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    cudaEventRecord(a, s);
    cudaMemcpyAsync(dst.get(), src.get(), kBytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = std::min(best, ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  const double t = best * 1e-3;
  return 2.0 * kBytes / t;  // read + written
}

struct Row {
  std::string kernel, shape, impl;
  int tokens;
  double bytes, seconds, max_diff;
};

double max_rel_diff(const fs::Tensor& a, const float* b_dev, std::size_t n) {
  std::vector<float> ha = a.to_host_vector(), hb(n);
  cudaMemcpy(hb.data(), b_dev, n * sizeof(float), cudaMemcpyDeviceToHost);
  double m = 0, ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    m = std::max(m, static_cast<double>(std::fabs(ha[i] - hb[i])));
    ref = std::max(ref, static_cast<double>(std::fabs(hb[i])));
  }
  return m / std::max(1.0, ref);
}

// A bf16 (or f32) weight [copies][out][in] on the device, random.
struct DeviceWeights {
  DeviceBuffer buffer;
  std::size_t stride = 0;  // bytes between copies
  int copies = 1;
  fs::Weight view(int i, fs::DType dtype, fs::Shape shape) const {
    return {dtype, std::move(shape),
            static_cast<const std::uint8_t*>(buffer.get()) + stride * static_cast<std::size_t>(i),
            fs::Device::kCuda};
  }
};

DeviceWeights make_weights(std::size_t elems, bool bf16, std::size_t touch_bytes, cudaStream_t s,
                           std::uint64_t seed) {
  DeviceWeights w;
  const std::size_t bytes = elems * (bf16 ? 2 : 4);
  w.stride = (bytes + 255) / 256 * 256;
  w.copies = static_cast<int>(std::clamp<std::size_t>((touch_bytes + bytes - 1) / bytes, 1, 2048));
  w.buffer = device_alloc(w.stride * static_cast<std::size_t>(w.copies));
  fill(w.buffer.get(), w.stride * static_cast<std::size_t>(w.copies) / (bf16 ? 2 : 4), bf16, 0.05f,
       seed, s);
  return w;
}

void bench_gemv(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out, bool bf16,
                const std::string& name, std::vector<Row>& rows) {
  const auto dtype = bf16 ? fs::DType::kBF16 : fs::DType::kF32;
  const double wbytes = static_cast<double>(in * out) * (bf16 ? 2 : 4);
  auto w = make_weights(static_cast<std::size_t>(in * out), bf16, std::size_t{1} << 30, s, 17);
  const int n = std::max(w.copies, 16);
  for (int S = 1; S <= 4; ++S) {
    fs::Tensor x = be.new_tensor({S, in});
    fill(x.raw(), static_cast<std::size_t>(S * in), false, 1.0f, 99 + S, s);
    fs::Tensor y;
    const double t_new = time_calls(s, n, [&](int i) {
      be.linear(x, w.view(i % w.copies, dtype, {out, in}), y);
    });
    auto y_old = device_alloc(static_cast<std::size_t>(S * out) * sizeof(float));
    auto* yo = static_cast<float*>(y_old.get());
    const double t_old = time_calls(s, n, [&](int i) {
      const auto* p = w.view(i % w.copies, dtype, {out, in}).data;
      if (bf16)
        legacy::gemv(S, x.data(), reinterpret_cast<const bf16_bits*>(p), yo, in, out, s);
      else
        legacy::gemv(S, x.data(), reinterpret_cast<const float*>(p), yo, in, out, s);
    });
    // Both last computed with copy (n-1) % copies.
    cudaStreamSynchronize(s);
    const double diff = max_rel_diff(y, yo, static_cast<std::size_t>(S * out));
    const std::string shape =
        std::to_string(in) + "->" + std::to_string(out) + (bf16 ? " bf16" : " f32");
    rows.push_back({name, shape, "new", S, wbytes, t_new, diff});
    rows.push_back({name, shape, "legacy", S, wbytes, t_old, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

void bench_moe(fs::Backend& be, cudaStream_t s, std::vector<Row>& rows, bool quick) {
  constexpr std::int64_t E = 512, K = 10, H = 2560, I = 640;
  auto gate_up = device_alloc(static_cast<std::size_t>(E * 2 * I * H) * 2);
  auto down = device_alloc(static_cast<std::size_t>(E * H * I) * 2);
  fill(gate_up.get(), static_cast<std::size_t>(E * 2 * I * H), true, 0.02f, 5, s);
  fill(down.get(), static_cast<std::size_t>(E * H * I), true, 0.04f, 6, s);
  const fs::Weight gu{fs::DType::kBF16,
                      {E, 2 * I, H},
                      static_cast<const std::uint8_t*>(gate_up.get()),
                      fs::Device::kCuda};
  const fs::Weight dn{
      fs::DType::kBF16, {E, H, I}, static_cast<const std::uint8_t*>(down.get()), fs::Device::kCuda};
  const double per_expert = static_cast<double>(3 * I * H) * 2;
  const int calls = quick ? 8 : 32;
  std::mt19937 rng(1234);
  for (int S = 1; S <= 4; ++S) {
    // `calls` random routings: distinct experts per token, positive weights summing to 1.
    std::vector<fs::Tensor> ids, wts;
    double distinct_total = 0;
    for (int c = 0; c < calls; ++c) {
      std::vector<std::int32_t> id(static_cast<std::size_t>(S * K));
      std::vector<float> wt(id.size());
      std::vector<std::int32_t> all(E);
      std::vector<bool> seen(E);
      for (int t = 0; t < S; ++t) {
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        float sum = 0;
        for (int j = 0; j < K; ++j) {
          id[static_cast<std::size_t>(t * K + j)] = all[static_cast<std::size_t>(j)];
          sum += wt[static_cast<std::size_t>(t * K + j)] = 0.1f + static_cast<float>(rng() % 100);
          seen[static_cast<std::size_t>(all[static_cast<std::size_t>(j)])] = true;
        }
        for (int j = 0; j < K; ++j) wt[static_cast<std::size_t>(t * K + j)] /= sum;
      }
      distinct_total += static_cast<double>(std::count(seen.begin(), seen.end(), true));
      fs::Tensor hi = fs::Tensor(fs::host_memory(), {S, K}, fs::DType::kI32);
      std::memcpy(hi.raw(), id.data(), id.size() * sizeof(std::int32_t));
      ids.push_back(hi.to(be.memory()));
      wts.push_back(fs::Tensor({S, K}, wt).to(be.memory()));
    }
    fs::Tensor x = be.new_tensor({S, H});
    fill(x.raw(), static_cast<std::size_t>(S * H), false, 1.0f, 7 + S, s);
    fs::Tensor y;
    const double t_new = time_calls(s, calls, [&](int i) {
      be.moe_experts(x, gu, dn, ids[static_cast<std::size_t>(i)], wts[static_cast<std::size_t>(i)],
                     0, y);
    });
    // The pair kernels (what the op ran before the fused path), through the op's own switch.
    fs::Tensor yo;
    setenv("FLASHSERVE_CUDA_MOE_PAIRS", "1", 1);
    const double t_old = time_calls(s, calls, [&](int i) {
      be.moe_experts(x, gu, dn, ids[static_cast<std::size_t>(i)], wts[static_cast<std::size_t>(i)],
                     0, yo);
    });
    unsetenv("FLASHSERVE_CUDA_MOE_PAIRS");
    cudaStreamSynchronize(s);
    const double diff = max_rel_diff(y, yo.data(), static_cast<std::size_t>(S * H));
    const double bytes = distinct_total / calls * per_expert;
    const std::string shape = "E512 k10 H2560 I640 bf16";
    rows.push_back({"moe_experts", shape, "new", S, bytes, t_new, diff});
    rows.push_back({"moe_experts", shape, "legacy", S, bytes, t_old, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// --- FP8 (issue 15): the same products on block-scaled e4m3 weights --------------------------
// Codes are random bytes (the bf16 fill's bits; timing does not depend on them), scales random
// f32 per 128x128 block. Bytes count the codes and the scales read.
std::int64_t blocks(std::int64_t n) {
  return (n + 127) / 128;
}

struct Fp8Weights {
  DeviceBuffer codes, scales;
  std::size_t code_stride = 0, scale_stride = 0;
  int copies = 1;
  fs::Weight view(int i, fs::Shape shape) const {
    fs::Weight w{
        fs::DType::kF8E4M3, std::move(shape),
        static_cast<const std::uint8_t*>(codes.get()) + code_stride * static_cast<std::size_t>(i),
        fs::Device::kCuda};
    w.scales.data =
        static_cast<const std::uint8_t*>(scales.get()) + scale_stride * static_cast<std::size_t>(i);
    return w;
  }
};

// `mats` stacked [out, in] matrices per copy, copies enough to touch `touch_bytes`.
Fp8Weights make_fp8(std::int64_t mats, std::int64_t out, std::int64_t in, std::size_t touch_bytes,
                    cudaStream_t s, std::uint64_t seed) {
  Fp8Weights w;
  const auto bytes = static_cast<std::size_t>(mats * out * in);
  const auto sbytes = static_cast<std::size_t>(mats * blocks(out) * blocks(in)) * sizeof(float);
  w.code_stride = (bytes + 255) / 256 * 256;
  w.scale_stride = (sbytes + 255) / 256 * 256;
  w.copies = static_cast<int>(std::clamp<std::size_t>((touch_bytes + bytes - 1) / bytes, 1, 2048));
  w.codes = device_alloc(w.code_stride * static_cast<std::size_t>(w.copies));
  w.scales = device_alloc(w.scale_stride * static_cast<std::size_t>(w.copies));
  fill(w.codes.get(), w.code_stride * static_cast<std::size_t>(w.copies) / 2, true, 1.0f, seed, s);
  fill(w.scales.get(), w.scale_stride * static_cast<std::size_t>(w.copies) / 4, false, 0.01f,
       seed + 1, s);
  return w;
}

void bench_gemv_fp8(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out,
                    const std::string& name, std::vector<Row>& rows) {
  const double wbytes =
      static_cast<double>(in * out) + static_cast<double>(blocks(in) * blocks(out)) * 4;
  auto w = make_fp8(1, out, in, std::size_t{1} << 30, s, 23);
  const int n = std::max(w.copies, 16);
  for (int S = 1; S <= 4; ++S) {
    fs::Tensor x = be.new_tensor({S, in});
    fill(x.raw(), static_cast<std::size_t>(S * in), false, 1.0f, 99 + S, s);
    fs::Tensor y;
    const double t = time_calls(s, n, [&](int i) {
      be.linear(x, w.view(i % w.copies, {out, in}), y);
    });
    rows.push_back(
        {name, std::to_string(in) + "->" + std::to_string(out) + " fp8", "fp8", S, wbytes, t, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// One weight-streaming product in the decode step's chain of overlapped kernels (rows "chain",
// time per call; session 14 measured these to decide against prefetching weights into L2):
//   cold         the product alone, a different copy of W each call (the decode step's case);
//   warm         the same copy every call, so W stays in L2 (60 MB): what any prefetch could give;
//   small        six small ops (scale on a 4 KB row, as the norms and mixes between two products)
//                before the product: what a small kernel costs in the chain;
//   ...-eager    the same calls launched one by one instead of replayed as a graph;
//   events       cold, eager, with an event recorded between the products: whether a stream
//                operation between two overlapped kernels costs them their overlap.
void bench_chain(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out, bool fp8,
                 const std::string& name, std::vector<Row>& rows) {
  const double wbytes = static_cast<double>(in * out) * (fp8 ? 1 : 2);
  auto w8 = fp8 ? make_fp8(1, out, in, std::size_t{1} << 30, s, 23) : Fp8Weights{};
  auto w16 =
      fp8 ? DeviceWeights{}
          : make_weights(static_cast<std::size_t>(in * out), true, std::size_t{1} << 30, s, 17);
  const int copies = fp8 ? w8.copies : w16.copies;
  const auto view = [&](int i) {
    return fp8 ? w8.view(i % copies, {out, in}) : w16.view(i % copies, fs::DType::kBF16, {out, in});
  };
  const int n = std::max(copies, 16);
  fs::Tensor x = be.new_tensor({1, in});
  fill(x.raw(), static_cast<std::size_t>(in), false, 1.0f, 99, s);
  fs::Tensor small = be.new_tensor({1, 1024});
  fill(small.raw(), 1024, false, 1.0f, 98, s);
  fs::Tensor y;
  cudaEvent_t mark;
  cudaEventCreateWithFlags(&mark, cudaEventDisableTiming);
  const std::string shape =
      std::to_string(in) + "->" + std::to_string(out) + (fp8 ? " fp8" : " bf16");
  const auto add = [&](const char* impl, double t) {
    rows.push_back({name, shape, impl, 1, wbytes, t, 0});
  };
  const auto product = [&](int i) { be.linear(x, view(i), y); };
  const auto smalls = [&](int i) {
    for (int k = 0; k < 6; ++k) be.scale(small, 1.0f);
    product(i);
  };
  add("cold", time_calls(s, n, product));
  add("warm", time_calls(s, n, [&](int) { product(0); }));
  add("small", time_calls(s, n, smalls));
  add("cold-eager", time_calls(s, n, product, false));
  add("events", time_calls(
                    s, n,
                    [&](int i) {
                      cudaEventRecord(mark, s);
                      product(i);
                    },
                    false));
  add("small-eager", time_calls(s, n, smalls, false));
  cudaEventDestroy(mark);
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// --- --forms: the one-token FP8 GEMV in other forms, and the read floor --------------------------
// Why does a one-token FP8 product of 16-42 MB read at 53-73% of the copy bandwidth when the
// same kernels read 335 MB at 99.6%? Three probes, measured on the H200 in session 18
// (bench/NOTES.md "Session 18", calls B-D):
//  - read4 / read8: a plain stream of the product's bytes (16-byte loads, grid-stride, 4 or 8
//    blocks of 256 a multiprocessor): the floor of any kernel reading them once. It is itself at
//    70-85% at these sizes (a fixed ~1.7 us a kernel), 100% at 335 MB.
//  - mma: the tensor cores (mma.sync m16n8k16, f16 in, f32 accumulate): e4m3 pairs converted by
//    one instruction each, exact in f16; x split into an f16 high part (column 0 of B) and the f16
//    of the rest (column 1), so a row's dot product is c0 + c1 at ~22 bits of x. Per 256 weights a
//    warp issues ~6 instructions where the FMA form issues ~24. No faster: the FMA form is not
//    bound by its instructions.
//  - pipe: the backend's sums as a pipelined grid-stride loop (each warp issues its next row's
//    loads before it sums the current row) in 2-4 blocks a multiprocessor: no faster either; the
//    backend's one-round waves do not lose to a drained memory queue.
// So the products pay a fixed cost a kernel (~2.9 us against the stream's ~1.7), not a rate: with
// ~700 kernels a token, those costs are most of the step beyond its bytes (docs/GPU.md, step 14).
//
// mma layout: a block takes 16 rows, kWarpsK warps splitting the row's columns (whole 128-column
// scale blocks each); thread (g = lane / 4, q = lane % 4) loads 16 bytes of rows g and g + 8 a
// 64-column group and feeds mma step j (of 4) its bytes 4j..4j+3: the k order inside a group is
// permuted, the same way for x, which a dot product does not see. Each 128 columns' sums are
// multiplied by their block scale once. x is staged per warp as f16 pairs (no range scaling: the
// bench's x is within f16's range; a product version would scale x by a power of two).
namespace forms {

__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short two) {
  unsigned h;
  asm("{\n\t.reg .b16 t;\n\tmov.b16 t, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, t;\n\t}"
      : "=r"(h)
      : "h"(two));
  return h;
}

__device__ __forceinline__ void mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 load_stream(const std::uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Token t's span / 2 pairs of x's f16 high parts, then the rest's, at xs + t * in + warp * span
// (each warp its own span of the columns), then a warp barrier.
template <int kS>
__device__ __forceinline__ void stage_x_parts(const float* x, __half2* xs, std::int64_t in,
                                              int warp, std::int64_t span, int lane) {
  const std::int64_t c_begin = warp * span;
#pragma unroll
  for (int t = 0; t < kS; ++t) {
    __half2* xh = xs + t * in + c_begin;
    __half2* xl = xh + span / 2;
    for (std::int64_t p = lane; p < span / 2; p += 32) {
      const float2 v = *reinterpret_cast<const float2*>(x + t * in + c_begin + 2 * p);
      const __half2 h = __floats2half2_rn(v.x, v.y);
      const float2 hf = __half22float2(h);
      xh[p] = h;
      xl[p] = __floats2half2_rn(v.x - hf.x, v.y - hf.y);
    }
  }
  __syncwarp();
}

// The four mma steps of 64-column group G: thread (g, q)'s 16 bytes of rows g (a0) and g + 8
// (a1), step j their bytes 4j..4j+3, against B column g (token g / 2's part g % 2, from xsrc).
template <int kS>
__device__ __forceinline__ void group_mma(float (&blk)[4], const uint4& a0, const uint4& a1,
                                          const __half2* xsrc, int G, int g, int q) {
  const unsigned A0[4] = {a0.x, a0.y, a0.z, a0.w};
  const unsigned A1[4] = {a1.x, a1.y, a1.z, a1.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    unsigned b0 = 0, b1 = 0;
    if (g < 2 * kS) {
      const uint2 bb = *reinterpret_cast<const uint2*>(xsrc + (G * 64 + q * 16 + 4 * j) / 2);
      b0 = bb.x;
      b1 = bb.y;
    }
    mma16816(blk, e4m3x2_to_f16x2(static_cast<unsigned short>(A0[j] & 0xffffu)),
             e4m3x2_to_f16x2(static_cast<unsigned short>(A1[j] & 0xffffu)),
             e4m3x2_to_f16x2(static_cast<unsigned short>(A0[j] >> 16)),
             e4m3x2_to_f16x2(static_cast<unsigned short>(A1[j] >> 16)), b0, b1);
  }
}

// y[r] = sum over 128-column blocks b of scale[r / 128, b] * (W[r, b] · x[b]), rows a multiple
// of 16, in / kWarpsK a multiple of 128. Dynamic shared memory: in * 4 bytes.
// kS tokens (1-4): column n = 2t + p of the mma's B is token t's high (p = 0) or low (p = 1)
// part, so the 8 columns carry four tokens and one mma instruction serves them all; y [kS, out].
// A column's sums do not depend on the other columns, so token t's y is the same at any kS.
template <int kWarpsK, int kR, int kS = 1>
__global__ void __launch_bounds__(32 * kWarpsK)
    fp8_mma_gemv_kernel(const float* x, const std::uint8_t* w, const float* scales,
                        std::int64_t grid_cols, float* y, std::int64_t in, std::int64_t out) {
  extern __shared__ __half2 xs[];
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, q = lane % 4;
  const std::int64_t span = in / kWarpsK, c_begin = warp * span;
  const std::int64_t row0 = blockIdx.x * 16LL + g;
  const std::uint8_t* w0 = w + row0 * in + c_begin + q * 16;
  const std::uint8_t* w1 = w0 + 8 * in;
  const int groups = static_cast<int>(span / 64);
  // The first round of weights before x (as the backend's kernels issue it before their wait).
  uint4 a[kR][2];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (r < groups) {
      a[r][0] = load_stream(w0 + r * 64);
      a[r][1] = load_stream(w1 + r * 64);
    }
  }
  stage_x_parts<kS>(x, xs, in, warp, span, lane);
  const __half2* xsrc = xs + (g / 2) * in + warp * span + (g % 2) * (span / 2);
  const float* srow = scales + (row0 / 128) * grid_cols + c_begin / 128;
  float tot[4] = {}, blk[4] = {};
  for (int G0 = 0; G0 < groups; G0 += kR) {
    uint4 nxt[kR][2];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (G0 + kR + r < groups) {
        nxt[r][0] = load_stream(w0 + (G0 + kR + r) * 64);
        nxt[r][1] = load_stream(w1 + (G0 + kR + r) * 64);
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int G = G0 + r;
      if (G >= groups) break;
      group_mma<kS>(blk, a[r][0], a[r][1], xsrc, G, g, q);
      if (G % 2 == 1) {
        const float sc = __ldg(srow + G / 2);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          tot[i] = fmaf(blk[i], sc, tot[i]);
          blk[i] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      a[r][0] = nxt[r][0];
      a[r][1] = nxt[r][1];
    }
  }
  __shared__ float part[kWarpsK][kS][16];
  if (q < kS) {  // thread q holds columns 2q and 2q + 1: token q's two parts
    part[warp][q][g] = tot[0] + tot[1];
    part[warp][q][g + 8] = tot[2] + tot[3];
  }
  __syncthreads();
  if (threadIdx.x < 16 * kS) {
    const int t = static_cast<int>(threadIdx.x / 16), r = static_cast<int>(threadIdx.x % 16);
    float v = 0.0f;
#pragma unroll
    for (int k = 0; k < kWarpsK; ++k) v += part[k][t][r];
    y[t * out + blockIdx.x * 16LL + r] = v;
  }
}

// Random bytes that happen to be e4m3 NaN (S.1111.111) become the largest finite value.
__global__ void no_nan_kernel(std::uint8_t* w, std::size_t n) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    if ((w[i] & 0x7f) == 0x7f) w[i] ^= 1;
}

template <int kWarpsK, int kR, int kS = 1>
void launch(const float* x, const std::uint8_t* w, const float* scales, std::int64_t grid_cols,
            float* y, std::int64_t in, std::int64_t out, cudaStream_t s) {
  const auto smem = static_cast<std::size_t>(in) * 4 * kS;
  static bool opted = false;
  if (!opted) {
    cudaFuncSetAttribute(fp8_mma_gemv_kernel<kWarpsK, kR, kS>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
    opted = true;
  }
  fp8_mma_gemv_kernel<kWarpsK, kR, kS><<<static_cast<unsigned>(out / 16), 32 * kWarpsK, smem, s>>>(
      x, w, scales, grid_cols, y, in, out);
}

// The backend's one-token FP8 GEMV (a warp a row, chunks in the lanes' order, the block scale
// deferred to each chunk's sum) as a pipelined grid-stride loop: kBlocksPerSm blocks of 8 warps a
// multiprocessor, each warp walking rows r, r + all warps, ... and issuing the next row's loads
// before it sums the current one. The backend's kernels give each warp one or two rows, all
// their loads in one round, in 3+ waves of blocks; between waves the memory queue drains. Here it
// should not, until the last row. The same sums as the backend's kernel of one row a warp, so
// maxdiff should be 0 where it takes warp-wide rows.
template <int kU, int kBlocksPerSm>
__global__ void __launch_bounds__(256, kBlocksPerSm)
    pipe_fp8_gemv_kernel(const float* x, const std::uint8_t* w, const float* scales,
                         std::int64_t grid_cols, float* y, std::int64_t in, std::int64_t out) {
  using C = fs::cuda::WeightChunk<fs::cuda::e4m3_bits, true>;
  using L = fs::cuda::StagedX<C::kN, 32>;
  constexpr int kN = C::kN;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t chunks = in / kN, warps = gridDim.x * 8LL;
  std::int64_t r = blockIdx.x * 8LL + threadIdx.x / 32;
  uint4 cur[kU];
  float sc[kU];
  const auto load = [&](std::int64_t row, uint4(&raw)[kU], float(&scale)[kU]) {
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + 32LL * u;
      const bool live = row < out && c < chunks;
      raw[u] = live ? fs::cuda::load_streaming(w + row * in + c * kN) : uint4{};
      scale[u] = live ? __ldg(scales + (row / 128) * grid_cols + c * kN / 128) : 0.0f;
    }
  };
  load(r, cur, sc);
  fs::cuda::stage_x<kN, 32, 1>(x, 0, chunks);
  for (; r < out; r += warps) {
    uint4 nxt[kU];
    float nsc[kU];
    load(r + warps, nxt, nsc);
    float acc = 0.0f;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const std::int64_t c = lane + 32LL * u;
      if (c >= chunks) break;
      float d = 0.0f;
#pragma unroll
      for (int i = 0; i < kN / 4; ++i) {
        float w4[4];
        C::widen_word(cur[u], i, w4);
        const float4 v = fs::cuda::staged_x[L::at(c, i)];
        d = fmaf(w4[0], v.x, d);
        d = fmaf(w4[1], v.y, d);
        d = fmaf(w4[2], v.z, d);
        d = fmaf(w4[3], v.w, d);
      }
      acc = fmaf(d, sc[u], acc);
    }
    acc = fs::cuda::group_sum<32>(acc);
    if (lane == 0) y[r] = acc;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      cur[u] = nxt[u];
      sc[u] = nsc[u];
    }
  }
}

template <int kU, int kBlocksPerSm>
void launch_pipe(const float* x, const std::uint8_t* w, const float* scales, std::int64_t grid_cols,
                 float* y, std::int64_t in, std::int64_t out, cudaStream_t s) {
  using L = fs::cuda::StagedX<16, 32>;
  const auto smem = static_cast<std::size_t>(L::token_words(in / 16)) * sizeof(float4);
  static bool opted = false;
  if (!opted) {
    cudaFuncSetAttribute(pipe_fp8_gemv_kernel<kU, kBlocksPerSm>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024);
    opted = true;
  }
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  pipe_fp8_gemv_kernel<kU, kBlocksPerSm>
      <<<static_cast<unsigned>(sms * kBlocksPerSm), 256, smem, s>>>(x, w, scales, grid_cols, y, in,
                                                                    out);
}

// A read-only stream over `bytes` (16-byte loads, grid-stride, an xor kept so nothing is
// dropped): the floor of what any kernel reading that many weights once can take, against which
// the GEMVs' times are read.
__global__ void read_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  unsigned v = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const uint4 a = fs::cuda::load_streaming(p + i);
    v ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (v == 0x9e3779b9u) *sink = v;
}

}  // namespace forms

// The bytes a one-token product on block-scaled FP8 [out, in] reads: codes and scales.
double fp8_bytes(std::int64_t in, std::int64_t out) {
  return static_cast<double>(in * out) + static_cast<double>(blocks(in) * blocks(out)) * 4;
}

// The probes' weights: copies of a random FP8 [out, in] enough to touch 1 GB (cold calls), with no
// NaN codes (the probes compare their outputs with the backend's).
Fp8Weights make_probe_fp8(std::int64_t in, std::int64_t out, cudaStream_t s) {
  auto w = make_fp8(1, out, in, std::size_t{1} << 30, s, 23);
  forms::no_nan_kernel<<<4096, 256, 0, s>>>(static_cast<std::uint8_t*>(w.codes.get()),
                                            w.code_stride * static_cast<std::size_t>(w.copies));
  return w;
}

// The backend's FP8 GEMV (one token, cold weights) beside the tensor-core probe above in a few
// splits of the columns, each compared with the backend's output (max |diff| / max |y|).
void bench_forms(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out,
                 const std::string& name, std::vector<Row>& rows) {
  const double wbytes = fp8_bytes(in, out);
  auto w = make_probe_fp8(in, out, s);
  const int n = std::max(w.copies, 16);
  fs::Tensor x = be.new_tensor({1, in});
  fill(x.raw(), static_cast<std::size_t>(in), false, 1.0f, 99, s);
  fs::Tensor y;
  const std::string shape = std::to_string(in) + "->" + std::to_string(out) + " fp8";
  const double t = time_calls(s, n, [&](int i) {
    be.linear(x, w.view(i % w.copies, {out, in}), y);
  });
  rows.push_back({name, shape, "fma", 1, wbytes, t, 0});
  be.linear(x, w.view(0, {out, in}), y);
  auto ym = device_alloc(static_cast<std::size_t>(out) * 4);
  const auto grid_cols = blocks(in);
  const auto probe = [&](const char* impl, auto kernel_launch) {
    const double tm = time_calls(s, n, [&](int i) {
      const auto v = w.view(i % w.copies, {out, in});
      kernel_launch(x.data(), v.data, reinterpret_cast<const float*>(v.scales.data), grid_cols,
                    static_cast<float*>(ym.get()), in, out, s);
    });
    const auto v = w.view(0, {out, in});
    kernel_launch(x.data(), v.data, reinterpret_cast<const float*>(v.scales.data), grid_cols,
                  static_cast<float*>(ym.get()), in, out, s);
    cudaStreamSynchronize(s);
    const auto err = cudaGetLastError();
    if (err != cudaSuccess) std::fprintf(stderr, "mma %s: %s\n", impl, cudaGetErrorString(err));
    rows.push_back(
        {name, shape, impl, 1, wbytes, tm,
         max_rel_diff(y, static_cast<const float*>(ym.get()), static_cast<std::size_t>(out))});
  };
  {
    // The same bytes read by a plain stream (the rows' codes only), a different copy each call.
    auto sink = device_alloc(4);
    const auto n16 = static_cast<std::size_t>(in * out) / 16;
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (const int per_sm : {4, 8}) {
      const double tr = time_calls(s, n, [&](int i) {
        forms::read_kernel<<<sms * per_sm, 256, 0, s>>>(
            reinterpret_cast<const uint4*>(w.view(i % w.copies, {out, in}).data), n16,
            static_cast<unsigned*>(sink.get()));
      });
      rows.push_back(
          {name, shape, per_sm == 4 ? "read4" : "read8", 1, static_cast<double>(in * out), tr, 0});
    }
  }
  if (in == 2560) {
    probe("pipe2", forms::launch_pipe<5, 2>);
    probe("pipe3", forms::launch_pipe<5, 3>);
    probe("pipe4", forms::launch_pipe<5, 4>);
  } else if (in == 6144) {
    probe("pipe2", forms::launch_pipe<12, 2>);
    probe("pipe3", forms::launch_pipe<12, 3>);
  }
  if ((in / 4) % 128 == 0) {
    probe("mma4r2", forms::launch<4, 2>);
    probe("mma4r4", forms::launch<4, 4>);
  }
  if ((in / 8) % 128 == 0) probe("mma8r2", forms::launch<8, 2>);
  if ((in / 2) % 128 == 0) probe("mma2r4", forms::launch<2, 4>);
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// --- --staged: a chain of FP8 products whose weights land in shared memory before their wait -----
// The step is a chain of ~700 kernels; each one-token product pays ~2.5 us over its bytes in it
// (session 18: ~1.2 us the boundary, the rest its own work after the wait, because its weights
// are read after the wait: only its first round of loads goes out before). This probe asks what
// a product costs when its block's whole slice of W is copied into shared memory by the copy
// engine of the multiprocessor (cp.async.bulk onto an mbarrier) BEFORE its wait, and when the
// kernel lets the next one launch at its start rather than after its wait, so that two products
// share a multiprocessor (each under half its shared memory): one computing, the next loading.
// A grid of one block a multiprocessor, each block a contiguous run of rows, staged in two halves
// (a ring: the third half-stage loads once the first is used, for slices over ~100 KB).
// Variants (rows "staged", impl):
//   early      release at the start, weights staged before the wait (the form asked about);
//   late       release after the wait (the backend's rule), weights staged before it;
//   after      release at the start, weights staged after the wait;
//   nocompute  as early, but each row only touched (one word a lane): the floor of this form;
//   early+2s   early, with two small kernels (a 2560-float scale, 1 block, released at their
//              start too) between products, as norms and mixes sit between the step's products;
//   fma+2s     the backend's linear with the same two small kernels between products.
// maxdiff: y of the computing variants against the backend's linear on the same weights.
namespace staged {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Weights staged a block: two of these kernels (plus x) fit one multiprocessor's 228 KB.
constexpr int kStageBytes = 100 * 1024;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void bulk_to_shared(void* dst, const void* src, unsigned bytes,
                                               std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void bar_wait(std::uint64_t* bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
}

enum class Form { kEarly, kLate, kAfter, kNoCompute };

// y = W x for block-scaled e4m3 W [out, in] (in a multiple of 512), one block per
// `rows_per_block` rows, staged `stage_rows` rows at a time in two halves.
template <Form kForm>
__global__ void __launch_bounds__(kThreads, 1)
    staged_kernel(const float* x, const std::uint8_t* w, const float* scales,
                  std::int64_t grid_cols, float* y, int in, int out, int rows_per_block,
                  int stage_rows) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  __shared__ std::uint64_t bar[2];
  constexpr bool kEarlyRelease = kForm != Form::kLate;
  constexpr bool kPreload = kForm != Form::kAfter;
  if constexpr (kEarlyRelease) fs::cuda::release_dependents();
  const int row0 = blockIdx.x * rows_per_block;
  const int rows = min(rows_per_block, out - row0);
  const int phases = (rows + stage_rows - 1) / stage_rows;
  std::uint8_t* half[2] = {smem, smem + static_cast<std::size_t>(stage_rows) * in};
  float4* xs = reinterpret_cast<float4*>(smem + 2 * static_cast<std::size_t>(stage_rows) * in);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[0])));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&bar[1])));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const auto issue = [&](int p) {
    const int r = p * stage_rows, n = min(stage_rows, rows - r);
    bulk_to_shared(half[p & 1], w + static_cast<std::size_t>(row0 + r) * in,
                   static_cast<unsigned>(n) * in, &bar[p & 1]);
  };
  if (kPreload && threadIdx.x == 0)
    for (int p = 0; p < min(phases, 2); ++p) issue(p);
  fs::cuda::wait_for_inputs();
  if constexpr (!kEarlyRelease) fs::cuda::release_dependents();
  if (!kPreload && threadIdx.x == 0)
    for (int p = 0; p < min(phases, 2); ++p) issue(p);
  // x as float4 word i of chunk c at xs[i * chunks + c]: a warp's lanes read consecutive float4s.
  const int chunks = in / 16;
  for (int j = threadIdx.x; j < chunks * 4; j += kThreads)
    xs[(j % 4) * chunks + j / 4] = reinterpret_cast<const float4*>(x)[j];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int p = 0; p < phases; ++p) {
    bar_wait(&bar[p & 1], (p >> 1) & 1);
    const int r_begin = p * stage_rows, n = min(stage_rows, rows - r_begin);
    const std::uint8_t* buf = half[p & 1];
    for (int r = warp; r < n; r += kWarps) {
      const int row = row0 + r_begin + r;
      const auto* wr = reinterpret_cast<const uint4*>(buf + static_cast<std::size_t>(r) * in);
      float acc = 0.0f;
      if constexpr (kForm == Form::kNoCompute) {
        acc = __uint_as_float(wr[lane].x & 0x3f7fffffu);
      } else {
        const float* srow = scales + (row / 128) * grid_cols;
        for (int c = lane; c < chunks; c += 32) {
          const uint4 v = wr[c];
          const unsigned words[4] = {v.x, v.y, v.z, v.w};
          float d = 0.0f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float4 xv = xs[i * chunks + c];
            const float2 lo = fs::cuda::e4m3_pair(static_cast<unsigned short>(words[i] & 0xffffu));
            const float2 hi = fs::cuda::e4m3_pair(static_cast<unsigned short>(words[i] >> 16));
            d = fmaf(lo.x, xv.x, d);
            d = fmaf(lo.y, xv.y, d);
            d = fmaf(hi.x, xv.z, d);
            d = fmaf(hi.y, xv.w, d);
          }
          acc = fmaf(d, __ldg(srow + c / 8), acc);
        }
      }
      acc = warp_sum(acc);
      if (lane == 0) y[row] = acc;
    }
    __syncthreads();  // the half is free again
    if (threadIdx.x == 0 && p + 2 < phases) issue(p + 2);
  }
}

// A small op between products: y = 0.5 x over 2560 floats, one block, released at its start.
__global__ void small_kernel(float* v, int n) {
  fs::cuda::release_dependents();
  fs::cuda::wait_for_inputs();
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] *= 0.5f;
}

struct Shape {
  int rows_per_block = 0, stage_rows = 0, grid = 0;
  std::size_t smem = 0;
};
Shape shape_for(int in, int out, int sms) {
  Shape s;
  s.rows_per_block = (out + sms - 1) / sms;
  s.grid = (out + s.rows_per_block - 1) / s.rows_per_block;
  const int fit = kStageBytes / (2 * in);  // rows a half holds
  s.stage_rows = std::max(1, std::min((s.rows_per_block + 1) / 2, fit));
  s.smem = 2 * static_cast<std::size_t>(s.stage_rows) * in + static_cast<std::size_t>(in) * 4;
  return s;
}

template <Form kForm>
void launch(const Shape& sh, const float* x, const std::uint8_t* w, const float* scales,
            std::int64_t grid_cols, float* y, int in, int out, cudaStream_t s) {
  static bool opted = false;
  if (!opted) {
    cudaFuncSetAttribute(staged_kernel<kForm>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         200 * 1024);
    opted = true;
  }
  fs::cuda::launch_overlapped(staged_kernel<kForm>, dim3(static_cast<unsigned>(sh.grid)),
                              dim3(kThreads), sh.smem, s, x, w, scales, grid_cols, y, in, out,
                              sh.rows_per_block, sh.stage_rows);
}

void launch_small(float* v, int n, cudaStream_t s) {
  fs::cuda::launch_overlapped(small_kernel, dim3(1), dim3(256), 0, s, v, n);
}

}  // namespace staged

void bench_staged(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out,
                  const std::string& name, std::vector<Row>& rows) {
  const double wbytes = fp8_bytes(in, out);
  auto w = make_probe_fp8(in, out, s);
  const int n = std::max(w.copies, 32);
  fs::Tensor x = be.new_tensor({1, in});
  fill(x.raw(), static_cast<std::size_t>(in), false, 1.0f, 99, s);
  fs::Tensor small = be.new_tensor({1, 2560});
  fill(small.raw(), 2560, false, 1.0f, 98, s);
  fs::Tensor y;
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const auto sh = staged::shape_for(static_cast<int>(in), static_cast<int>(out), sms);
  const std::string shape = std::to_string(in) + "->" + std::to_string(out) + " fp8 r" +
                            std::to_string(sh.rows_per_block) + "/" +
                            std::to_string(sh.stage_rows) + " " + std::to_string(sh.smem / 1024) +
                            "KB";
  be.linear(x, w.view(0, {out, in}), y);
  auto ys = device_alloc(static_cast<std::size_t>(out) * 4);
  const auto grid_cols = blocks(in);
  rows.push_back({name, shape, "fma", 1, wbytes,
                  time_calls(s, n,
                             [&](int i) {
                               be.linear(x, w.view(i % w.copies, {out, in}), y);
                             }),
                  0});
  be.linear(x, w.view(0, {out, in}), y);  // the reference: copy 0, as each probe's check call
  const auto probe = [&](const char* impl, auto launcher, bool smalls) {
    const auto call = [&](int i) {
      const auto v = w.view(i % w.copies, {out, in});
      if (smalls)
        for (int k = 0; k < 2; ++k) staged::launch_small(small.data(), 2560, s);
      launcher(sh, x.data(), v.data, reinterpret_cast<const float*>(v.scales.data), grid_cols,
               static_cast<float*>(ys.get()), static_cast<int>(in), static_cast<int>(out), s);
    };
    const double t = time_calls(s, n, call);
    cudaMemsetAsync(ys.get(), 0, static_cast<std::size_t>(out) * 4, s);
    call(0);
    cudaStreamSynchronize(s);
    const auto err = cudaGetLastError();
    if (err != cudaSuccess) std::fprintf(stderr, "staged %s: %s\n", impl, cudaGetErrorString(err));
    rows.push_back(
        {name, shape, impl, 1, wbytes, t,
         max_rel_diff(y, static_cast<const float*>(ys.get()), static_cast<std::size_t>(out))});
  };
  probe("early", staged::launch<staged::Form::kEarly>, false);
  probe("late", staged::launch<staged::Form::kLate>, false);
  probe("after", staged::launch<staged::Form::kAfter>, false);
  probe("nocomp", staged::launch<staged::Form::kNoCompute>, false);
  probe("early+2s", staged::launch<staged::Form::kEarly>, true);
  rows.push_back({name, shape, "fma+2s", 1, wbytes,
                  time_calls(s, n,
                             [&](int i) {
                               for (int k = 0; k < 2; ++k)
                                 staged::launch_small(small.data(), 2560, s);
                               be.linear(x, w.view(i % w.copies, {out, in}), y);
                             }),
                  0});
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// --- the tensor-core GEMV with x staged once for many row tiles (session 20) --------------------
// Session 19's tensor-core form (forms::fp8_mma_gemv_kernel) took a block per 16 rows, each block
// converting and staging all of x for its tokens: at four tokens on 2560 -> 12288, 31 MB of L2
// reads for 31 MB of weights. Here a block of kWarpsK warps takes `tiles` consecutive 16-row
// tiles (runtime), its warps splitting the columns (a span of whole 64-column groups each; a
// 128-column scale block may straddle two warps: each warp multiplies its own part by the scale),
// and each warp walks its (tile, group) items in order with kAhead items' loads in flight across
// tile boundaries. x is converted to f16 high and low parts once a block (each warp its span).
// A tile's partial sums go to shared memory per warp and are added in warp order, so a row's sum
// depends on kWarpsK only: not on the tiles a block, nor on the tokens (column 2t + p of B is
// token t's part p). Launched overlapped, its first items' loads before the wait.
namespace tc {

template <int kWarpsK, int kAhead, int kS>
__global__ void __launch_bounds__(32 * kWarpsK, 1)
    tiles_kernel(const float* x, const std::uint8_t* w, const float* scales, std::int64_t grid_cols,
                 float* y, std::int64_t in, std::int64_t out, int tiles) {
  extern __shared__ __half2 tc_smem[];
  __half2* xs = tc_smem;                                      // [kS][in / 2 * 2] halves
  float* part = reinterpret_cast<float*>(tc_smem + kS * in);  // [tiles][kWarpsK][kS][16]
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, q = lane % 4;
  const std::int64_t span = in / kWarpsK, c_begin = warp * span;
  const int groups = static_cast<int>(span / 64);
  const std::int64_t tile0 = blockIdx.x * static_cast<std::int64_t>(tiles);
  const std::int64_t left = out / 16 - tile0;
  const int my_tiles = static_cast<int>(left < tiles ? left : tiles);
  const int items = my_tiles * groups;
  const auto row_ptr = [&](int i) {
    const std::int64_t row = (tile0 + i / groups) * 16 + g;
    return w + row * in + c_begin + (i % groups) * 64 + q * 16;
  };
  // An item's block scale, loaded beside its weights (a load inside the sums stalls the warp).
  const auto scale_of = [&](int i) {
    return __ldg(scales + ((tile0 + i / groups) * 16 / 128) * grid_cols +
                 (c_begin + (i % groups) * 64) / 128);
  };
  uint4 a[kAhead][2];
  float sa[kAhead];
#pragma unroll
  for (int r = 0; r < kAhead; ++r)
    if (r < items) {
      a[r][0] = forms::load_stream(row_ptr(r));
      a[r][1] = forms::load_stream(row_ptr(r) + 8 * in);
      sa[r] = scale_of(r);
    }
  fs::cuda::wait_for_inputs();
  fs::cuda::release_dependents();
  forms::stage_x_parts<kS>(x, xs, in, warp, span, lane);
  const __half2* xsrc = xs + (g / 2) * in + warp * span + (g % 2) * (span / 2);
  float tot[4] = {}, blk[4] = {};
  for (int i0 = 0; i0 < items; i0 += kAhead) {
    uint4 nxt[kAhead][2];
    float sn[kAhead];
#pragma unroll
    for (int r = 0; r < kAhead; ++r)
      if (i0 + kAhead + r < items) {
        nxt[r][0] = forms::load_stream(row_ptr(i0 + kAhead + r));
        nxt[r][1] = forms::load_stream(row_ptr(i0 + kAhead + r) + 8 * in);
        sn[r] = scale_of(i0 + kAhead + r);
      }
#pragma unroll
    for (int r = 0; r < kAhead; ++r) {
      const int i = i0 + r;
      if (i >= items) break;
      const int G = i % groups;
      forms::group_mma<kS>(blk, a[r][0], a[r][1], xsrc, G, g, q);
      const std::int64_t k = c_begin + G * 64;
      const bool last = G == groups - 1;
      if (last || (k + 64) % 128 == 0) {  // the scale block ends, or this warp's span does
        const float sc = sa[r];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          tot[e] = fmaf(blk[e], sc, tot[e]);
          blk[e] = 0.0f;
        }
      }
      if (last) {
        if (q < kS) {  // thread q holds columns 2q and 2q + 1: token q's two parts
          float* pt = part + ((i / groups) * kWarpsK + warp) * kS * 16 + q * 16;
          pt[g] = tot[0] + tot[1];
          pt[g + 8] = tot[2] + tot[3];
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) tot[e] = 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < kAhead; ++r) {
      a[r][0] = nxt[r][0];
      a[r][1] = nxt[r][1];
      sa[r] = sn[r];
    }
  }
  __syncthreads();
  for (int o = static_cast<int>(threadIdx.x); o < my_tiles * kS * 16; o += blockDim.x) {
    const int tl = o / (kS * 16), t = (o / 16) % kS, rr = o % 16;
    float v = 0.0f;
    for (int k = 0; k < kWarpsK; ++k) v += part[((tl * kWarpsK) + k) * kS * 16 + t * 16 + rr];
    y[t * out + (tile0 + tl) * 16 + rr] = v;
  }
}

template <int kWarpsK, int kAhead, int kS>
void launch(const float* x, const std::uint8_t* w, const float* scales, std::int64_t grid_cols,
            float* y, std::int64_t in, std::int64_t out, int tiles, cudaStream_t s) {
  const auto smem = static_cast<std::size_t>(in) * 4 * kS +
                    static_cast<std::size_t>(tiles) * kWarpsK * kS * 16 * 4;
  static bool opted = false;
  if (!opted) {
    cudaFuncSetAttribute(tiles_kernel<kWarpsK, kAhead, kS>,
                         cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
    opted = true;
  }
  const auto all = out / 16;
  fs::cuda::launch_overlapped(
      tiles_kernel<kWarpsK, kAhead, kS>, dim3(static_cast<unsigned>((all + tiles - 1) / tiles)),
      dim3(32 * kWarpsK), smem, s, x, w, scales, grid_cols, y, in, out, tiles);
}

// Token counts 1-4 at run time.
template <int kWarpsK, int kAhead>
void launch_s(int S, const float* x, const std::uint8_t* w, const float* scales,
              std::int64_t grid_cols, float* y, std::int64_t in, std::int64_t out, int tiles,
              cudaStream_t s) {
  switch (S) {
    case 1:
      return launch<kWarpsK, kAhead, 1>(x, w, scales, grid_cols, y, in, out, tiles, s);
    case 2:
      return launch<kWarpsK, kAhead, 2>(x, w, scales, grid_cols, y, in, out, tiles, s);
    case 3:
      return launch<kWarpsK, kAhead, 3>(x, w, scales, grid_cols, y, in, out, tiles, s);
    default:
      return launch<kWarpsK, kAhead, 4>(x, w, scales, grid_cols, y, in, out, tiles, s);
  }
}

}  // namespace tc

// --- --tokens: the FP8 GEMV at 1-4 tokens, the backend's FMA form beside the tensor-core form ----
// An MTP verify runs the step's products over 2-4 tokens, and the backend's FMA GEMV takes ~2x
// its one-token time at four (session 15: the out-projection 6.9 -> 14.3 us): per weight it
// issues a conversion and one FMA a token, so at four tokens the instruction issue, not the
// bytes, bounds it. The tensor-core form (forms::fp8_mma_gemv_kernel) carries four tokens in the
// 8 columns of one mma (a token's high and low f16 parts), so its instructions do not grow with
// the tokens. Rows: impl "fma" / "mma", tokens S; maxdiff of mma against the backend at the same
// S; "mma=S1" counts the rows whose token-0 value at S differs from the one-token call's (a
// column's sums should not depend on the other columns: 0 expected).
void bench_tokens(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out,
                  const std::string& name, std::vector<Row>& rows) {
  const double wbytes = fp8_bytes(in, out);
  auto w = make_probe_fp8(in, out, s);
  const int n = std::max(w.copies, 16);
  const std::string shape = std::to_string(in) + "->" + std::to_string(out) + " fp8";
  fs::Tensor x = be.new_tensor({4, in});
  fill(x.raw(), static_cast<std::size_t>(4 * in), false, 1.0f, 99, s);
  auto ym = device_alloc(static_cast<std::size_t>(4 * out) * 4);
  std::vector<float> one(static_cast<std::size_t>(out));
  std::map<std::string, std::vector<float>> tc_one;  // each tiled form's one-token values
  const auto grid_cols = blocks(in);
  const auto mma = [&](int S, const fs::Weight& v) {
    const auto* sc = reinterpret_cast<const float*>(v.scales.data);
    auto* y = static_cast<float*>(ym.get());
    const bool wide = in % (8 * 128) == 0;
    switch (S) {
      case 1:
        (wide ? forms::launch<8, 2, 1> : forms::launch<4, 2, 1>)(x.data(), v.data, sc, grid_cols, y,
                                                                 in, out, s);
        break;
      case 2:
        (wide ? forms::launch<8, 2, 2> : forms::launch<4, 2, 2>)(x.data(), v.data, sc, grid_cols, y,
                                                                 in, out, s);
        break;
      case 3:
        (wide ? forms::launch<8, 2, 3> : forms::launch<4, 2, 3>)(x.data(), v.data, sc, grid_cols, y,
                                                                 in, out, s);
        break;
      default:
        (wide ? forms::launch<8, 2, 4> : forms::launch<4, 2, 4>)(x.data(), v.data, sc, grid_cols, y,
                                                                 in, out, s);
    }
  };
  for (int S = 1; S <= 4; ++S) {
    fs::Tensor xs = be.new_tensor({S, in});  // x's first S rows (the fill is by index)
    fill(xs.raw(), static_cast<std::size_t>(S * in), false, 1.0f, 99, s);
    fs::Tensor y;
    const double tf = time_calls(s, n, [&](int i) {
      be.linear(xs, w.view(i % w.copies, {out, in}), y);
    });
    rows.push_back({name, shape, "fma", S, wbytes, tf, 0});
    const double tm = time_calls(s, n, [&](int i) { mma(S, w.view(i % w.copies, {out, in})); });
    be.linear(xs, w.view(0, {out, in}), y);
    mma(S, w.view(0, {out, in}));
    cudaStreamSynchronize(s);
    const auto err = cudaGetLastError();
    if (err != cudaSuccess) std::fprintf(stderr, "mma S%d: %s\n", S, cudaGetErrorString(err));
    rows.push_back(
        {name, shape, "mma", S, wbytes, tm,
         max_rel_diff(y, static_cast<const float*>(ym.get()), static_cast<std::size_t>(S * out))});
    std::vector<float> got(static_cast<std::size_t>(out));
    cudaMemcpy(got.data(), ym.get(), got.size() * 4, cudaMemcpyDeviceToHost);
    if (S == 1) one = got;
    std::size_t differ = 0;
    for (std::size_t r = 0; r < got.size(); ++r) differ += std::memcmp(&got[r], &one[r], 4) != 0;
    rows.push_back({name, shape, "mma=S1", S, 0, 1e-30, static_cast<double>(differ)});
    // The tiled tensor-core form: one or two blocks a multiprocessor's worth of tiles, a few
    // splits of the columns and depths of loads in flight. "tcW/Aa/Tt": W warps, A items ahead,
    // t tiles a block; its rows "=S1" count the token-0 values that differ from its S = 1 call.
    int sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    const auto all_tiles = out / 16;
    using Launch = void (*)(int, const float*, const std::uint8_t*, const float*, std::int64_t,
                            float*, std::int64_t, std::int64_t, int, cudaStream_t);
    struct TcForm {
      int warps, ahead;
      Launch launch;
    };
    std::vector<TcForm> tc_forms;
    if ((in / 8) % 64 == 0) {
      tc_forms.push_back({8, 4, tc::launch_s<8, 4>});
      tc_forms.push_back({8, 6, tc::launch_s<8, 6>});
    }
    if (in % (16 * 64) == 0 || (in / 16) % 64 == 0)
      tc_forms.push_back({16, 4, tc::launch_s<16, 4>});
    if ((in / 10) % 64 == 0 && in % 10 == 0) tc_forms.push_back({10, 4, tc::launch_s<10, 4>});
    for (const auto& f : tc_forms) {
      int last_tiles = 0;
      for (const int per_sm : {1, 2, 3}) {
        const int tiles = static_cast<int>(
            std::max<std::int64_t>(1, (all_tiles + sms * per_sm - 1) / (sms * per_sm)));
        if (tiles == last_tiles) continue;
        last_tiles = tiles;
        const auto call = [&](int i) {
          const auto v = w.view(i % w.copies, {out, in});
          f.launch(S, xs.data(), v.data, reinterpret_cast<const float*>(v.scales.data), grid_cols,
                   static_cast<float*>(ym.get()), in, out, tiles, s);
        };
        const double tt = time_calls(s, n, call);
        call(0);
        cudaStreamSynchronize(s);
        const auto e2 = cudaGetLastError();
        if (e2 != cudaSuccess) std::fprintf(stderr, "tc S%d: %s\n", S, cudaGetErrorString(e2));
        const std::string impl = "tc" + std::to_string(f.warps) + "/a" + std::to_string(f.ahead) +
                                 "/t" + std::to_string(tiles);
        rows.push_back({name, shape, impl, S, wbytes, tt,
                        max_rel_diff(y, static_cast<const float*>(ym.get()),
                                     static_cast<std::size_t>(S * out))});
        std::vector<float> mine(static_cast<std::size_t>(out));
        cudaMemcpy(mine.data(), ym.get(), mine.size() * 4, cudaMemcpyDeviceToHost);
        auto& ref = tc_one[impl];
        if (S == 1) ref = mine;
        std::size_t d = 0;
        for (std::size_t r = 0; r < mine.size() && r < ref.size(); ++r)
          d += std::memcmp(&mine[r], &ref[r], 4) != 0;
        rows.push_back({name, shape, impl + "=S1", S, 0, 1e-30, static_cast<double>(d)});
      }
    }
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// --- --hc: the hyper-connection read at 1-4 tokens -------------------------------------------
// An MTP verify's read of 2-4 tokens took 17-19 us a call against 10 at one token inside the step
// (bench --marginal-verify, session 19). The op alone at the released shapes (4 streams of 2560,
// rank 320, bf16 matrices, a different copy each call), us per call, for each form of its first
// kernel (below).
void bench_hc(fs::Backend& be, cudaStream_t s, std::vector<Row>& rows) {
  constexpr std::int64_t kStreams = 4, W = 2560, in = kStreams * W, rank = 320;
  auto down = make_weights(static_cast<std::size_t>(rank * in), true, std::size_t{1} << 30, s, 41);
  auto up = make_weights(static_cast<std::size_t>(in * rank), true, std::size_t{1} << 30, s, 43);
  auto inj =
      make_weights(static_cast<std::size_t>(kStreams * in), true, std::size_t{1} << 28, s, 47);
  auto norm = make_weights(static_cast<std::size_t>(in), false, 0, s, 53);
  const fs::Weight nw = norm.view(0, fs::DType::kF32, {in});
  const int n = std::max(down.copies, 16);
  const double wbytes = static_cast<double>(2 * rank * in + kStreams * in) * 2;
  // The forms of the first kernel: split by stream with kR rows a block (session 36, the
  // default), whole rows (FLASHSERVE_CUDA_HC_SPLIT=0) with kR rows a block
  // (FLASHSERVE_CUDA_HC_DOWN_ROWS, session 20), session 19's one row a block, and the form before
  // it (FLASHSERVE_CUDA_OLD_HC_DOWN=1).
  struct Form {
    const char* name;
    const char* rows;
    bool old;
    bool split;
  };
  for (const Form& form : {Form{"split3", "3", false, true}, Form{"rows3", "3", false, false},
                           Form{"split1", "1", false, true}, Form{"split2", "2", false, true},
                           Form{"split4", "4", false, true}, Form{"rows1", "1", false, false},
                           Form{"old", "1", true, false}}) {
    setenv("FLASHSERVE_CUDA_HC_SPLIT", form.split ? "1" : "0", 1);
    setenv("FLASHSERVE_CUDA_HC_DOWN_ROWS", form.rows, 1);
    if (form.old)
      setenv("FLASHSERVE_CUDA_OLD_HC_DOWN", "1", 1);
    else
      unsetenv("FLASHSERVE_CUDA_OLD_HC_DOWN");
    for (int S = 1; S <= 4; ++S) {
      fs::Tensor h = be.new_tensor({S, in});
      fill(h.raw(), static_cast<std::size_t>(S * in), false, 1.0f, 61 + S, s);
      fs::Tensor mixed, inject;
      const double t = time_calls(s, n, [&](int i) {
        be.hyper_connection_read(h, nw, down.view(i % down.copies, fs::DType::kBF16, {rank, in}),
                                 up.view(i % up.copies, fs::DType::kBF16, {in, rank}),
                                 inj.view(i % inj.copies, fs::DType::kBF16, {kStreams, in}),
                                 kStreams, W, 1e-6f, mixed, &inject);
      });
      rows.push_back({"hc_read", "4x2560 r320 bf16", form.name, S, wbytes, t, 0});
    }
  }
  unsetenv("FLASHSERVE_CUDA_OLD_HC_DOWN");
  unsetenv("FLASHSERVE_CUDA_HC_DOWN_ROWS");
  unsetenv("FLASHSERVE_CUDA_HC_SPLIT");
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

void bench_moe_fp8(fs::Backend& be, cudaStream_t s, std::vector<Row>& rows, bool quick) {
  constexpr std::int64_t E = 512, K = 10, H = 2560, I = 640;
  auto gate_up = make_fp8(E, 2 * I, H, 0, s, 31);
  auto down = make_fp8(E, H, I, 0, s, 37);
  const fs::Weight gu = gate_up.view(0, {E, 2 * I, H}), dn = down.view(0, {E, H, I});
  const double per_expert =
      static_cast<double>(3 * I * H) +
      static_cast<double>(blocks(2 * I) * blocks(H) + blocks(H) * blocks(I)) * 4;
  const int calls = quick ? 8 : 32;
  std::mt19937 rng(4321);
  for (int S = 1; S <= 4; ++S) {
    std::vector<fs::Tensor> ids, wts;
    double distinct_total = 0;
    for (int c = 0; c < calls; ++c) {
      std::vector<std::int32_t> id(static_cast<std::size_t>(S * K));
      std::vector<float> wt(id.size());
      std::vector<std::int32_t> all(E);
      std::vector<bool> seen(E);
      for (int t = 0; t < S; ++t) {
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < K; ++j) {
          id[static_cast<std::size_t>(t * K + j)] = all[static_cast<std::size_t>(j)];
          wt[static_cast<std::size_t>(t * K + j)] = 1.0f / K;
          seen[static_cast<std::size_t>(all[static_cast<std::size_t>(j)])] = true;
        }
      }
      distinct_total += static_cast<double>(std::count(seen.begin(), seen.end(), true));
      fs::Tensor hi = fs::Tensor(fs::host_memory(), {S, K}, fs::DType::kI32);
      std::memcpy(hi.raw(), id.data(), id.size() * sizeof(std::int32_t));
      ids.push_back(hi.to(be.memory()));
      wts.push_back(fs::Tensor({S, K}, wt).to(be.memory()));
    }
    fs::Tensor x = be.new_tensor({S, H});
    fill(x.raw(), static_cast<std::size_t>(S * H), false, 1.0f, 7 + S, s);
    fs::Tensor y;
    const double t = time_calls(s, calls, [&](int i) {
      be.moe_experts(x, gu, dn, ids[static_cast<std::size_t>(i)], wts[static_cast<std::size_t>(i)],
                     0, y);
    });
    rows.push_back({"moe_experts", "E512 k10 H2560 I640 fp8", "fp8", S,
                    distinct_total / calls * per_expert, t, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// Packed weights (backend/weight.h): random bytes (timing does not depend on them), FP4 with its
// [out, in/32] E8M0 bytes. Bytes count the blocks and scales read.
struct PackedFormat {
  const char* name;
  fs::quant::QuantType type;
};
const PackedFormat kPackedFormats[] = {
    {"fp4", fs::quant::QuantType::kF4E2M1x2},   {"q8_0", fs::quant::QuantType::kQ8_0},
    {"q4_k", fs::quant::QuantType::kQ4_K},      {"q5_k", fs::quant::QuantType::kQ5_K},
    {"q6_k", fs::quant::QuantType::kQ6_K},      {"q2_k", fs::quant::QuantType::kQ2_K},
    {"iq2_xxs", fs::quant::QuantType::kIQ2_XXS}};

struct PackedWeights {
  DeviceBuffer data, scales;
  std::size_t stride = 0, scale_stride = 0;
  int copies = 1;
  fs::quant::QuantType type{};
  fs::Weight view(int i, fs::Shape shape) const {
    fs::Weight w{
        fs::DType::kU8, std::move(shape),
        static_cast<const std::uint8_t*>(data.get()) + stride * static_cast<std::size_t>(i),
        fs::Device::kCuda};
    w.packed = type;
    if (type == fs::quant::QuantType::kF4E2M1x2) {
      w.scales = {static_cast<const std::uint8_t*>(scales.get()) +
                      scale_stride * static_cast<std::size_t>(i),
                  fs::quant::ScaleFormat::kE8M0, 1, 32};
    }
    return w;
  }
  double bytes(const fs::Shape& shape) const {
    return static_cast<double>(view(0, shape).bytes() + view(0, shape).scale_bytes());
  }
};

PackedWeights make_packed(fs::quant::QuantType type, std::int64_t mats, std::int64_t out,
                          std::int64_t in, std::size_t touch_bytes, cudaStream_t s,
                          std::uint64_t seed) {
  PackedWeights w;
  w.type = type;
  const fs::Weight probe = w.view(0, {mats, out, in});
  const std::size_t bytes = probe.bytes();
  const std::size_t sbytes =
      type == fs::quant::QuantType::kF4E2M1x2 ? static_cast<std::size_t>(mats * out * in / 32) : 0;
  w.stride = (bytes + 255) / 256 * 256;
  w.scale_stride = (sbytes + 255) / 256 * 256;
  w.copies = static_cast<int>(std::clamp<std::size_t>((touch_bytes + bytes - 1) / bytes, 1, 2048));
  w.data = device_alloc(w.stride * static_cast<std::size_t>(w.copies));
  fill(w.data.get(), w.stride * static_cast<std::size_t>(w.copies) / 2, true, 1.0f, seed, s);
  if (sbytes > 0) {
    w.scales = device_alloc(w.scale_stride * static_cast<std::size_t>(w.copies));
    fill(w.scales.get(), w.scale_stride * static_cast<std::size_t>(w.copies) / 2, true, 1.0f,
         seed + 1, s);
  }
  return w;
}

void bench_gemv_packed(fs::Backend& be, cudaStream_t s, std::int64_t in, std::int64_t out,
                       const PackedFormat& f, const std::string& name, std::vector<Row>& rows) {
  auto w = make_packed(f.type, 1, out, in, std::size_t{1} << 30, s, 41);
  const double wbytes = w.bytes({out, in});
  const int n = std::max(w.copies, 16);
  for (int S = 1; S <= 4; ++S) {
    fs::Tensor x = be.new_tensor({S, in});
    fill(x.raw(), static_cast<std::size_t>(S * in), false, 1.0f, 99 + S, s);
    fs::Tensor y;
    be.linear(x, w.view(0, {out, in}), y);  // eagerly once: IQ2_XXS's codebook goes to the device
    const double t = time_calls(s, n, [&](int i) {
      be.linear(x, w.view(i % w.copies, {out, in}), y);
    });
    rows.push_back({name, std::to_string(in) + "->" + std::to_string(out) + " " + f.name, f.name, S,
                    wbytes, t, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// DeepSeek V4-sized routed experts (E256 k6 H4096 I2048: the FP4 release's expert shape) on one
// packed format, 1-4 tokens, a fresh random routing per call.
void bench_moe_packed(fs::Backend& be, cudaStream_t s, const PackedFormat& f,
                      std::vector<Row>& rows, bool quick) {
  constexpr std::int64_t E = 256, K = 6, H = 4096, I = 2048;
  auto gate_up = make_packed(f.type, E, 2 * I, H, 0, s, 51);
  auto down = make_packed(f.type, E, H, I, 0, s, 57);
  const fs::Weight gu = gate_up.view(0, {E, 2 * I, H}), dn = down.view(0, {E, H, I});
  const double per_expert = (gate_up.bytes({E, 2 * I, H}) + down.bytes({E, H, I})) / E;
  const int calls = quick ? 8 : 32;
  std::mt19937 rng(4321);
  for (int S = 1; S <= 4; ++S) {
    std::vector<fs::Tensor> ids, wts;
    double distinct_total = 0;
    for (int c = 0; c < calls; ++c) {
      std::vector<std::int32_t> id(static_cast<std::size_t>(S * K));
      std::vector<float> wt(id.size());
      std::vector<std::int32_t> all(E);
      std::vector<bool> seen(E);
      for (int t = 0; t < S; ++t) {
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < K; ++j) {
          id[static_cast<std::size_t>(t * K + j)] = all[static_cast<std::size_t>(j)];
          wt[static_cast<std::size_t>(t * K + j)] = 1.0f / K;
          seen[static_cast<std::size_t>(all[static_cast<std::size_t>(j)])] = true;
        }
      }
      distinct_total += static_cast<double>(std::count(seen.begin(), seen.end(), true));
      fs::Tensor hi = fs::Tensor(fs::host_memory(), {S, K}, fs::DType::kI32);
      std::memcpy(hi.raw(), id.data(), id.size() * sizeof(std::int32_t));
      ids.push_back(hi.to(be.memory()));
      wts.push_back(fs::Tensor({S, K}, wt).to(be.memory()));
    }
    fs::Tensor x = be.new_tensor({S, H});
    fill(x.raw(), static_cast<std::size_t>(S * H), false, 1.0f, 7 + S, s);
    fs::Tensor y;
    be.moe_experts(x, gu, dn, ids[0], wts[0], 0, y);  // eagerly once (as bench_gemv_packed)
    const double t = time_calls(s, calls, [&](int i) {
      be.moe_experts(x, gu, dn, ids[static_cast<std::size_t>(i)], wts[static_cast<std::size_t>(i)],
                     0, y);
    });
    rows.push_back({"moe_experts", std::string("E256 k6 H4096 I2048 ") + f.name, f.name, S,
                    distinct_total / calls * per_expert, t, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// The QSA decode path at context T (block 4, indexer 4 heads of 128, budget 2048 = top 512
// blocks; attention 24 query / 2 KV heads of 256) for 1-4 query rows: index_scores over the T/4
// block keys, select_blocks over those scores, block_sparse_attention over the picks plus the
// tail. "old" is the same op with FLASHSERVE_CUDA_OLD_CONTEXT=1 (the kernels before issue 14's
// context work, still in the backend). Bytes: the keys and K/V rows each op reads once.
void bench_context(fs::Backend& be, cudaStream_t s, std::int64_t T, std::vector<Row>& rows,
                   bool quick) {
  constexpr std::int64_t kBlock = 4, kTop = 512, kHeadsI = 4, kDimI = 128, Hq = 24, Hkv = 2,
                         D = 256;
  const std::int64_t B = T / kBlock;
  fs::Tensor keys = be.new_tensor({B, kDimI});
  fill(keys.raw(), static_cast<std::size_t>(B * kDimI), false, 1.0f, 31, s);
  fs::Tensor k = be.new_tensor({T, Hkv * D}), v = be.new_tensor({T, Hkv * D});
  fill(k.raw(), static_cast<std::size_t>(T * Hkv * D), false, 1.0f, 32, s);
  fill(v.raw(), static_cast<std::size_t>(T * Hkv * D), false, 1.0f, 33, s);
  const int calls = quick ? 8 : 32;
  const std::string shape = "T" + std::to_string(T) + " B" + std::to_string(B) + " top512";
  for (int S = 1; S <= 4; S *= 2) {
    const std::int64_t first = T - S;
    fs::Tensor qi = be.new_tensor({S, kHeadsI * kDimI}), q = be.new_tensor({S, Hq * D});
    fill(qi.raw(), static_cast<std::size_t>(S * kHeadsI * kDimI), false, 1.0f, 40 + S, s);
    fill(q.raw(), static_cast<std::size_t>(S * Hq * D), false, 1.0f, 50 + S, s);
    const float scale_i = 1.0f / std::sqrt(static_cast<float>(kDimI));
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    struct Out {
      fs::Tensor scores, picked, o;
    };
    Out outs[2];
    for (int old = 0; old < 2; ++old) {
      if (old)
        setenv("FLASHSERVE_CUDA_OLD_CONTEXT", "1", 1);
      else
        unsetenv("FLASHSERVE_CUDA_OLD_CONTEXT");
      Out& o = outs[old];
      const char* impl = old ? "old" : "new";
      const double t_idx =
          time_calls(s, calls, [&](int) { be.index_scores(qi, keys, kHeadsI, scale_i, o.scores); });
      const double t_sel = time_calls(
          s, calls, [&](int) { be.select_blocks(o.scores, first, kBlock, kTop, o.picked); });
      const double t_att = time_calls(s, old ? std::max(2, calls / 4) : calls, [&](int) {
        be.block_sparse_attention(q, k, v, Hq, Hkv, o.picked, kBlock, first, scale, o.o);
      });
      const double key_bytes = static_cast<double>(B * kDimI) * 4;
      const double kv_bytes = static_cast<double>(S) *
                              static_cast<double>(std::min(T, kTop * kBlock + kBlock)) * Hkv * D *
                              2 * 4;
      rows.push_back({"index_scores", shape, impl, S, key_bytes, t_idx, 0});
      rows.push_back({"select_blocks", shape, impl, S, static_cast<double>(S * B) * 4, t_sel, 0});
      rows.push_back({"block_sparse_attn", shape, impl, S, kv_bytes, t_att, 0});
    }
    unsetenv("FLASHSERVE_CUDA_OLD_CONTEXT");
    cudaStreamSynchronize(s);
    // The new rows' diff against the old on the same inputs: index_scores relative; the new
    // select_blocks and attention rerun on the old ops' inputs (old scores, old picks), picks as
    // the fraction of entries that differ (0 expected), attention relative.
    const auto n_scores = static_cast<std::size_t>(S * B);
    const double d_scores = max_rel_diff(outs[0].scores, outs[1].scores.data(), n_scores);
    fs::Tensor picked_new;
    be.select_blocks(outs[1].scores, first, kBlock, kTop, picked_new);
    fs::Tensor o_new;
    be.block_sparse_attention(q, k, v, Hq, Hkv, outs[1].picked, kBlock, first, scale, o_new);
    cudaStreamSynchronize(s);
    const auto pa = picked_new.to(fs::host_memory()), pb = outs[1].picked.to(fs::host_memory());
    std::size_t differ = 0;
    for (std::int64_t i = 0; i < pa.numel(); ++i)
      differ += pa.data_as<std::int32_t>()[i] != pb.data_as<std::int32_t>()[i];
    const double d_att =
        max_rel_diff(o_new, outs[1].o.data(), static_cast<std::size_t>(S * Hq * D));
    const std::size_t at = rows.size() - 6;
    rows[at].max_diff = d_scores;
    rows[at + 1].max_diff = static_cast<double>(differ) / static_cast<double>(pa.numel());
    rows[at + 2].max_diff = d_att;
    // The split kernel before session 13's tiled one (FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION=1) on
    // the new rows' picks: the before/after of the tiled kernel in one binary; its diff is
    // against the tiled kernel's output.
    setenv("FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION", "1", 1);
    fs::Tensor o_split;
    const double t_split = time_calls(s, calls, [&](int) {
      be.block_sparse_attention(q, k, v, Hq, Hkv, outs[0].picked, kBlock, first, scale, o_split);
    });
    unsetenv("FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION");
    cudaStreamSynchronize(s);
    rows.push_back({"block_sparse_attn", shape, "split16", S, rows[at + 2].bytes, t_split,
                    max_rel_diff(o_split, outs[0].o.data(), static_cast<std::size_t>(S * Hq * D))});
    // The radix select before session 20 (FLASHSERVE_CUDA_OLD_RADIX=1: the row read from global
    // memory in each pass, three barriers a tile), on the new scores; its diff counts the picks
    // that differ from the new select's (0 expected).
    setenv("FLASHSERVE_CUDA_OLD_RADIX", "1", 1);
    fs::Tensor picked_radix;
    const double t_radix = time_calls(s, calls, [&](int) {
      be.select_blocks(outs[0].scores, first, kBlock, kTop, picked_radix);
    });
    unsetenv("FLASHSERVE_CUDA_OLD_RADIX");
    cudaStreamSynchronize(s);
    const auto pr = picked_radix.to(fs::host_memory()), pn = outs[0].picked.to(fs::host_memory());
    std::size_t radix_differ = 0;
    for (std::int64_t i = 0; i < pr.numel(); ++i)
      radix_differ += pr.data_as<std::int32_t>()[i] != pn.data_as<std::int32_t>()[i];
    rows.push_back({"select_blocks", shape, "radix13", S, static_cast<double>(S * B) * 4, t_radix,
                    static_cast<double>(radix_differ)});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

// --- the gated delta rule's prefill form (issue 14: the chunked GDN kernel) ------------------

struct DeltaRow {
  std::string shape, decay;
  std::int64_t tokens;
  double t_chunks, t_tokens, max_diff;
};

// gated_delta_rule_chunked over a prefill of S tokens, the chunk kernels beside the token-by-
// token kernel (the same op with FLASHSERVE_CUDA_OLD_DELTA=1), on the same inputs: q and k
// l2-normed (q scaled by dk^-1/2), beta in (0, 1), the log decay in (-5, 0) (GLM's bound; GDN's
// softplus decays are as strong), one per head (GDN) or per key channel (KDA). Each timed call
// continues from the state the last one left; the diff compares one call each from a zero state.
void bench_delta(fs::Backend& be, cudaStream_t s, std::int64_t S, std::int64_t Hk, std::int64_t Hv,
                 std::int64_t d, bool per_channel, std::vector<DeltaRow>& rows, bool quick) {
  std::mt19937 rng(static_cast<std::uint32_t>(S * 7 + Hv + per_channel));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto host = [&](fs::Shape shape) {
    fs::Tensor t(std::move(shape));
    for (auto& e : t.span()) e = u(rng);
    return t;
  };
  fs::Tensor q = host({S, Hk * d}), k = host({S, Hk * d}), v = host({S, Hv * d});
  fs::Tensor g = host({S, per_channel ? Hv * d : Hv}), beta = host({S, Hv});
  for (auto* t : {&q, &k})
    for (std::int64_t r = 0; r < S * Hk; ++r) {
      float* p = t->data() + r * d;
      double ss = 0;
      for (std::int64_t i = 0; i < d; ++i) ss += static_cast<double>(p[i]) * p[i];
      const double inv = 1.0 / std::sqrt(ss + 1e-6) / (t == &q ? std::sqrt(double(d)) : 1.0);
      for (std::int64_t i = 0; i < d; ++i) p[i] = static_cast<float>(p[i] * inv);
    }
  for (auto& e : g.span()) e = -5.0f / (1.0f + std::exp(-3.0f * e));
  for (auto& e : beta.span()) e = 1.0f / (1.0f + std::exp(-3.0f * e));
  const auto dq = q.to(be.memory()), dkk = k.to(be.memory()), dv = v.to(be.memory()),
             dg = g.to(be.memory()), db = beta.to(be.memory());
  const fs::Tensor zero({Hv, d, d});
  const int calls = quick ? 2 : 5;
  double t[2] = {0, 0};
  fs::Tensor outs[2];
  for (int old = 0; old < 2; ++old) {
    if (old) setenv("FLASHSERVE_CUDA_OLD_DELTA", "1", 1);
    fs::Tensor state = zero.to(be.memory()), out;
    be.gated_delta_rule_chunked(dq, dkk, dv, dg, db, Hk, state, outs[old]);
    t[old] = time_calls(
        s, calls, [&](int) { be.gated_delta_rule_chunked(dq, dkk, dv, dg, db, Hk, state, out); });
    unsetenv("FLASHSERVE_CUDA_OLD_DELTA");
  }
  cudaStreamSynchronize(s);
  const double diff =
      max_rel_diff(outs[0], outs[1].data(), static_cast<std::size_t>(outs[1].numel()));
  const std::string shape =
      "Hk" + std::to_string(Hk) + " Hv" + std::to_string(Hv) + " d" + std::to_string(d);
  rows.push_back({shape, per_channel ? "KDA" : "GDN", S, t[0], t[1], diff});
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

void print_delta(const std::vector<DeltaRow>& rows) {
  std::printf("\n%-22s %-15s %-5s %6s %10s %11s %10s %11s %7s %9s\n", "op", "shape", "decay", "S",
              "chunks_us", "chunks_tok/s", "tokens_us", "tokens_tok/s", "ratio", "maxdiff");
  for (const auto& r : rows) {
    const double n = static_cast<double>(r.tokens);
    std::printf("%-22s %-15s %-5s %6lld %10.1f %11.0f %10.1f %11.0f %6.2fx %9.2e\n",
                "gated_delta_rule", r.shape.c_str(), r.decay.c_str(),
                static_cast<long long>(r.tokens), r.t_chunks * 1e6, n / r.t_chunks,
                r.t_tokens * 1e6, n / r.t_tokens, r.t_tokens / r.t_chunks, r.max_diff);
  }
}

// Sampled decoding's device work a row (docs/GPU.md "After session 27", item 5): the top 1,024 of
// a vocabulary's logits (Backend::topk, one block a row: cuda_select.cu), the softmax denominators
// at T 0.8, and greedy's argmax_rows beside them, for the 1-4 rows of a decode step or an MTP
// verify. The logits are random normals of scale 3 (a real row is more peaked, which changes no
// pass of the select). Bytes: the row read once.
void bench_sampling(fs::Backend& be, cudaStream_t s, std::vector<Row>& rows, bool quick) {
  constexpr std::int64_t kVocab = 248320, kTop = 1024;
  const int calls = quick ? 4 : 16;
  const std::string shape = "V" + std::to_string(kVocab) + " top" + std::to_string(kTop);
  for (int S = 1; S <= 4; S *= 2) {
    fs::Tensor logits = be.new_tensor({S, kVocab});
    fill(logits.raw(), static_cast<std::size_t>(S * kVocab), false, 3.0f, 60 + S, s);
    fs::Tensor idx, val, totals, ids;
    const double bytes = static_cast<double>(S * kVocab) * 4;
    // The radix select over the whole row (one block), then the grid's narrowing first
    // (cuda_vocab_topk.cu, the default since session 30); its diff: the picks that differ from
    // the radix select's (0 expected).
    setenv("FLASHSERVE_CUDA_VOCAB_TOPK", "0", 1);
    const double t_top = time_calls(s, calls, [&](int) { be.topk(logits, kTop, idx, val); });
    setenv("FLASHSERVE_CUDA_VOCAB_TOPK", "1", 1);
    fs::Tensor vidx, vval;
    const double t_vocab = time_calls(s, calls, [&](int) { be.topk(logits, kTop, vidx, vval); });
    unsetenv("FLASHSERVE_CUDA_VOCAB_TOPK");
    cudaStreamSynchronize(s);
    const auto pa = idx.to(fs::host_memory()), pb = vidx.to(fs::host_memory());
    std::size_t differ = 0;
    for (std::int64_t i = 0; i < pa.numel(); ++i)
      differ += pa.data_as<std::int32_t>()[i] != pb.data_as<std::int32_t>()[i];
    // The denominators on one block a row (before session 30), then sliced over the grid; the
    // sliced row's diff: the largest relative difference of the totals (double rounding).
    fs::Tensor one_block;
    setenv("FLASHSERVE_CUDA_OLD_SOFTMAX_TOTALS", "1", 1);
    const double t_sum_one =
        time_calls(s, calls, [&](int) { be.softmax_denominators(logits, 0.8, one_block); });
    unsetenv("FLASHSERVE_CUDA_OLD_SOFTMAX_TOTALS");
    const double t_sum =
        time_calls(s, calls, [&](int) { be.softmax_denominators(logits, 0.8, totals); });
    cudaStreamSynchronize(s);
    const auto ta = one_block.to(fs::host_memory()), tb = totals.to(fs::host_memory());
    double rel = 0;
    for (std::int64_t r = 0; r < S; ++r) {
      const double a = std::bit_cast<double>(ta.data_as<std::int64_t>()[r]),
                   b = std::bit_cast<double>(tb.data_as<std::int64_t>()[r]);
      rel = std::max(rel, std::abs(a - b) / std::abs(a));
    }
    const double t_arg = time_calls(s, calls, [&](int) { be.argmax_rows(logits, ids); });
    rows.push_back({"topk", shape, "radix", S, bytes, t_top, 0});
    rows.push_back({"topk", shape, "vocab", S, bytes, t_vocab, static_cast<double>(differ)});
    rows.push_back({"softmax_denominators", shape, "one_block", S, bytes, t_sum_one, 0});
    rows.push_back({"softmax_denominators", shape, "sliced", S, bytes, t_sum, rel});
    rows.push_back({"argmax_rows", shape, "greedy", S, bytes, t_arg, 0});
  }
  if (!be.status().ok()) std::fprintf(stderr, "backend: %s\n", be.status().to_string().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  bool quick = false, fp8_only = false, quant_only = false, delta_only = false, chain_only = false,
       forms_only = false, staged_only = false, tokens_only = false, hc_only = false,
       context_only = false, sampling_only = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--fp8")) fp8_only = true;
    if (!std::strcmp(argv[i], "--quant")) quant_only = true;
    if (!std::strcmp(argv[i], "--delta")) delta_only = true;
    if (!std::strcmp(argv[i], "--chain")) chain_only = true;
    if (!std::strcmp(argv[i], "--forms")) forms_only = true;
    if (!std::strcmp(argv[i], "--staged")) staged_only = true;
    if (!std::strcmp(argv[i], "--tokens")) tokens_only = true;
    if (!std::strcmp(argv[i], "--hc")) hc_only = true;
    if (!std::strcmp(argv[i], "--context")) context_only = true;
    if (!std::strcmp(argv[i], "--sampling")) sampling_only = true;
  }
  auto made = fs::make_cuda_backend();
  if (!made.ok()) {
    std::fprintf(stderr, "no CUDA backend: %s\n", made.status().to_string().c_str());
    return 1;
  }
  fs::Backend& be = **made;
  auto* mem = dynamic_cast<fs::cuda::CudaMemory*>(be.memory().get());
  const cudaStream_t s = mem->stream();
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);

  const double copy = copy_bandwidth(s);
  std::printf("device %s, %d SMs, L2 %d MB; D2D copy %.0f GB/s (read + written, best of 5)\n",
              prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, copy * 1e-9);
  std::vector<Row> rows;
  std::vector<DeltaRow> delta_rows;
  // Qwen 3.8 Flash Next's GDN heads (16 key / 48 value of 128), both decays; GLM 5.3's KDA heads
  // (64 of 128).
  auto run_delta = [&] {
    for (const std::int64_t S : {std::int64_t{512}, std::int64_t{4096}}) {
      bench_delta(be, s, S, 16, 48, 128, false, delta_rows, quick);
      bench_delta(be, s, S, 16, 48, 128, true, delta_rows, quick);
      bench_delta(be, s, S, 64, 64, 128, true, delta_rows, quick);
    }
  };
  if (delta_only) {
    run_delta();
    print_delta(delta_rows);
    return be.status().ok() ? 0 : 1;
  }
  // The released shapes: attention q+gate 24x256x2, k/v 2x256, o 6144 -> 2560; GDN qkv
  // 16x128x2 + 48x128, z 48x128, b/a 48, out 6144 -> 2560; router 512; shared expert 1280 / 640.
  struct G {
    const char* name;
    std::int64_t in, out;
  };
  const std::vector<G> gemvs = {{"attn_q_gate", 2560, 12288},   {"attn_kv", 2560, 512},
                                {"gdn_qkv", 2560, 10240},       {"gdn_z", 2560, 6144},
                                {"gdn_ba", 2560, 48},           {"router", 2560, 512},
                                {"shared_gate_up", 2560, 1280}, {"shared_down", 640, 2560},
                                {"o_proj", 6144, 2560},         {"lm_head", 2560, 248320}};
  if (hc_only) {
    bench_hc(be, s, rows);
  } else if (sampling_only) {
    bench_sampling(be, s, rows, quick);
  } else if (context_only) {
    for (const std::int64_t T : {std::int64_t{1024}, std::int64_t{16384}, std::int64_t{65536}})
      bench_context(be, s, T, rows, quick);
  } else if (tokens_only) {
    // The step's FP8 products: GDN qkv, the QSA query/gate, the out-projections, a 4 MB one.
    bench_tokens(be, s, 2560, 16480, "gdn_in_proj", rows);
    bench_tokens(be, s, 2560, 10240, "gdn_qkv", rows);
    bench_tokens(be, s, 2560, 12288, "attn_q_gate", rows);
    bench_tokens(be, s, 6144, 2560, "o_proj", rows);
    bench_tokens(be, s, 2560, 1536, "small_4MB", rows);
  } else if (staged_only) {
    // Products of 4-42 MB over 2560 columns, and the out-projections' 6144 columns.
    for (const std::int64_t out : {1600, 3200, 5120, 10240, 16480})
      bench_staged(be, s, 2560, out, "staged", rows);
    bench_staged(be, s, 6144, 2560, "staged", rows);
  } else if (forms_only) {
    // The FP8 products of the decode step: GDN qkv, the whole GDN input projection, the
    // out-projections, the QSA query/gate product.
    bench_forms(be, s, 2560, 131072, "read_335MB", rows);
    bench_forms(be, s, 2560, 10240, "gdn_qkv", rows);
    bench_forms(be, s, 2560, 16480 / 16 * 16, "gdn_in_proj", rows);
    bench_forms(be, s, 6144, 2560, "o_proj", rows);
    bench_forms(be, s, 2560, 12288, "attn_q_gate", rows);
  } else if (chain_only) {
    // The GDN input projection's qkv part and all of it (qkv, z, b, a), the out-projection.
    bench_chain(be, s, 2560, 10240, true, "gdn_qkv", rows);
    bench_chain(be, s, 2560, 16480, true, "gdn_in_proj", rows);
    bench_chain(be, s, 6144, 2560, true, "o_proj", rows);
    bench_chain(be, s, 2560, 10240, false, "gdn_qkv", rows);
  } else if (quant_only) {
    // The decode GEMV on each packed format beside bf16 and FP8, then the routed experts.
    bench_gemv(be, s, 2560, 10240, true, "gdn_qkv", rows);
    bench_gemv_fp8(be, s, 2560, 10240, "gdn_qkv", rows);
    for (const auto& f : kPackedFormats) bench_gemv_packed(be, s, 2560, 10240, f, "gdn_qkv", rows);
    for (const auto& f : kPackedFormats)
      if (f.type == fs::quant::QuantType::kF4E2M1x2 || f.type == fs::quant::QuantType::kQ4_K ||
          f.type == fs::quant::QuantType::kIQ2_XXS || !quick)
        bench_moe_packed(be, s, f, rows, quick);
  } else if (fp8_only) {
    // The FP8 products beside their bf16 forms (the projections convert --quantize fp8 writes;
    // the router and lm_head stay bf16).
    for (const auto& g : gemvs) {
      if (std::strcmp(g.name, "router") == 0 || std::strcmp(g.name, "lm_head") == 0) continue;
      bench_gemv(be, s, g.in, g.out, true, g.name, rows);
      bench_gemv_fp8(be, s, g.in, g.out, g.name, rows);
    }
    bench_moe_fp8(be, s, rows, quick);
  } else {
    for (const auto& g : gemvs) bench_gemv(be, s, g.in, g.out, true, g.name, rows);
    bench_gemv(be, s, 2560, 10240, false, "gdn_qkv", rows);
    bench_moe(be, s, rows, quick);
    for (const std::int64_t T : {std::int64_t{1024}, std::int64_t{16384}, std::int64_t{65536}})
      bench_context(be, s, T, rows, quick);
    run_delta();
  }

  std::printf("\n%-15s %-26s %-7s %2s %10s %9s %9s %7s %9s\n", "kernel", "shape", "impl", "S", "MB",
              "us", "GB/s", "%copy", "maxdiff");
  for (const auto& r : rows)
    std::printf("%-15s %-26s %-7s %2d %10.2f %9.2f %9.0f %6.1f%% %9.2e\n", r.kernel.c_str(),
                r.shape.c_str(), r.impl.c_str(), r.tokens, r.bytes * 1e-6, r.seconds * 1e6,
                r.bytes / r.seconds * 1e-9, 100.0 * r.bytes / r.seconds / copy, r.max_diff);
  if (!delta_rows.empty()) print_delta(delta_rows);
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f) {
      std::fprintf(f, "{\"device\": \"%s\", \"copy_gbps\": %.1f, \"rows\": [\n", prop.name,
                   copy * 1e-9);
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        std::fprintf(f,
                     "  {\"kernel\": \"%s\", \"shape\": \"%s\", \"impl\": \"%s\", \"tokens\": %d, "
                     "\"bytes\": %.0f, \"us\": %.3f, \"gbps\": %.1f, \"copy_fraction\": %.4f, "
                     "\"max_rel_diff_vs_legacy\": %.3e}%s\n",
                     r.kernel.c_str(), r.shape.c_str(), r.impl.c_str(), r.tokens, r.bytes,
                     r.seconds * 1e6, r.bytes / r.seconds * 1e-9, r.bytes / r.seconds / copy,
                     r.max_diff, i + 1 < rows.size() ? "," : "");
      }
      std::fprintf(f, "], \"delta_rule\": [\n");
      for (std::size_t i = 0; i < delta_rows.size(); ++i) {
        const auto& r = delta_rows[i];
        std::fprintf(f,
                     "  {\"shape\": \"%s\", \"decay\": \"%s\", \"tokens\": %lld, "
                     "\"chunks_us\": %.3f, \"tokens_us\": %.3f, \"ratio\": %.3f, "
                     "\"max_rel_diff\": %.3e}%s\n",
                     r.shape.c_str(), r.decay.c_str(), static_cast<long long>(r.tokens),
                     r.t_chunks * 1e6, r.t_tokens * 1e6, r.t_tokens / r.t_chunks, r.max_diff,
                     i + 1 < delta_rows.size() ? "," : "");
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  return be.status().ok() ? 0 : 1;
}
