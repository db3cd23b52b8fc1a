// A GGUF model's tensors under the HF names the family schemas use (format/gguf_names.h), as
// weights the backends compute with: F32/BF16/F16 as elements, the block types as packed weights
// viewing the mapped file (nothing dequantised ahead), I32/I64 as index tables. The routed
// experts' gate and up projections, two GGUF tensors, are the one fused `gate_up_proj` the MoE ops
// read ([E, 2I, H], each expert's gate rows then its up rows), assembled by copying row blocks as
// stored (exact in any format): `weight` hands it out deferred (no data yet) and `assemble` builds
// it, so that a device load can assemble, upload and free one layer at a time (the host never
// holds more than one layer's copy), while the CPU keeps every assembled buffer (it computes on
// them) -- the one copy a GGUF load makes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/gguf.h"
#include "model/family.h"
#include "util/status.h"

namespace fs {

class GgufTensors {
 public:
  GgufTensors() = default;  // empty; `open` fills one
  // Opens the file (or split set) and maps every tensor's name. Refused: an architecture the
  // name table lacks, a tensor it does not know (named), a fused half without its partner, or
  // halves that differ in type or shape. ds4's MTP block (`mtp.*`, format/gguf_names.h) is read
  // from the file itself or from an MTP side file beside it (a *.gguf of the same architecture
  // with "mtp" in its name holding only `mtp.*` tensors, as ds4 ships it).
  static Expected<std::unique_ptr<GgufTensors>> open(const std::string& path);

  const std::string& path() const { return path_; }
  // The MTP side file taken, or "".
  const std::string& mtp_path() const { return mtp_path_; }
  bool contains(const std::string& hf_name) const { return entries_.count(hf_name) != 0; }
  const Shape& shape(const std::string& hf_name) const { return entries_.at(hf_name).shape; }
  // Every spec's tensor present with the spec's shape and a type the backends read (F32, F16,
  // BF16, Q8_0, Q2_K, Q4_K, Q5_K, Q6_K, IQ2_XXS; I32/I64 for index tables), whole blocks per
  // row. The error names the HF tensor and its GGUF name(s) (the caller adds the file).
  Status check_specs(const std::vector<TensorSpec>& specs) const;

  // The tensor as a host weight; a fused gate_up comes deferred: its shape and format, no data
  // (`empty()`), until `assemble`.
  Weight weight(const std::string& hf_name) const;
  bool fused(const std::string& hf_name) const { return entries_.at(hf_name).parts.size() == 2; }
  // The fused tensor's bytes in a buffer this object owns (built once; the same weight after).
  Weight assemble(const std::string& hf_name);
  // Frees one assembled buffer (after its weight was copied to a device).
  void release(const std::string& hf_name) { assembled_.erase(hf_name); }
  // Its values as f32 (small tensors: norms, biases, the mHC mixes).
  std::vector<float> values(const std::string& hf_name) const;
  std::vector<std::int64_t> ints(const std::string& hf_name) const;

 private:
  struct Part {
    std::string gguf_name;
    GgufTensorView view;
  };
  struct Entry {
    Shape shape;              // the HF shape
    std::vector<Part> parts;  // one, or the two halves of a fused tensor (first, second)
    quant::QuantType type() const { return parts.front().view.type; }
  };
  // Maps `m`'s tensors into entries_ (only its `mtp.*` ones when `mtp_only`).
  Status add(const GgufModel& m, const std::string& path, bool mtp_only);
  Weight view_weight(const Entry& e, const std::uint8_t* data) const;
  std::string names_of(const Entry& e) const;
  // The GGUF name(s) the table gives `hf_name` ("blk.3.attn_q_b.weight").
  std::string gguf_names_for(const std::string& hf_name) const;

  std::string path_;
  std::string architecture_;
  std::unique_ptr<GgufModel> model_;
  std::string mtp_path_;
  std::unique_ptr<GgufModel> mtp_model_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::vector<std::uint8_t>> assembled_;
};

// The MTP side file beside `path`, if there is one: a *.gguf of architecture `arch` with "mtp" in
// its name (any case) holding only `mtp.*` tensors; null when none, an error when two are.
Expected<std::unique_ptr<GgufModel>> gguf_mtp_side_file(const std::string& path,
                                                        const std::string& arch);

}  // namespace fs
