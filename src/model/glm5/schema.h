#pragma once

#include <vector>

#include "model/family.h"

namespace fs {

std::vector<LayerSchedule> glm5_schedule(const Glm5Config& c);
// Every tensor the trunk needs (HF names, arch-glm.md section 4).
std::vector<TensorSpec> glm5_tensors(const Glm5Config& c);
// The MTP layer at index num_hidden_layers (arch-glm.md 5; HF has no module for it and drops
// these keys): enorm, hnorm, eh_proj over [embedding | hidden], one plain pre-norm DSA + MoE block
// (no hyper-connections), shared_head.norm; the lm_head is the trunk's.
std::vector<TensorSpec> glm5_mtp_tensors(const Glm5Config& c);

}  // namespace fs
