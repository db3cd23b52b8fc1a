// The routed experts of 1-4 tokens in one persistent kernel (cuda_moe_stream.cu): what the
// one-token gate/up and down kernels of cuda_moe.cu compute, bit for bit, with the weights
// streamed through shared memory. moe_token_parts takes it where it applies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace fs::cuda {

// Counters the kernel synchronises through: one per slot (a slot's gate/up rows done), then the
// blocks that have finished. Zero between launches: the last block to finish resets them.
constexpr int kMoeStreamSlots = 256;  // 4 tokens x 64 experts (kMaxPairs, cuda_moe.cu)
constexpr int kMoeStreamSyncInts = kMoeStreamSlots + 1;

struct MoeStreamArgs {
  const float* x = nullptr;  // [tokens, H]
  int tokens = 0;
  const void* gate_up = nullptr;  // [E, 2I, H]: bf16, or e4m3 with its f32 128x128 scale grid
  const float* gate_up_scales = nullptr;
  const void* down = nullptr;  // [E, H, I], the same dtype
  const float* down_scales = nullptr;
  bool fp8 = false;
  const std::int32_t* ids = nullptr;  // [pairs]: slot u's expert (ids outside [0, E): none)
  int pairs = 0;
  int per_token = 0;  // slot u reads token u / per_token's row of x
  std::int64_t E = 0, H = 0, I = 0;
  float limit = 0.0f;     // clamped_swiglu's
  float* act = nullptr;   // [pairs, I]
  float* part = nullptr;  // [pairs, H]
  int* sync = nullptr;    // kMoeStreamSyncInts ints, zero
  int multiprocessors = 0;
  int smem_optin = 0;  // the device's opt-in shared memory a block
};

// Queues the kernel when it takes these shapes and returns true (a launch error is then the
// caller's to read); false, queueing nothing, where it does not (rows not whole 16-byte chunks,
// unaligned, more slots than kMoeStreamSlots, too little shared memory, FLASHSERVE_CUDA_MOE_STREAM
// not set to 1: the kernel is opt-in, slower than the two on the H200): the caller runs the two kernels.
bool launch_moe_stream(const MoeStreamArgs& a, cudaStream_t stream);

// How many launches launch_moe_stream has queued in this process (tests: that a path took it).
std::uint64_t moe_stream_launches();

}  // namespace fs::cuda
