#include "model/inspect.h"

#include <set>
#include <variant>

#include "model/deepseek_v4/official_names.h"

namespace fs {
namespace {

bool shape_matches(const Shape& want, const Shape& got) {
  if (want.size() != got.size()) return false;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] != -1 && want[i] != got[i]) return false;
  }
  return true;
}

constexpr std::string_view kNgramTable = "ple_embedding.ngram_embedding.";

// The routed experts' names: HF's stacked tensors, and the release's per-expert ones.
bool routed_expert(const std::string& hf_or_stored) {
  return hf_or_stored.find("mlp.experts.") != std::string::npos ||
         hf_or_stored.find(".ffn.experts.") != std::string::npos;
}

struct ExpertCounts {
  std::int64_t experts = 0, per_token = 0;
};

ExpertCounts expert_counts(const ModelDescription& d) {
  return std::visit(
      [](const auto& c) -> ExpertCounts {
        if constexpr (requires { c.n_routed_experts; })
          return {c.n_routed_experts, c.num_experts_per_tok};
        else if constexpr (requires { c.num_experts; })
          return {c.num_experts, c.num_experts_per_tok};
        else
          return {};
      },
      d.config);
}

// N-gram heads of the PLE tables (Qwen): the rows a token reads from each PLE layer's table.
std::int64_t ngram_heads(const ModelDescription& d) {
  return std::visit(
      [](const auto& c) -> std::int64_t {
        if constexpr (requires { c.ngram_heads(); })
          return c.ngram_heads();
        else
          return 0;
      },
      d.config);
}

// The block scales stored beside weight `name` ("" when none): `<name>_scale_inv` or, for the
// official names, `<base>.scale`.
std::string scale_tensor(const Checkpoint& ck, const std::string& name) {
  if (ck.contains(name + "_scale_inv")) return name + "_scale_inv";
  const auto dot = official_scale_name(name);
  if (name.ends_with(".weight") && ck.contains(dot)) return dot;
  return "";
}

// "F8_E4M3 with 128x128 E8M0 scales", "F4_E2M1 with 1x32 E8M0 scales", or the dtype.
std::string storage_format(const TensorView& w, const TensorView* scales) {
  if (scales == nullptr) return std::string(dtype_name(w.dtype));
  const std::string scale_type = scales->dtype == DType::kF8E8M0 ? "E8M0" : "F32";
  if (w.dtype == DType::kI8 || w.dtype == DType::kU8)
    return "F4_E2M1 with 1x32 " + scale_type + " scales";
  return std::string(dtype_name(w.dtype)) + " with 128x128 " + scale_type + " scales";
}

// Elements a stored tensor holds weights for (two per byte for FP4 codes).
std::int64_t weight_elements(const TensorView& w, bool fp4) {
  return shape_numel(w.shape) * (fp4 ? 2 : 1);
}

}  // namespace

InspectReport inspect_checkpoint(const ModelDescription& d, const Checkpoint& ck) {
  InspectReport r;
  r.description = d;
  r.shards = ck.shard_count();
  r.official_names = d.family == Family::kDeepseekV4 && deepseek_v4_official_names(ck);
  const auto counts = expert_counts(d);
  r.experts = counts.experts;
  r.experts_per_token = counts.per_token;
  // Stored name -> the schema's name (official folders).
  std::map<std::string, std::string> hf_of;
  std::set<std::string> expected;
  auto check = [&](const std::string& stored, const std::string& spec_name, const Shape& shape,
                   bool integer) {
    expected.insert(stored);
    const auto view = ck.view(stored);
    if (!view) {
      r.missing_tensors.push_back(stored);
      return;
    }
    const bool fp4 = view->dtype == DType::kI8;
    const bool dtype_ok = integer ? !dtype_is_float(view->dtype)
                                  : dtype_is_float(view->dtype) || (fp4 && routed_expert(stored));
    if (!shape_matches(shape, view->shape) || !dtype_ok) {
      r.mismatched_tensors.push_back(
          stored + ": expected " + shape_to_string(shape) + (integer ? " integer" : " float") +
          ", found " + shape_to_string(view->shape) + " " + std::string(dtype_name(view->dtype)));
    }
    if (stored != spec_name) hf_of[stored] = spec_name;
  };
  for (const auto& spec : d.tensors) {
    if (!r.official_names) {
      check(spec.name, spec.name, spec.shape, spec.integer);
      continue;
    }
    const bool gate_up = spec.name.ends_with("mlp.experts.gate_up_proj");
    if (gate_up || spec.name.ends_with("mlp.experts.down_proj")) {
      // [E, out, in] stands for E tensors per projection of [out, in/2] FP4 codes.
      const auto prefix = spec.name.substr(0, spec.name.find("mlp.experts."));
      const auto E = spec.shape[0], rows = spec.shape[1], cols = spec.shape[2];
      const auto out = gate_up ? rows / 2 : rows;
      for (std::int64_t e = 0; e < E; ++e) {
        for (const auto p : gate_up
                                ? std::vector{DsExpertProjection::kGate, DsExpertProjection::kUp}
                                : std::vector{DsExpertProjection::kDown}) {
          const auto base = official_expert_name(prefix, e, p);
          check(base + ".weight", spec.name, {out, cols / 2}, false);
        }
      }
      continue;
    }
    check(deepseek_v4_official_name(spec.name).value_or(spec.name), spec.name, spec.shape,
          spec.integer);
  }

  // How each tensor is stored; the scale tensors are their weights'.
  std::set<std::string> scale_names;
  for (const auto& [name, stored] : ck.tensors()) {
    const auto s = scale_tensor(ck, name);
    if (!s.empty()) scale_names.insert(s);
  }
  const bool tied = !ck.contains("lm_head.weight") && !ck.contains("head.weight");
  std::map<std::string, std::int64_t> ngram_rows;  // PLE table rows per layer prefix
  for (const auto& [name, stored] : ck.tensors()) {
    if (const auto at = name.find(kNgramTable); at != std::string::npos)
      ngram_rows[name.substr(0, at)] += stored.entry->shape.empty() ? 0 : stored.entry->shape[0];
  }
  for (const auto& [name, stored] : ck.tensors()) {
    const TensorEntry& e = *stored.entry;
    r.bytes_by_dtype[std::string(dtype_name(e.dtype))] += e.end - e.begin;
    if (scale_names.count(name)) continue;
    const auto view = *ck.view(name);
    const auto scale_name = scale_tensor(ck, name);
    const auto scales = scale_name.empty() ? std::nullopt : ck.view(scale_name);
    TensorStorage t;
    t.name = name;
    if (const auto h = hf_of.find(name); h != hf_of.end() && !routed_expert(name))
      t.hf_name = h->second;
    else if (r.official_names && !routed_expert(name))
      t.hf_name = deepseek_v4_hf_name(name).value_or("");
    t.format = storage_format(view, scales ? &*scales : nullptr);
    t.shape = e.shape;
    t.bytes = (e.end - e.begin) + (scales ? scales->bytes.size() : 0);
    t.mtp = is_mtp_tensor(d, name);
    const bool fp4 = scales && (view.dtype == DType::kI8 || view.dtype == DType::kU8);
    if (dtype_is_float(e.dtype) || fp4) r.parameters += weight_elements(view, fp4);
    // What one decode step reads of it.
    const auto rows = e.shape.empty() ? 1 : e.shape[0];
    const auto row = rows > 0 ? t.bytes / static_cast<std::uint64_t>(rows) : 0;
    const auto& hf = t.hf_name.empty() ? name : t.hf_name;
    if (hf.ends_with("embed_tokens.weight") && !tied) {
      t.decode_bytes = row;
    } else if (hf.ends_with("tid2eid")) {
      t.decode_bytes = row;
    } else if (const auto at = name.find(kNgramTable); at != std::string::npos) {
      // NH rows a token of each PLE layer's table, whose rows may be split into shards.
      const auto all = ngram_rows[name.substr(0, at)];
      t.decode_bytes = all > 0 ? row * static_cast<std::uint64_t>(ngram_heads(d) * rows / all) : 0;
    } else if (routed_expert(name) && counts.experts > 0) {
      t.decode_bytes = t.bytes * static_cast<std::uint64_t>(counts.per_token) /
                       static_cast<std::uint64_t>(counts.experts);
    } else {
      t.decode_bytes = t.bytes;
    }
    r.bytes_by_format[t.format] += t.bytes;
    if (t.mtp) {
      r.mtp_decode_bytes += t.decode_bytes;
    } else {
      r.decode_bytes += t.decode_bytes;
      r.decode_bytes_by_format[t.format] += t.decode_bytes;
    }
    r.tensors.push_back(std::move(t));
    if (expected.count(name)) continue;
    if (is_mtp_tensor(d, name)) {
      r.mtp_tensors.push_back(name);
    } else {
      r.unexpected_tensors.push_back(name);
    }
  }
  // A quantised weight without its scales, or scales of the wrong dtype, is not loadable.
  for (const auto& t : r.tensors) {
    const auto v = *ck.view(t.name);
    const bool needs_scales = v.dtype == DType::kF8E4M3 || v.dtype == DType::kI8;
    if (needs_scales && t.format == dtype_name(v.dtype))
      r.mismatched_tensors.push_back(t.name + ": " + std::string(dtype_name(v.dtype)) +
                                     " without its block scales (" + t.name + "_scale_inv or " +
                                     official_scale_name(t.name) + ")");
  }
  return r;
}

Expected<InspectReport> inspect_model_dir(const std::string& dir) {
  auto d = describe_model(dir);
  if (!d.ok()) return d.status();
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  return inspect_checkpoint(*d, *ck);
}

}  // namespace fs
