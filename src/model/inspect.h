// Checks a checkpoint against what its config requires: every tensor present with its shape,
// nothing unexplained. `flashserve inspect` prints the report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/safetensors.h"
#include "model/family.h"

namespace fs {

struct InspectReport {
  ModelDescription description;
  std::int64_t parameters = 0;  // elements of float tensors, MTP included
  std::map<std::string, std::uint64_t> bytes_by_dtype;
  std::vector<std::string> missing_tensors;
  std::vector<std::string> unexpected_tensors;
  std::vector<std::string> mismatched_tensors;  // "name: expected [..] F32-like, found [..] I64"
  std::vector<std::string> mtp_tensors;
  std::size_t shards = 0;

  bool complete() const {
    return missing_tensors.empty() && unexpected_tensors.empty() && mismatched_tensors.empty();
  }
};

InspectReport inspect_checkpoint(const ModelDescription& d, const Checkpoint& ck);
// Opens DIR's config and checkpoint (errors: unreadable or invalid config, corrupt safetensors).
Expected<InspectReport> inspect_model_dir(const std::string& dir);

}  // namespace fs
