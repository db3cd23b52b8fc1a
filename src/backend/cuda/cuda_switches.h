// Environment switches back to the kernels an op used before issue 14's context kernels (top-k /
// select_blocks, index_scores, block_sparse_attention): a way out when a new kernel misbehaves on
// a device, and what the kernel benchmark times as "old".
//   FLASHSERVE_CUDA_OLD_TOPK=1, FLASHSERVE_CUDA_OLD_INDEX=1, FLASHSERVE_CUDA_OLD_ATTENTION=1,
//   FLASHSERVE_CUDA_OLD_CONTEXT=1 (all three); FLASHSERVE_CUDA_MOE_PAIRS=1 runs moe_experts on its
//   (token, expert) pair kernels at every token count (the fused path of 1-4 tokens off);
//   FLASHSERVE_CUDA_OLD_DELTA=1 runs gated_delta_rule_chunked token by token at every length;
//   FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION=1 runs block_sparse_attention's split kernel of sessions
//   10-12 (16-key tiles walked a key at a time) instead of the tiled one of session 13
//   (cuda_attention_tiles.cu); FLASHSERVE_CUDA_OLD_ATTENTION / _CONTEXT still pick the earliest;
//   FLASHSERVE_CUDA_QSA_UNFUSED=1 runs qsa_projections and head_norm_rope as their op sequences
//   (the same bits, more kernels: the "before" of session 13's QSA fusions in the same binary);
//   FLASHSERVE_CUDA_OLD_HC_DOWN=1 launches the hyper-connection read's first kernel at 2-4 tokens
//   as before session 19 (two blocks a multiprocessor, two waves; the same bits) where
//   FLASHSERVE_CUDA_HC_DOWN_ROWS=1 asks for one row a block (1-4; 3 by default since session 20);
//   FLASHSERVE_CUDA_HC_SPLIT=0 runs that first kernel over whole rows again, with the stream mix a
//   column per 8 lanes (before session 36's split by stream, hc_parts_kernel);
//   FLASHSERVE_CUDA_MOE_BLOCK_ONE_TOKEN=1 runs an MTP verify's MoE block as its sequence, as
//   before session 20; FLASHSERVE_CUDA_OLD_ROUTE_PICKS=1 takes the decode router's picks by
//   shuffle rounds (before session 20); FLASHSERVE_CUDA_OLD_RADIX=1 runs the radix top-k reading
//   its row from global memory in each pass (before session 20); FLASHSERVE_CUDA_MOE_DOWN_COMBINE=0
//   runs a one-token FP8 MoE block's routed down and its shared down + combine as two kernels
//   (before session 22); FLASHSERVE_CUDA_GDN_UNFUSED=1 runs gated_delta_net_in_proj_conv and
//   gated_delta_net_core as their default bodies (in_proj, conv1d, silu; slices, l2 norms, the
//   recurrence, the gated norm: more kernels than the path before session 26);
//   FLASHSERVE_CUDA_PACKED_STREAM=0 and FLASHSERVE_CUDA_FP8_EXPERT_STREAM=0 give one token's packed
//   GEMVs and packed / FP8 routed gate/up one row a warp again (before session 32's rows streamed
//   through resident warps); FLASHSERVE_CUDA_PACKED_TAIL=0 takes a one-token GEMV's rows a warp
//   one at a time where session 33's kernel shares their last round among 3 rows;
//   FLASHSERVE_CUDA_PACKED_FUSED=0 runs the GatedDeltaNet in-projections, QSA's projections and
//   the shared expert on packed (GGUF, FP4) weights as their sequences (before session 34's
//   cuda_fused_packed.cu); FLASHSERVE_CUDA_PACKED_MOE_BLOCK=0 runs one token's MoE block on
//   packed weights as its ten-kernel sequence (before session 35's cuda_moe_block_packed.cu);
//   FLASHSERVE_CUDA_PACKED_STREAM_TOKENS=0 gives an MTP verify's packed routed gate/up one row a
//   warp again (before session 37 streamed its items as one token's).
//   All the same bits.
// Prefill (more than 4 tokens; not the same bits, each within the op tests' bounds of the CPU):
//   FLASHSERVE_CUDA_MOE_PAIRS=1 also keeps prefill's routed experts off the grouped tensor-core
//   products (cuda_grouped_gemm.h) of session 21; FLASHSERVE_CUDA_PREFILL_SGEMM=1 keeps dense
//   bf16/FP8 products on f32 tiles and cuBLAS sgemm (before session 21);
//   FLASHSERVE_CUDA_PREFILL_SPLIT_K=0 runs narrow dense products without splitting K;
//   FLASHSERVE_CUDA_GROUPED_ROWS=32|64 fixes the grouped products' tile rows (by default 32 where
//   the experts average 32 pairs or fewer); FLASHSERVE_CUDA_ATTENTION_PREFILL_STAGES=2 gives the
//   tiled attention two stages for a prefill's many queries too (one since session 21).
// Read at every call (host side only, a getenv), so one process can time both; a graph captures
// whichever was chosen when it was recorded.
#pragma once

#include <cstdlib>
#include <cstring>

namespace fs::cuda {

inline bool env_flag(const char* var) {
  const char* v = std::getenv(var);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// A switch that is on unless set to "0" (FLASHSERVE_CUDA_HC_PREWAIT: the hyper-connection read's
// stream mix reads h and its norm weight before its wait, cuda_fused.cu).
inline bool env_flag_default_on(const char* var) {
  const char* v = std::getenv(var);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// `var` is one of the per-kernel names above.
inline bool old_kernel_requested(const char* var) {
  return env_flag(var) || env_flag("FLASHSERVE_CUDA_OLD_CONTEXT");
}

}  // namespace fs::cuda
