#pragma once

#include <vector>

#include "model/family.h"

namespace fs {

std::vector<LayerSchedule> deepseek_v4_schedule(const DeepseekV4Config& c);
// Every tensor the trunk needs (HF names, arch-dsv4.md 2.13).
std::vector<TensorSpec> deepseek_v4_tensors(const DeepseekV4Config& c);

// The MTP block (arch-dsv4.md 4; HF has none and ignores `mtp.*`): ds4's structure under
// "mtp.0.", its decoder layer named as the trunk's (sliding attention, score-routed MoE):
//   enorm, hnorm [H]; e_proj, h_proj [H, H]; the layer; hc_head.{hc_fn, hc_base, hc_scale}; norm.
inline constexpr const char* kDeepseekV4MtpPrefix = "mtp.0.";
std::vector<TensorSpec> deepseek_v4_mtp_tensors(const DeepseekV4Config& c);

}  // namespace fs
