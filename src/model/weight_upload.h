// A model's weights onto its backend as one plan: the bytes they will take there are summed and
// checked against the device's free memory first, so a checkpoint that cannot fit is refused with
// the numbers before anything is copied; then they are uploaded with progress on a terminal.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backend/backend.h"
#include "util/status.h"

namespace fs {

struct WeightUpload {
  Weight* weight = nullptr;   // replaced by the backend's copy (or view)
  DType dtype = DType::kF32;  // how a matrix is stored there (vectors become f32)
};

// Room left on the device beyond the weights, for activations, caches and the library
// workspaces of a first request; a load that would leave less is refused.
inline constexpr std::uint64_t kLoadHeadroomBytes = 1ull << 30;

// The bytes `w` takes in device memory stored as `dtype` (Backend::upload's rules: matrices as
// `dtype`, vectors as f32, index tables as int32, block-scaled FP8 as stored with its scales).
std::uint64_t device_bytes(const Weight& w, DType dtype);
// Refuses when weights of `need` bytes and kLoadHeadroomBytes do not fit the device's free
// memory, naming both; ok on a host backend.
Status check_fits(const Backend& be, std::uint64_t need, const std::string& what);
// check_fits, then each weight through Backend::upload, with a ProgressMeter on stderr.
// Empty weights and repeats of a weight already uploaded (by data pointer) are skipped; a repeat
// gets the first one's copy. `later_bytes`: device bytes the caller uploads after these (weights
// it builds one at a time), counted in the fit check so nothing is copied when all cannot fit.
Status upload_weights(Backend& be, std::span<const WeightUpload> items, const std::string& what,
                      std::uint64_t later_bytes = 0);

}  // namespace fs
