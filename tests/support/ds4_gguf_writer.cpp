#include "ds4_gguf_writer.h"

#include "gguf_tokenizer_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "format/gguf_names.h"
#include "format/safetensors.h"
#include "format/safetensors_writer.h"
#include "gguf_test_writer.h"
#include "model/convert.h"
#include "tensor/quant/dequantize.h"

namespace fs::test {
namespace {

using quant::QuantType;

// f32 -> IEEE half, round to nearest even (finite inputs of the fixture's range).
std::uint16_t to_f16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const int exp = static_cast<int>((x >> 23) & 0xff) - 127 + 15;
  std::uint32_t mant = x & 0x7fffffu;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - exp;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rest = mant & ((1u << shift) - 1);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = (static_cast<std::uint32_t>(exp) << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1))) ++half;  // may carry into the exponent
  return static_cast<std::uint16_t>(sign | half);
}

// One row of Q8_0 blocks: d = max|x| / 127 (stored f16), q = round(x / d).
void q8_0_row(const float* x, std::int64_t n, std::vector<std::uint8_t>& out) {
  for (std::int64_t b = 0; b < n; b += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b + j]));
    const float d = amax / 127.0f;
    const std::uint16_t h = to_f16(d);
    out.push_back(static_cast<std::uint8_t>(h & 0xff));
    out.push_back(static_cast<std::uint8_t>(h >> 8));
    const float id = d > 0 ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const auto q =
          static_cast<std::int8_t>(std::lround(std::clamp(x[b + j] * id, -127.f, 127.f)));
      out.push_back(static_cast<std::uint8_t>(q));
    }
  }
}

// The tensor's bytes in `t`, and the values they decode to.
std::vector<std::uint8_t> encode(QuantType t, const std::vector<float>& v, std::int64_t cols,
                                 std::vector<float>& decoded) {
  std::vector<std::uint8_t> out;
  if (t == QuantType::kF32) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
  } else if (t == QuantType::kF64) {
    for (const float f : v) GgufBuilder::append(out, GgufBuilder::le(static_cast<double>(f)));
  } else if (t == QuantType::kF16) {
    for (const float f : v) {
      const auto h = to_f16(f);
      out.push_back(static_cast<std::uint8_t>(h & 0xff));
      out.push_back(static_cast<std::uint8_t>(h >> 8));
    }
  } else {
    for (std::size_t r = 0; r < v.size(); r += static_cast<std::size_t>(cols))
      q8_0_row(v.data() + r, cols, out);
  }
  decoded.resize(v.size());
  (void)quant::dequantize(t, out, decoded);
  return out;
}

// Which type a tensor gets: ds4 keeps vectors in F32, its small matrices in F16 and quantises
// the projections, the output head and the routed experts.
QuantType type_of(const std::string& gguf, const Shape& hf_shape, const Ds4GgufOptions& o) {
  if (const auto it = o.types.find(gguf); it != o.types.end()) return it->second;
  if (hf_shape.size() < 2) return QuantType::kF32;
  const bool big =
      gguf == "output.weight" || gguf.ends_with("_exps.weight") ||
      gguf.ends_with("_shexp.weight") || gguf.find(".attn_q_a.") != std::string::npos ||
      gguf.find(".attn_q_b.") != std::string::npos || gguf.find(".attn_kv.") != std::string::npos ||
      gguf.find(".attn_output_") != std::string::npos;
  const QuantType t = big ? o.matrices : o.small;
  // Q8_0 needs whole blocks per row.
  if (t == QuantType::kQ8_0 && hf_shape.back() % 32 != 0) return QuantType::kF16;
  return t;
}

std::vector<std::uint64_t> gguf_dims(const Shape& s) {
  std::vector<std::uint64_t> d;
  for (auto it = s.rbegin(); it != s.rend(); ++it) d.push_back(static_cast<std::uint64_t>(*it));
  return d;
}

std::vector<std::uint8_t> f32_array(const std::vector<float>& v) {
  auto b = GgufBuilder::le(std::uint32_t{6});
  GgufBuilder::append(b, GgufBuilder::le(static_cast<std::uint64_t>(v.size())));
  for (const float x : v) GgufBuilder::append(b, GgufBuilder::le(x));
  return b;
}

}  // namespace

Expected<Ds4Gguf> make_ds4_gguf(const std::string& dir, const Ds4GgufOptions& o) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  std::stringstream text;
  text << in.rdbuf();
  const auto c = nlohmann::json::parse(text.str());
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  const auto L = c["num_hidden_layers"].get<std::int64_t>();

  GgufBuilder g;
  g.kv_string("general.architecture", o.architecture);
  auto u32 = [&](const std::string& key, std::int64_t v) {
    if (const auto it = o.u32_values.find(key); it != o.u32_values.end()) v = it->second;
    if (!o.drop_keys.count(key)) g.kv_u32("deepseek4." + key, static_cast<std::uint32_t>(v));
  };
  auto f32 = [&](const std::string& key, double v) {
    if (!o.drop_keys.count(key)) g.kv_f32("deepseek4." + key, static_cast<float>(v));
  };
  u32("block_count", L);
  u32("embedding_length", c["hidden_size"]);
  u32("vocab_size", c["vocab_size"]);
  u32("context_length", c["max_position_embeddings"]);
  u32("attention.head_count", c["num_attention_heads"]);
  u32("attention.head_count_kv", c["num_key_value_heads"]);
  u32("attention.key_length", c["head_dim"]);
  u32("attention.value_length", c["head_dim"]);
  u32("rope.dimension_count", c["qk_rope_head_dim"]);
  u32("attention.q_lora_rank", c["q_lora_rank"]);
  u32("attention.output_lora_rank", c["o_lora_rank"]);
  u32("attention.output_group_count", c["o_groups"]);
  u32("expert_count", c["n_routed_experts"]);
  u32("expert_used_count", c["num_experts_per_tok"]);
  u32("expert_feed_forward_length", c["moe_intermediate_size"]);
  u32("expert_shared_count", c["n_shared_experts"]);
  u32("expert_group_count", 0);
  u32("expert_group_used_count", 0);
  std::int64_t hash_layers = 0;
  for (const auto& t : c["mlp_layer_types"]) hash_layers += t == "hash_moe";
  u32("hash_layer_count", hash_layers);
  u32("attention.sliding_window", c["sliding_window"]);
  u32("attention.indexer.head_count", c["index_n_heads"]);
  u32("attention.indexer.key_length", c["index_head_dim"]);
  u32("attention.indexer.top_k", c["index_topk"]);
  u32("hyper_connection.count", c["hc_mult"]);
  u32("hyper_connection.sinkhorn_iterations", c["hc_sinkhorn_iters"]);
  f32("hyper_connection.epsilon", c["hc_eps"]);
  f32("attention.layer_norm_rms_epsilon", c["rms_norm_eps"]);
  f32("expert_weights_scale", c["routed_scaling_factor"]);
  f32("rope.freq_base", c["rope_theta"]);
  f32("attention.compress_rope_freq_base", c["compress_rope_theta"]);
  // The fixture's compress rope is plain: a factor of 1.
  f32("rope.scaling.factor", 1.0);
  u32("rope.scaling.original_context_length", c["max_position_embeddings"]);
  f32("rope.scaling.yarn_beta_fast", 32.0);
  f32("rope.scaling.yarn_beta_slow", 1.0);
  if (!o.drop_keys.count("expert_weights_norm")) g.kv_bool("deepseek4.expert_weights_norm", true);
  if (!o.drop_keys.count("swiglu_clamp_exp"))
    g.raw_kv(
        "deepseek4.swiglu_clamp_exp", 9,
        f32_array(std::vector<float>(static_cast<std::size_t>(L), c["swiglu_limit"].get<float>())));
  if (!o.drop_keys.count("attention.compress_ratios")) {
    std::vector<std::int32_t> ratios;
    const auto& rates = c["compress_rates"];
    for (const auto& t : c["layer_types"]) {
      ratios.push_back(t == "sliding_attention" ? 0
                       : t == "compressed_sparse_attention"
                           ? rates["compressed_sparse_attention"].get<std::int32_t>()
                           : rates["heavily_compressed_attention"].get<std::int32_t>());
    }
    ratios.push_back(0);  // ds4's files carry more entries than layers (the MTP layer's)
    g.kv_i32_array("deepseek4.attention.compress_ratios", ratios);
  }
  g.kv_u32("tokenizer.ggml.bos_token_id", c["bos_token_id"].get<std::uint32_t>());
  g.kv_u32("tokenizer.ggml.eos_token_id", c["eos_token_id"].get<std::uint32_t>());
  if (o.tokenizer)
    put_vocab(g, vocab_of((std::filesystem::path(dir) / "tokenizer.json").string()),
              o.tokenizer_pre);

  Ds4Gguf out;
  // One checkpoint tensor under its GGUF name into `to`.
  auto put = [&](GgufBuilder& to, const std::string& name, const GgufNameMapping& m0) {
    const auto* m = &m0;
    const auto v = ck->view(m->hf_name);
    if (!v || o.drop_tensors.count(name)) return;
    if (v->dtype == DType::kI64) {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(v->numel()));
      std::memcpy(ids.data(), v->bytes.data(), ids.size() * 8);
      std::vector<std::uint8_t> bytes;
      for (const auto id : ids)
        GgufBuilder::append(bytes, GgufBuilder::le(static_cast<std::int32_t>(id)));
      to.tensor({name, static_cast<std::uint32_t>(quant::quant_info(QuantType::kI32).ggml_id),
                 gguf_dims(v->shape), std::move(bytes), std::nullopt});
      out.values[m->hf_name] = {v->shape, {}, std::move(ids)};
      return;
    }
    std::vector<float> all(static_cast<std::size_t>(v->numel()));
    convert_to_f32(v->dtype, v->bytes.data(), all.data(), all.size());
    Shape shape = v->shape;
    std::vector<float> part = all;
    if (m->part != GgufPart::kWhole) {
      // Rows [0, n/2) or [n/2, n) of dim 1 of [E, 2I, H], per expert.
      const auto E = shape[0], I = shape[1] / 2, H = shape[2];
      const auto first = m->part == GgufPart::kFirstHalf ? 0 : I;
      part.clear();
      for (std::int64_t e = 0; e < E; ++e) {
        const auto at = all.begin() + (e * 2 * I + first) * H;
        part.insert(part.end(), at, at + I * H);
      }
      shape[1] = I;
    }
    const QuantType t = type_of(name, shape, o);
    std::vector<float> decoded;
    auto bytes = encode(t, part, shape.back(), decoded);
    to.tensor({name, static_cast<std::uint32_t>(quant::quant_info(t).ggml_id), gguf_dims(shape),
               std::move(bytes), std::nullopt});
    auto& dst = out.values[m->hf_name];
    dst.shape = v->shape;
    if (m->part == GgufPart::kWhole) {
      dst.values = std::move(decoded);
      return;
    }
    // Put the half back where it came from in the fused tensor.
    dst.values.resize(all.size());
    const auto E = v->shape[0], I = v->shape[1] / 2, H = v->shape[2];
    const auto first = m->part == GgufPart::kFirstHalf ? 0 : I;
    for (std::int64_t e = 0; e < E; ++e)
      std::copy_n(decoded.begin() + e * I * H, I * H, dst.values.begin() + (e * 2 * I + first) * H);
  };
  // Every GGUF name the table knows, for the tensors the checkpoint has.
  for (const auto& name : gguf_names_of("deepseek4", static_cast<int>(L)))
    put(g, name, *map_gguf_name("deepseek4", name));
  // The MTP block's names: its own, and its layer's as blk.0's.
  if (o.mtp_side_file) {
    GgufBuilder mtp;
    mtp.kv_string("general.architecture", o.architecture);
    std::vector<std::string> names = {
        "enorm.weight", "hnorm.weight",      "e_proj.weight",       "h_proj.weight",
        "norm.weight",  "hc_head_fn.weight", "hc_head_base.weight", "hc_head_scale.weight"};
    for (const auto& n : gguf_names_of("deepseek4", 1)) {
      if (n.rfind("blk.0.", 0) == 0) names.push_back(n.substr(6));
    }
    bool any = false;
    for (const auto& n : names) {
      const auto gname = "mtp.0." + n;
      const auto m = map_gguf_mtp_name("deepseek4", gname);
      if (!m || !ck->contains(m->hf_name)) continue;
      put(mtp, gname, *m);
      any = true;
    }
    if (any) out.mtp_file = mtp.build();
  }
  out.file = g.build();
  return out;
}

Status write_safetensors_twin(const Ds4Gguf& gguf, const std::string& config_dir,
                              const std::string& out_dir) {
  std::filesystem::create_directories(out_dir);
  std::filesystem::copy_file(std::filesystem::path(config_dir) / "config.json",
                             std::filesystem::path(out_dir) / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : gguf.values) {
    if (!t.ints.empty()) {
      tensors.push_back(
          {name,
           DType::kI64,
           t.shape,
           {reinterpret_cast<const std::uint8_t*>(t.ints.data()), t.ints.size() * 8}});
    } else {
      tensors.push_back(
          {name,
           DType::kF32,
           t.shape,
           {reinterpret_cast<const std::uint8_t*>(t.values.data()), t.values.size() * 4}});
    }
  }
  return write_safetensors((std::filesystem::path(out_dir) / "model.safetensors").string(),
                           tensors);
}

}  // namespace fs::test
