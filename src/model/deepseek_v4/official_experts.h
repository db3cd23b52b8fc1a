// The routed experts of one DeepSeek V4 MoE layer as the official release stores them, one tensor
// per expert and projection (`<layer>ffn.experts.e.w1.weight`, w1 gate, w3 up, w2 down): FP4 E2M1
// two codes a byte (dtype I8, [out, in/2], the first code in the low nibble) beside F8_E8M0 scales
// per 32 inputs (`.scale`, [out, in/32]). The forward reads HF's stacked layout (gate_up
// [E, 2I, H] with each expert's gate rows then its up rows, down [E, H, I]), so the layer's
// experts are copied once, as stored (no dequantised copy), into one packed buffer per tensor:
// the layer's FP4 bytes and scales (for Flash 3.4 GB a layer, 150 GB for the 43 layers and the
// MTP block's), one memcpy of each expert. A device upload does this one layer at a time and
// frees the buffer (DsOfficialExperts), so the host holds one layer's copy at most.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "util/status.h"

namespace fs {

// Where one layer's per-expert tensors are, for stacking at upload: on a device one layer at a
// time (stacked into a buffer of the layer's size, uploaded, freed), so the host never holds more
// than one layer's copy; on the CPU into buffers the weights keep.
struct DsOfficialExperts {
  std::string layer_prefix;
  std::int64_t experts = 0, intermediate = 0, hidden = 0;
  // The stacked gate_up and down: FP4 codes (half a byte a weight) and an E8M0 scale per 32.
  std::uint64_t stacked_bytes() const;
};

struct DsStackedExperts {
  Weight gate_up;  // [E, 2I, H] FP4 E2M1 with 1x32 E8M0 scales
  Weight down;     // [E, H, I]
};

// Every expert's six tensors present, of the dtypes and shapes [I, H/2] / [I, H/32] (w1, w3) and
// [H, I/2] / [H, I/32] (w2); the error names the first that is not. H and I must be multiples
// of 32.
Status check_official_experts(const Checkpoint& ck, const std::string& layer_prefix,
                              std::int64_t experts, std::int64_t intermediate, std::int64_t hidden);
// Stacks the checked experts into buffers appended to `arena`, which the weights own (or a
// caller's, freed after the upload).
DsStackedExperts stack_official_experts(
    const Checkpoint& ck, const std::string& layer_prefix, std::int64_t experts,
    std::int64_t intermediate, std::int64_t hidden,
    std::vector<std::unique_ptr<std::vector<std::uint8_t>>>& arena);

}  // namespace fs
