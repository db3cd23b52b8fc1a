#pragma once

#include <vector>

#include "model/family.h"

namespace fs {

std::vector<LayerSchedule> glm5_schedule(const Glm5Config& c);
// Every tensor the trunk needs (HF names, arch-glm.md section 4).
std::vector<TensorSpec> glm5_tensors(const Glm5Config& c);

}  // namespace fs
