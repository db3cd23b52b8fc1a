// GGUF tensor names -> the HF names flashserve's schemas use (canonical: without `model.`), per
// GGUF architecture, as data. Today: `deepseek4`, the names of ds4's DeepSeek V4 Flash files
// (../shared/research/arch-dsv4.md section 6; ds4's loader and quantiser). GGUF stores the routed
// experts' gate and up projections as two tensors where HF fuses them into `gate_up_proj`
// [E, 2I, H]: gate is its first half along dim 1, up the second.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fs {

enum class GgufPart : std::uint8_t {
  kWhole,
  kFirstHalf,   // rows [0, n/2) of dim 1 of the HF tensor
  kSecondHalf,  // rows [n/2, n)
};

struct GgufNameMapping {
  std::string hf_name;
  GgufPart part = GgufPart::kWhole;
};

// nullopt when the architecture or the name is not in the table.
std::optional<GgufNameMapping> map_gguf_name(std::string_view architecture,
                                             std::string_view gguf_name);
bool gguf_architecture_mapped(std::string_view architecture);
// ds4's MTP block (`mtp.0.*`, its side file's names): the block's own tensors (enorm, hnorm,
// e_proj, h_proj, hc_head_{fn,base,scale}, norm) and one decoder layer named as `blk.0.*` is,
// onto the MTP schema's HF names (`mtp.0.` + the trunk layer's names). nullopt otherwise.
std::optional<GgufNameMapping> map_gguf_mtp_name(std::string_view architecture,
                                                 std::string_view gguf_name);
// Every GGUF name the table knows for `layers` layers (blk.0 .. blk.layers-1), for coverage checks.
std::vector<std::string> gguf_names_of(std::string_view architecture, int layers);

}  // namespace fs
