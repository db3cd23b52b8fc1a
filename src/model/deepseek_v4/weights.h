// The weights of a DeepSeek V4 trunk (HF names, arch-dsv4.md 2.13). Every tensor of the schema
// is checked (shape, dtype, the int64 tid2eid tables, FP8 block scales) before anything is handed
// out. A folder named as the official release is (official_names.h) loads through its name map:
// F8_E4M3 projections with E8M0 `.scale` blocks, and per-expert FP4 routed experts, which are
// stacked into the HF layout as stored (official_experts.h).
// `load_deepseek_v4_weights` views the matrices in place in the memory-mapped checkpoint and
// widens vectors (norms, sinks, position biases, hyper-connection parameters) to f32 host vectors
// it owns; it also computes what the config implies (the two ropes' frequencies, the unit weight
// of q's unweighted head norm, the hash tables as int32). `upload_deepseek_v4_weights` then hands
// every weight to the backend once.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "format/safetensors.h"
#include "model/common/mhc.h"
#include "model/common/moe.h"
#include "model/common/router.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/official_experts.h"
#include "model/gguf_tensors.h"

namespace fs {

// A compressor (HF DeepseekV4{CSA,HCA}Compressor, or the indexer's own).
struct DsCompressorWeights {
  Weight kv_proj, gate_proj;  // [width, H]
  Weight position_bias;       // [ratio, width] f32
  Weight kv_norm;             // [D'] (D' = width, or width / 2 with overlap)
  std::int64_t ratio = 0;
  bool overlap = false;
};

// The lightning indexer (HF DeepseekV4Indexer): its compressor at index_head_dim, the query
// projection from the q latent, and the per-head score weights.
struct DsIndexerWeights {
  DsCompressorWeights compressor;
  Weight q_b_proj;      // [Hi*di, q_lora_rank]
  Weight weights_proj;  // [Hi, H]
};

struct DsAttentionWeights {
  Weight q_a_proj, q_b_proj, kv_proj;  // [Rq, H], [Hq*D, Rq], [D, H]
  Weight q_a_norm, kv_norm;            // [Rq], [D]
  Weight o_a_proj, o_b_proj;           // [G*Ro, Hq*D/G], [H, G*Ro]
  Weight sinks;                        // [Hq] f32
  std::optional<DsCompressorWeights> compressor;
  std::optional<DsIndexerWeights> indexer;
};

struct DsLayerWeights {
  DsAttentionKind kind = DsAttentionKind::kSliding;
  MhcWeights attn_hc, ffn_hc;
  Weight input_layernorm, post_attention_layernorm;  // [H]
  DsAttentionWeights attn;
  ClampedMoeWeights moe;
  // An official folder's routed experts, checked at load and stacked into moe.gate_up / down at
  // upload (official_experts.h); until then those two are empty.
  std::optional<DsOfficialExperts> official_experts;
};

// The MTP block (arch-dsv4.md 4, ds4's structure): the embedding of the token and the trunk's
// streams, each normed and projected, summed, then one decoder layer (sliding attention on the
// main rope, score-routed MoE) and its own hyper head and norm; the trunk's embedding and lm_head.
struct DsMtpWeights {
  Weight enorm, hnorm;    // [H]
  Weight e_proj, h_proj;  // [H, H]
  DsLayerWeights layer;
  MhcHeadWeights hc_head;
  Weight norm;  // [H]
};

struct DeepseekV4Weights {
  // Owns the mapping every host Weight points into (a safetensors checkpoint or a GGUF file),
  // and the widened / computed vectors.
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<GgufTensors> gguf;
  std::vector<std::unique_ptr<std::vector<float>>> host_vectors;
  std::vector<std::unique_ptr<std::vector<std::int32_t>>> host_ints;
  // The official release's routed experts stacked per layer (packed FP4 and E8M0 scales) for a
  // host backend, which computes on them; a device backend's upload stacks one layer at a time
  // into a buffer it frees.
  std::vector<std::unique_ptr<std::vector<std::uint8_t>>> host_bytes;
  bool official_names = false;  // the folder used the official release's names
  Weight embed_tokens, lm_head;
  Weight norm;  // [H]
  MhcHeadWeights hc_head;
  Weight unit_head;          // [D] ones: q's unweighted per-head RMSNorm as a weighted one
  Weight main_inv_freq;      // [r/2]: sliding layers
  Weight compress_inv_freq;  // [r/2]: CSA/HCA layers, their compressors and indexers
  std::vector<DsLayerWeights> layers;
  DType dtype = DType::kF32;        // of the largest weights (embed_tokens)
  std::optional<DsMtpWeights> mtp;  // absent: the checkpoint runs autoregressively
};

// `dir`: a model folder, or a GGUF file of ds4's names (model/gguf_tensors.h).
Expected<DeepseekV4Weights> load_deepseek_v4_weights(const DeepseekV4Config& c,
                                                     const std::string& dir);

class Backend;
// Replaces every weight by the backend's own copy (`Backend::upload`): matrices as
// `matrix_dtype` (FP8 and FP4 ones as stored), except the hyper-connection and router matrices,
// which the reference keeps in fp32 and which stay f32.
Status upload_deepseek_v4_weights(DeepseekV4Weights& w, Backend& be, DType matrix_dtype);

}  // namespace fs
