#pragma once

#include <vector>

#include "model/family.h"

namespace fs {

std::vector<LayerSchedule> qwen_next_schedule(const QwenNextConfig& c);
// Every tensor the trunk needs (HF names, arch-qwen.md section 4).
std::vector<TensorSpec> qwen_next_tensors(const QwenNextConfig& c);
// The MTP head's tensors (docs/MTP.md), all under `mtp.`.
std::vector<TensorSpec> qwen_next_mtp_tensors(const QwenNextConfig& c);

}  // namespace fs
