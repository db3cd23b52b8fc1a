// Rewrites a checkpoint folder: float weights to another dtype (bf16 for the bf16 parity test and
// smaller CPU runs) and/or PLE n-gram tables split into row shards
// (`...ngram_embedding.shard_{n}.weight`, the released checkpoints' layout). Tensors keep their
// stored names; config.json is copied (split_ngram_parts updated when re-sharding).
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
};

Status convert_checkpoint(const std::string& in_dir, const std::string& out_dir,
                          const ConvertOptions& options);

}  // namespace fs
