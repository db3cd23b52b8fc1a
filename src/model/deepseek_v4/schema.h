#pragma once

#include <vector>

#include "model/family.h"

namespace fs {

std::vector<LayerSchedule> deepseek_v4_schedule(const DeepseekV4Config& c);
// Every tensor the trunk needs (HF names, arch-dsv4.md 2.13).
std::vector<TensorSpec> deepseek_v4_tensors(const DeepseekV4Config& c);

}  // namespace fs
