// `convert --quantize fp4`: an HF-named DeepSeek V4 folder rewritten in the official release's
// layout (official_names.h), the way DeepSeek quantises it (arch-dsv4.md 6):
// - the dense projections (attention, the indexer's wq_b, shared experts, the MTP block's e_proj
//   and h_proj) F8_E4M3 with F8_E8M0 `.scale` per 128x128 block: scale = 2^ceil(log2(amax/448)),
//   e4m3 = round-to-nearest-even(w / scale) saturated;
// - the routed experts one tensor per expert and projection, FP4 E2M1 two codes a byte (I8,
//   [out, in/2], the first in the low nibble) with F8_E8M0 `.scale` per 32 inputs:
//   scale = 2^ceil(log2(amax/6)), e2m1 = round-to-nearest-even(w / scale);
// - the compressor and indexer kv/gate projections and the indexer's weights_proj in their float
//   type (the release ships them BF16), as the embedding, the output head, norms, routers,
//   hyper-connection parameters and hash tables; so is o_a_proj when its output groups are not
//   whole 128-row blocks (fp8_blocks_fit_groups in model/convert.h: the tiny fixtures).
// An all-zero block takes scale 1. config.json gains the release's quantization_config.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "format/safetensors.h"
#include "tensor/dtype.h"
#include "util/status.h"

namespace fs {

// `dtype` (F32/BF16) converts the tensors kept in a float type; unset keeps theirs.
// `config` is the input's config.json; it is written with the quantization_config added.
Status convert_deepseek_v4_official(const Checkpoint& ck, nlohmann::json& config,
                                    const std::string& out_dir, std::optional<DType> dtype);

}  // namespace fs
