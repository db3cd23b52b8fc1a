// The packed routed experts' and the packed MoE block's launches, shared between
// cuda_moe_packed.cu (moe_experts_packed), cuda_moe_block_packed.cu (its kernels) and
// cuda_moe_block.cu (the block op). Included by .cu files only (StreamsOut, RouteArgs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_backend.h"  // first: its pragma for nvcc's warning 2810
#include "backend/cuda/cuda_epilogue.cuh"
#include "backend/cuda/cuda_route_warp.cuh"
#include "backend/weight.h"

namespace fs::cuda {

// A kernel as a type, for a lambda that needs it as a constant (allow_dynamic_shared,
// uses_local_memory).
template <auto kKernelFn>
struct KernelTag {
  static constexpr auto kKernel = kKernelFn;
};

// act[p] = swiglu(gate_up[e_p] gate rows · x, up rows · x) for the S * k pairs (ids [S, k]):
// moe_experts_packed's gate/up kernels (cuda_moe_packed.cu).
void launch_packed_gate_up(const float* x, const Weight& gate_up, const std::uint8_t* codebook,
                           const std::int32_t* ids, std::int64_t S, std::int64_t k, std::int64_t E,
                           std::int64_t H, std::int64_t I, float swiglu_limit, float* act,
                           cudaStream_t stream);

// Whether the packed MoE block's kernels (cuda_moe_block_packed.cu) take one token of these
// weights: stacked packed experts gate_up [E, 2I, H] and down [E, H, I]; the shared expert's gate
// and up of one packed format over H, its down [H, I] in the routed down's format; a float or
// bf16 expert gate [1, H]; rows of the widths the kernels' lanes take (a warp for the gate/up
// rows and for the expert gate's, 8 lanes for the down rows, whose format subtracts no minimum),
// top_k + 1 row sets a block and their x vectors staged in 48 KB.
bool packed_moe_block_takes(const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                            const Weight& shared_up, const Weight& shared_down,
                            const Weight& expert_gate, std::int64_t H, std::int64_t top_k);

// One grid: the routing (route.blocks blocks of route_warp_rows), the expert gate's logit, and
// the shared expert's units act[r] = silu(gate row r · x) * (up row r · x).
void launch_route_shared_gate_up_packed(const RouteArgs& route, int route_slots, const float* x,
                                        const Weight& gate, const Weight& up,
                                        const Weight& expert_gate, const std::uint8_t* codebook,
                                        std::int64_t H, std::int64_t I, float* act, float* logit,
                                        cudaStream_t stream);

// The routed down of one token's k slots, the shared down, the routed combine and the shared
// expert's gated accumulation, written to y or into the hyper-connection streams.
struct PackedDownCombine {
  const float* act;         // [k, I]: the slots' swiglu
  const float* shared_act;  // [I]
  const std::int32_t* ids;  // [k], written two kernels back
  const float* weights;     // [k]
  const float* logit;       // the shared expert's gate logit
  int k = 0;
  std::int64_t E = 0, H = 0, I = 0;
  float* y = nullptr;  // or the streams
  StreamsOut streams;
};
void launch_packed_down_combine(const PackedDownCombine& args, const Weight& down,
                                const Weight& shared_down, const std::uint8_t* codebook,
                                cudaStream_t stream);

}  // namespace fs::cuda
