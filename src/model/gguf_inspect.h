// `flashserve inspect` on a GGUF file or split set: the architecture's metadata, each tensor's
// quantisation, totals by type, and the bytes a decode step reads per token.
//
// Bytes per token follow from the GGUF tensor names that llama.cpp and ds4 share (`blk.N.` for
// layer N, `*_exps` for routed experts, `token_embd` for the embedding), not from a family
// schema: a step reads every dense tensor whole, one row of the token embedding (the whole of it
// when the output head is tied to it, i.e. there is no `output.weight`), one row of a hash-routing
// table (`*tid2eid`), and of each routed-expert tensor the share expert_used_count /
// expert_count. Tensors under `mtp.` (ds4's MTP file) are counted apart: plain decode does not
// read them. Where the architecture has a name map (ds4's deepseek4), each tensor gets its HF
// name and those the map lacks are listed.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "format/gguf.h"

namespace fs {

struct GgufTypeTotals {
  std::uint64_t tensors = 0;
  std::uint64_t elements = 0;
  std::uint64_t bytes = 0;
};

struct GgufDecodeBytes {
  std::uint64_t total = 0;
  std::map<std::string, std::uint64_t> by_type;
};

struct GgufInspectReport {
  std::string architecture;  // general.architecture ("" when absent)
  std::uint32_t version = 0;
  std::size_t splits = 0;
  std::map<std::string, std::string> metadata;  // key -> GgufValue::summary()
  struct Tensor {
    std::string name;
    std::string type;
    Shape shape;
    std::uint64_t bytes = 0;
    std::uint64_t decode_bytes = 0;  // read per decoded token
    int layer = -1;                  // N of blk.N., -1 otherwise
    std::string hf_name;             // our schema's name, where the architecture's map has one
    bool mtp = false;
  };
  std::vector<Tensor> tensors;  // sorted by name
  std::map<std::string, GgufTypeTotals> by_type;
  std::uint64_t parameters = 0;  // elements of the float tensors
  std::uint64_t bytes = 0;
  // Per token, autoregressive decode (MTP tensors excluded).
  GgufDecodeBytes decode;
  std::vector<GgufDecodeBytes> decode_per_layer;  // index = layer
  GgufDecodeBytes decode_outside_layers;          // embedding, head, final norm
  GgufDecodeBytes mtp;                            // the MTP block's own tensors, per draft step
  std::uint64_t expert_count = 0;                 // <arch>.expert_count (0: not a MoE)
  std::uint64_t expert_used_count = 0;
  bool tied_output = false;
  // For architectures with a name map (format/gguf_names.h): tensors outside the map, MTP apart.
  bool names_mapped = false;
  std::vector<std::string> unmapped_tensors;
  // The tokenizer the file carries (tokenizer/gguf_tokenizer.h): usable or not, where it comes
  // from ("tokenizer.ggml.* (pre qwen2)", "tokenizer.huggingface.json", "none") and the reason
  // when it cannot be used; `tokens` its id space.
  struct Tokenizer {
    bool usable = false;
    std::string source = "none";
    std::string problem;
    std::uint64_t tokens = 0;
  } tokenizer;
};

GgufInspectReport inspect_gguf(const GgufModel& model);
Expected<GgufInspectReport> inspect_gguf_path(const std::string& path);
// True when `path` is a file that starts with the GGUF magic.
bool is_gguf_file(const std::string& path);

}  // namespace fs
