// A decode state at a long context without prefilling it: every cache is filled with synthetic
// values of the shapes `length` tokens leave (QSA keys/values/index keys/pooled blocks of that
// many rows, GDN and PLE recurrent states and conv tails, an MTP history of length-1 rows), then
// one real token is forwarded through the production path so the state has true next logits and
// a trunk hidden row. Decode over it reads and writes exactly what a prefilled state would make
// it read and write; only the values differ.
#pragma once

#include <cstdint>

#include "decode/decode_state.h"
#include "model/qwen_next/config.h"
#include "util/status.h"

namespace fs::bench {

// `state` must be fresh (new_decode_state). Covers `length` tokens afterwards.
Status fill_synthetic_context(Model& model, const QwenNextConfig& c, std::int64_t length,
                              std::uint64_t seed, DecodeState& state);

}  // namespace fs::bench
