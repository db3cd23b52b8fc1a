// Writes a DeepSeek V4 safetensors checkpoint (the hf-tiny fixture) as a GGUF file the way ds4's
// quantiser lays one out: ds4's tensor names (format/gguf_names.h, read backwards), GGUF's
// inner-first dims, the routed experts' gate_up split into ffn_gate_exps / ffn_up_exps, tid2eid
// as I32, and the `deepseek4.*` metadata ds4's loader requires, derived from config.json.
// Matrices can be written as Q8_0 (blocks of 32: an f16 scale, 32 int8) and the small float
// tensors ds4 keeps in F16 as F16; `values` returns every tensor as the file holds it,
// dequantised by the project's own dequantiser, so a safetensors twin of the same weights can be
// compared against the GGUF model.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tensor/quant/quant_type.h"
#include "tensor/tensor_view.h"
#include "util/status.h"

namespace fs::test {

struct Ds4GgufOptions {
  // Projections, lm_head and the routed experts (ds4: Q8_0 and the expert block types).
  quant::QuantType matrices = quant::QuantType::kF32;
  // The embedding, router, mHC mixes, compressor/indexer weights, position biases (ds4: F16).
  quant::QuantType small = quant::QuantType::kF32;
  std::set<std::string> drop_keys;                 // `deepseek4.*` keys to leave out
  std::set<std::string> drop_tensors;              // GGUF tensor names to leave out
  std::map<std::string, std::int64_t> u32_values;  // `deepseek4.*` integer keys written instead
  std::map<std::string, quant::QuantType> types;   // GGUF tensor name -> its type instead
  std::string architecture = "deepseek4";
  // The checkpoint's MTP block (`mtp.0.*`) as ds4 ships it: a second file of `mtp.0.*` names.
  bool mtp_side_file = false;
  // The folder's tokenizer.json as tokenizer.ggml.* arrays (gguf_tokenizer_writer.h), with the
  // pre-tokenizer name `tokenizer_pre` (the tiny folders' split is Qwen2's).
  bool tokenizer = false;
  std::string tokenizer_pre = "qwen2";
};

struct Ds4Tensor {
  Shape shape;  // HF's
  std::vector<float> values;
  std::vector<std::int64_t> ints;  // index tables
};

struct Ds4Gguf {
  std::vector<std::uint8_t> file;
  std::vector<std::uint8_t> mtp_file;       // with mtp_side_file, when the checkpoint has the block
  std::map<std::string, Ds4Tensor> values;  // HF name -> what the file holds
};

// `dir`: a deepseek_v4 safetensors folder (config.json + model.safetensors).
Expected<Ds4Gguf> make_ds4_gguf(const std::string& dir, const Ds4GgufOptions& options = {});
// A safetensors folder of `values` (F32, index tables I64) with `dir`'s config.json.
Status write_safetensors_twin(const Ds4Gguf& gguf, const std::string& config_dir,
                              const std::string& out_dir);

}  // namespace fs::test
