// The tiled split-K kernel of block_sparse_attention (cuda_attention_tiles.cu), launched by
// CudaBackend::block_sparse_attention (cuda_attention.cu), which owns the checks, the scratch and
// the merge. Included by those two .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"  // first: its pragma for nvcc's warning 2810; Activation
#include "backend/cuda/cuda_graph.h"

namespace fs::cuda {

// Keys a tile holds: one per lane of a warp.
constexpr std::int64_t kTiledKeys = 32;

// One launch's arguments (a struct: the kernel takes one parameter block).
struct TiledAttention {
  const float* q = nullptr;  // [S, Hq * D]
  const float* k = nullptr;  // [T, kv_stride], head g at column g * D
  const float* v = nullptr;
  const std::int32_t* picked = nullptr;  // [S, top], -1 = no block
  std::int64_t top = 0, Hq = 0, rep = 0, D = 0, kv_stride = 0, block = 0;
  StepScalar first;
  float scale = 1.0f;
  std::int64_t splits = 1, chunk = 0;  // chunk: keys a split visits, a multiple of kTiledKeys
  int stages = 1;                      // 2: the next tile's loads in flight while one is computed
  float* part_acc = nullptr;           // splits > 1: [S * Hq * splits, D], [.., 2] (m, l)
  float* part_ml = nullptr;
  float* out = nullptr;  // splits == 1: [S, Hq * D]
  // splits == 1 with a gate: out = (acc / l) * act(gate), gate laid out as out (the op's output
  // gate, mul_activated's product).
  const float* gate = nullptr;
  Activation gate_act = Activation::kIdentity;
};

// Whether the tiled kernel takes these shapes (query heads per KV head, head width); the caller
// also needs 16-byte aligned q, K, V and out rows.
bool tiled_attention_takes(std::int64_t rep, std::int64_t D);

// The split of `most` keys (the longest visit of any query) over `groups` = queries x KV heads:
// `splits` chunks of `chunk` keys (a multiple of kTiledKeys) and the pipeline depth.
struct TiledSplit {
  std::int64_t splits = 1, chunk = kTiledKeys;
  int stages = 1;
};
TiledSplit tiled_attention_split(std::int64_t most, std::int64_t groups);

// Raises the kernels' shared-memory limit on the current device, once (no attribute call after
// the first, so none inside a stream capture). False if the device refuses: the caller then runs
// another kernel.
bool reserve_tiled_attention();

// Queues the kernel on a grid of (S * splits, kv_heads) blocks, launched overlapped.
cudaError_t launch_tiled_attention(const TiledAttention& a, std::int64_t S, std::int64_t kv_heads,
                                   cudaStream_t stream);

}  // namespace fs::cuda
