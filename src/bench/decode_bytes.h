// Bytes a batch-1 decode step must move, from the shapes alone (the roofline's numerator):
// every matrix and vector the step reads once, only the routed experts actually used (top-k of
// E), the lm_head, one embedding row, the PLE table rows the n-gram heads touch, the QSA keys and
// values the indexer's selection reads (budget keys plus the unfinished tail block) and the
// indexer's pooled block keys (all of them are scored), and every recurrent state read and
// written (GDN states and conv tails, the PLE conv tail). Activations are not counted.
#pragma once

#include <cstdint>

#include "bench/weight_mix.h"
#include "model/qwen_next/config.h"

namespace fs::bench {

struct DecodeBytes {
  double weights = 0;  // trunk matrices/vectors actually read (routed experts: k of E)
  double state = 0;    // KV/index rows read, recurrent states read + written
  double total() const { return weights + state; }
};

// Bytes per matrix element: `projections` for the matrices `convert --quantize fp8` quantises
// (every *_proj, the routed and shared experts, the MTP head's fc_*), `others` for the rest
// (embedding, lm_head, router, shared-expert gate, hyper-connection matrices).
// The routed experts' gate/up and down and the shared expert's down can differ from the other
// projections (a packed mix's low-bit experts, or its fallback for rows that are not whole
// blocks); negative means as `projections`.
struct MatrixBytes {
  double projections = 2;
  double others = 2;
  double experts_gate_up = -1;
  double experts_down = -1;
  double shared_down = -1;
};
// bf16 everywhere; FP8 projections (one byte each plus an f32 scale per 128x128 block) beside
// bf16 others, as `flashserve bench --dtype fp8` lays them out.
inline constexpr MatrixBytes kBf16Matrices{2, 2};
inline constexpr MatrixBytes kFp8Matrices{1 + 4.0 / (128 * 128), 2};
// The bytes per weight of `--dtype`'s mix (bench/weight_mix.h) at c's shapes.
MatrixBytes matrix_bytes(const WeightMix& mix, const QwenNextConfig& c);

// One trunk token after `context` tokens; `matrix_bytes` per matrix element (2: bf16).
DecodeBytes trunk_decode_bytes(const QwenNextConfig& c, std::int64_t context, MatrixBytes mb);
inline DecodeBytes trunk_decode_bytes(const QwenNextConfig& c, std::int64_t context,
                                      double matrix_bytes) {
  return trunk_decode_bytes(c, context, MatrixBytes{matrix_bytes, matrix_bytes});
}
// One MTP-head draft whose history holds `context` rows.
// `draft_vocab`: the rows of the output head a draft reads (MtpHead::set_draft_vocabulary).
DecodeBytes mtp_draft_bytes(const QwenNextConfig& c, std::int64_t context, MatrixBytes mb,
                            std::int64_t draft_vocab);
inline DecodeBytes mtp_draft_bytes(const QwenNextConfig& c, std::int64_t context,
                                   double matrix_bytes, std::int64_t draft_vocab) {
  return mtp_draft_bytes(c, context, MatrixBytes{matrix_bytes, matrix_bytes}, draft_vocab);
}

}  // namespace fs::bench
