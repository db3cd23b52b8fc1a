// Rewrites a checkpoint folder: float weights to another dtype (bf16 for the bf16 parity test and
// smaller CPU runs), projections quantised to FP8 in the layout of the official FP8 releases,
// and/or PLE n-gram tables split into row shards (`...ngram_embedding.shard_{n}.weight`, the
// released checkpoints' layout). Tensors keep their stored names; config.json is copied
// (split_ngram_parts updated when re-sharding, quantization_config added when quantising).
//
// FP8 (`quantize_fp8`): every linear projection (`*_proj.weight`, the 3-D expert tensors
// `*_proj`, the MTP head's `fc_*.weight`) becomes F8_E4M3 with an F32 `<name>_scale_inv` of
// [ceil(out/128), ceil(in/128)] blocks ([E, ...] for experts): per 128x128 block, scale = amax /
// 448, e4m3 = round-to-nearest-even(w / scale) saturated, and w ~ e4m3 * scale_inv with
// scale_inv = scale (quant/block_scaled.h reads it back). Embeddings, the output head, norms,
// convolutions, routers, hyper-connection weights and the PLE tables stay as they are.
//
// FP4 (`quantize_fp4`, DeepSeek V4 only): the official release's layout and names, FP8 E4M3
// dense projections with E8M0 128x128 `.scale` blocks and FP4 E2M1 per-expert routed experts
// with E8M0 per-32 scales (model/deepseek_v4/official_convert.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tensor/dtype.h"
#include "util/status.h"

namespace fs {

struct ConvertOptions {
  std::optional<DType> dtype;                     // F32 or BF16; unset keeps each tensor's dtype
  std::optional<std::int64_t> split_ngram_parts;  // re-shard the PLE tables into this many parts
  bool quantize_fp8 = false;                      // projections to FP8 E4M3 with 128x128 scales
  bool quantize_fp4 = false;                      // DeepSeek V4's official FP8 + FP4 layout
};

// Whether `convert` quantises the stored tensor `name` of rank `rank` to FP8.
bool fp8_quantises(const std::string& name, std::size_t rank);
// Whether FP8's 128-row blocks of `name` fit the row groups an op slices it into. DeepSeek V4's
// o_a_proj is read per output group of `group_rows` (config o_lora_rank) rows by grouped_linear,
// and a group starting inside a block has no scale grid of its own, so such a projection stays in
// its float type (the released shapes, 1,024 rows a group, fit; the tiny fixtures' 16 do not).
// True for every other tensor.
bool fp8_blocks_fit_groups(const std::string& name, std::int64_t group_rows);

Status convert_checkpoint(const std::string& in_dir, const std::string& out_dir,
                          const ConvertOptions& options);

}  // namespace fs
