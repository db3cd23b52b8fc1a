#include "model/gguf_inspect.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "format/gguf_names.h"
#include "tokenizer/gguf_tokenizer.h"

namespace fs {
namespace {

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// N of "blk.N.", or -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  int n = 0;
  std::size_t i = 4;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) {
    n = n * 10 + (name[i] - '0');
    if (n > 100000) return -1;
  }
  return (i < name.size() && name[i] == '.') ? n : -1;
}

std::uint64_t uint_key(const GgufModel& m, const std::string& key) {
  const GgufValue* v = m.find(key);
  if (!v) return 0;
  return v->as_uint().value_or(0);
}

void add(GgufDecodeBytes& d, const std::string& type, std::uint64_t bytes) {
  d.total += bytes;
  d.by_type[type] += bytes;
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && magic[0] == 'G' && magic[1] == 'G' && magic[2] == 'U' &&
         magic[3] == 'F';
}

namespace {

void inspect_tokenizer(const GgufModel& model, GgufInspectReport::Tokenizer& t) {
  if (model.find("tokenizer.huggingface.json")) {
    t.source = "tokenizer.huggingface.json";
  } else if (const auto* m = model.find("tokenizer.ggml.model")) {
    const auto* pre = model.find("tokenizer.ggml.pre");
    t.source = "tokenizer.ggml.* (" + m->as_string().value_or("?") + ", pre " +
               (pre ? pre->as_string().value_or("?") : std::string("absent")) + ")";
  }
  auto built = tokenizer_from_gguf(model.metadata(), "the file");
  if (built.ok()) {
    t.usable = true;
    t.tokens = built->tokenizer.id_space();
  } else {
    t.problem = built.status().message();
  }
}

}  // namespace

GgufInspectReport inspect_gguf(const GgufModel& model) {
  GgufInspectReport r;
  r.splits = model.split_count();
  r.version = model.split(0).header().version;
  if (const auto* a = model.find("general.architecture"))
    r.architecture = a->as_string().value_or("");
  for (const auto& [key, value] : model.metadata()) r.metadata[key] = value.summary();
  const std::string arch = r.architecture;
  r.expert_count = uint_key(model, arch + ".expert_count");
  r.expert_used_count = uint_key(model, arch + ".expert_used_count");
  r.names_mapped = gguf_architecture_mapped(arch);
  r.tied_output =
      model.tensors().count("token_embd.weight") && !model.tensors().count("output.weight");

  for (const auto& [name, stored] : model.tensors()) {
    const GgufTensorInfo& info = *stored.info;
    GgufInspectReport::Tensor t;
    t.name = name;
    t.type = std::string(quant::quant_name(info.type));
    t.shape = info.shape;
    t.bytes = info.bytes;
    t.layer = layer_of(name);
    t.mtp = name.rfind("mtp.", 0) == 0;
    if (r.names_mapped && !t.mtp) {
      if (const auto hf = map_gguf_name(arch, name)) {
        t.hf_name = hf->hf_name;
      } else {
        r.unmapped_tensors.push_back(name);
      }
    }
    const std::int64_t rows = info.shape.empty() ? 1 : info.shape.front();
    const bool one_row = (name == "token_embd.weight" && !r.tied_output) ||
                         ends_with(name, "tid2eid.weight") || ends_with(name, "tid2eid");
    const bool experts = ends_with(name, "_exps.weight") && info.shape.size() == 3;
    if (one_row && rows > 0) {
      t.decode_bytes = info.bytes / static_cast<std::uint64_t>(rows);
    } else if (experts) {
      const auto e = static_cast<std::uint64_t>(info.shape[0]);
      const std::uint64_t used = r.expert_used_count ? std::min(r.expert_used_count, e) : e;
      t.decode_bytes = e ? info.bytes / e * used : 0;
    } else {
      t.decode_bytes = info.bytes;
    }

    auto& totals = r.by_type[t.type];
    totals.tensors += 1;
    totals.elements += info.shape.empty() ? 1 : static_cast<std::uint64_t>(shape_numel(info.shape));
    totals.bytes += info.bytes;
    r.bytes += info.bytes;
    if (quant::quant_info(info.type).is_float) {
      r.parameters += info.shape.empty() ? 1 : static_cast<std::uint64_t>(shape_numel(info.shape));
    }
    if (t.mtp) {
      add(r.mtp, t.type, t.decode_bytes);
    } else {
      add(r.decode, t.type, t.decode_bytes);
      if (t.layer >= 0) {
        if (r.decode_per_layer.size() <= static_cast<std::size_t>(t.layer))
          r.decode_per_layer.resize(t.layer + 1);
        add(r.decode_per_layer[static_cast<std::size_t>(t.layer)], t.type, t.decode_bytes);
      } else {
        add(r.decode_outside_layers, t.type, t.decode_bytes);
      }
    }
    r.tensors.push_back(std::move(t));
  }
  inspect_tokenizer(model, r.tokenizer);
  return r;
}

Expected<GgufInspectReport> inspect_gguf_path(const std::string& path) {
  auto m = GgufModel::open(path);
  if (!m.ok()) return m.status();
  return inspect_gguf(*m);
}

}  // namespace fs
