// Checks a checkpoint against what its config requires: every tensor present with its shape,
// nothing unexplained; and says how each tensor is stored (its quantisation, block scales
// included) and how many bytes a decode step reads. `flashserve inspect` prints the report.
//
// A DeepSeek V4 folder named as the official release is (model/deepseek_v4/official_names.h) is
// checked through its name map: its per-expert tensors stand for the schema's stacked experts.
// Bytes per token: a step reads every tensor whole, except one row of the embedding (all of it
// when the output head is tied to it), one row of a hash-routing table, and of the routed
// experts the share num_experts_per_tok / experts; MTP tensors are counted apart (per draft).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/family.h"

namespace fs {

// One stored weight and how it is kept: "BF16", "F8_E4M3 with 128x128 E8M0 scales", "F4_E2M1
// with 1x32 E8M0 scales" (a weight's scale tensor is counted with it, not listed).
struct TensorStorage {
  std::string name;     // as stored
  std::string hf_name;  // the schema's name when the folder uses another naming ("" otherwise)
  std::string format;
  Shape shape;                     // as stored
  std::uint64_t bytes = 0;         // the weight's and its scales'
  std::uint64_t decode_bytes = 0;  // read per decoded token (per draft for MTP tensors)
  bool mtp = false;
};

struct InspectReport {
  ModelDescription description;
  std::int64_t parameters = 0;  // elements of float tensors, MTP included
  std::map<std::string, std::uint64_t> bytes_by_dtype;
  std::vector<std::string> missing_tensors;
  std::vector<std::string> unexpected_tensors;
  std::vector<std::string> mismatched_tensors;  // "name: expected [..] F32-like, found [..] I64"
  std::vector<std::string> mtp_tensors;
  std::size_t shards = 0;
  bool official_names = false;  // DeepSeek V4's release naming
  std::vector<TensorStorage> tensors;
  std::map<std::string, std::uint64_t> bytes_by_format;
  std::uint64_t decode_bytes = 0;  // per token, the trunk (MTP excluded)
  std::map<std::string, std::uint64_t> decode_bytes_by_format;
  std::uint64_t mtp_decode_bytes = 0;  // per MTP draft
  std::int64_t experts = 0, experts_per_token = 0;

  bool complete() const {
    return missing_tensors.empty() && unexpected_tensors.empty() && mismatched_tensors.empty();
  }
};

InspectReport inspect_checkpoint(const ModelDescription& d, const Checkpoint& ck);
// Opens DIR's config and checkpoint (errors: unreadable or invalid config, corrupt safetensors).
Expected<InspectReport> inspect_model_dir(const std::string& dir);

}  // namespace fs
