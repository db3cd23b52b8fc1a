#include "model/gguf_tensors.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "format/gguf_names.h"

namespace fs {
namespace {

using quant::QuantType;

// What the backends read in place: elements, and the GGUF block types both the CPU ops
// (dequantising rows) and the CUDA kernels (reading blocks) know.
bool readable(QuantType t) {
  switch (t) {
    case QuantType::kF32:
    case QuantType::kF16:
    case QuantType::kBF16:
    case QuantType::kQ8_0:
    case QuantType::kQ2_K:
    case QuantType::kQ4_K:
    case QuantType::kQ5_K:
    case QuantType::kQ6_K:
    case QuantType::kIQ2_XXS:
      return true;
    default:
      return false;
  }
}

std::optional<DType> element_dtype(QuantType t) {
  switch (t) {
    case QuantType::kF32:
      return DType::kF32;
    case QuantType::kF16:
      return DType::kF16;
    case QuantType::kBF16:
      return DType::kBF16;
    case QuantType::kI32:
      return DType::kI32;
    case QuantType::kI64:
      return DType::kI64;
    default:
      return std::nullopt;
  }
}

}  // namespace

Expected<std::unique_ptr<GgufModel>> gguf_mtp_side_file(const std::string& path,
                                                        const std::string& arch) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  const auto folder = stdfs::path(path).parent_path();
  std::unique_ptr<GgufModel> found;
  for (const auto& f : stdfs::directory_iterator(folder.empty() ? "." : folder, ec)) {
    std::string name = f.path().filename().string();
    std::string lower = name;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    if (!lower.ends_with(".gguf") || lower.find("mtp") == std::string::npos ||
        stdfs::equivalent(f.path(), path, ec))
      continue;
    auto m = GgufModel::open(f.path().string());
    if (!m.ok()) continue;  // not ours to judge: only a file that is an MTP block is taken
    const GgufValue* a = m->find("general.architecture");
    if (!a || a->as_string().value_or("") != arch) continue;
    bool all_mtp = !m->tensors().empty();
    for (const auto& [t, stored] : m->tensors()) all_mtp = all_mtp && t.rfind("mtp.", 0) == 0;
    if (!all_mtp) continue;
    if (found)
      return invalid_argument(path + ": two MTP side files beside it, " + found->split(0).path() +
                              " and " + f.path().string() + "; keep one");
    found = std::make_unique<GgufModel>(std::move(m).value());
  }
  return found;
}

Status GgufTensors::add(const GgufModel& m, const std::string& path, bool mtp_only) {
  for (const auto& [name, stored] : m.tensors()) {
    const bool mtp = name.rfind("mtp.", 0) == 0;
    if (mtp_only && !mtp) continue;
    const auto mapped =
        mtp ? map_gguf_mtp_name(architecture_, name) : map_gguf_name(architecture_, name);
    if (!mapped)
      return corrupt(path + ": tensor " + name + " is not a " + architecture_ +
                     " tensor (the name table does not know it)");
    auto view = m.view(name);
    if (!view) return corrupt(path + ": tensor " + name + " has no data");
    Entry& e = entries_[mapped->hf_name];
    const std::size_t slot = mapped->part == GgufPart::kSecondHalf ? 1 : 0;
    const std::size_t need = mapped->part == GgufPart::kWhole ? 1 : 2;
    if (e.parts.size() < need) e.parts.resize(need);
    if (!e.parts[slot].gguf_name.empty())
      return corrupt(path + ": " + name + " and " + e.parts[slot].gguf_name + " are both " +
                     mapped->hf_name);
    e.parts[slot] = {name, *view};
  }
  return {};
}

Expected<std::unique_ptr<GgufTensors>> GgufTensors::open(const std::string& path) {
  auto m = GgufModel::open(path);
  if (!m.ok()) return m.status();
  auto t = std::make_unique<GgufTensors>();
  t->path_ = path;
  t->model_ = std::make_unique<GgufModel>(std::move(m).value());
  const GgufValue* a = t->model_->find("general.architecture");
  const std::string arch = a ? a->as_string().value_or("") : "";
  t->architecture_ = arch;
  if (!gguf_architecture_mapped(arch))
    return unsupported(path + ": GGUF architecture '" + arch + "' has no tensor name table");
  if (Status s = t->add(*t->model_, path, false); !s.ok()) return s;
  // ds4 ships the MTP block as a file of its own: a sibling whose name says MTP and whose
  // tensors are all `mtp.*` joins the model.
  if (auto side = gguf_mtp_side_file(path, arch); !side.ok()) {
    return side.status();
  } else if (*side) {
    t->mtp_path_ = (*side)->split(0).path();
    t->mtp_model_ = std::move(*side);
    if (Status s = t->add(*t->mtp_model_, t->mtp_path_, true); !s.ok()) return s;
  }
  for (auto& [hf, e] : t->entries_) {
    for (const auto& p : e.parts) {
      if (p.gguf_name.empty())
        return not_found(path + ": " + hf + " is fused from two GGUF tensors and one is missing (" +
                         t->names_of(e) + " present)");
    }
    e.shape = e.parts.front().view.shape;
    if (e.parts.size() == 2) {
      const auto& g = e.parts[0].view;
      const auto& u = e.parts[1].view;
      if (g.type != u.type || g.shape != u.shape)
        return corrupt(path + ": " + e.parts[0].gguf_name + " (" +
                       std::string(quant::quant_name(g.type)) + " " + shape_to_string(g.shape) +
                       ") and " + e.parts[1].gguf_name + " (" +
                       std::string(quant::quant_name(u.type)) + " " + shape_to_string(u.shape) +
                       ") must agree to be fused into " + hf);
      if (e.shape.size() < 2)
        return corrupt(path + ": " + t->names_of(e) + " must be matrices to be fused");
      e.shape[e.shape.size() - 2] *= 2;
    }
  }
  return t;
}

std::string GgufTensors::gguf_names_for(const std::string& hf_name) const {
  // The layer number bounds the table's expansion (only on this error path).
  int layers = 1;
  if (hf_name.rfind("layers.", 0) == 0) layers = std::atoi(hf_name.c_str() + 7) + 1;
  std::string out;
  for (const auto& g : gguf_names_of(architecture_, layers)) {
    if (const auto m = map_gguf_name(architecture_, g); m && m->hf_name == hf_name)
      out += (out.empty() ? "" : " + ") + g;
  }
  return out.empty() ? "the tensor" : out;
}

std::string GgufTensors::names_of(const Entry& e) const {
  std::string out;
  for (const auto& p : e.parts) {
    if (p.gguf_name.empty()) continue;
    out += (out.empty() ? "" : " + ") + p.gguf_name;
  }
  return out;
}

Weight GgufTensors::view_weight(const Entry& e, const std::uint8_t* data) const {
  const QuantType t = e.type();
  if (const auto d = element_dtype(t)) return Weight{*d, e.shape, data};
  Weight w{DType::kU8, e.shape, data};
  w.packed = t;
  return w;
}

Status GgufTensors::check_specs(const std::vector<TensorSpec>& specs) const {
  for (const auto& spec : specs) {
    const auto it = entries_.find(spec.name);
    if (it == entries_.end())
      return not_found("the GGUF file lacks " + gguf_names_for(spec.name) + " (" + spec.name + ")");
    const Entry& e = it->second;
    const QuantType t = e.type();
    const std::string who = names_of(e) + " (" + spec.name + ")";
    if (spec.integer ? (t != QuantType::kI32 && t != QuantType::kI64) : !readable(t))
      return unsupported("tensor " + who + " has type " + std::string(quant::quant_name(t)) +
                         (spec.integer ? ", expected I32 or I64"
                                       : ", expected F32, F16, BF16, Q8_0, Q2_K, Q4_K, Q5_K, "
                                         "Q6_K or IQ2_XXS"));
    bool match = e.shape.size() == spec.shape.size();
    for (std::size_t i = 0; match && i < spec.shape.size(); ++i)
      match = spec.shape[i] < 0 || spec.shape[i] == e.shape[i];
    if (!match)
      return corrupt("tensor " + who + " has shape " + shape_to_string(e.shape) +
                     " (GGUF dims reversed), the config implies " + shape_to_string(spec.shape));
    if (Status s = view_weight(e, e.parts.front().view.bytes.data()).check_storage(); !s.ok())
      return s.with_context("tensor " + who);
  }
  return {};
}

Weight GgufTensors::weight(const std::string& hf_name) const {
  const Entry& e = entries_.at(hf_name);
  if (e.parts.size() == 1) return view_weight(e, e.parts.front().view.bytes.data());
  if (const auto a = assembled_.find(hf_name); a != assembled_.end())
    return view_weight(e, a->second.data());
  return view_weight(e, nullptr);
}

Weight GgufTensors::assemble(const std::string& hf_name) {
  const Entry& e = entries_.at(hf_name);
  if (e.parts.size() == 1 || assembled_.count(hf_name)) return weight(hf_name);
  // [.., I, H] + [.., I, H] -> [.., 2I, H]: per leading index, the first part's rows, then the
  // second's.
  const auto& first = e.parts[0].view;
  const auto& second = e.parts[1].view;
  const auto half = first.bytes.size();
  const auto matrices = first.shape.size() == 3 ? first.shape[0] : 1;
  const auto block = half / static_cast<std::size_t>(matrices);
  auto& out = assembled_[hf_name];
  out.resize(2 * half);
  for (std::int64_t m = 0; m < matrices; ++m) {
    const auto at = static_cast<std::size_t>(m) * block;
    std::memcpy(out.data() + 2 * at, first.bytes.data() + at, block);
    std::memcpy(out.data() + 2 * at + block, second.bytes.data() + at, block);
  }
  return view_weight(e, out.data());
}

std::vector<float> GgufTensors::values(const std::string& hf_name) const {
  const Entry& e = entries_.at(hf_name);
  // Small tensors only, never a fused one (the schema's vectors and mixes are whole).
  const Weight w = view_weight(e, e.parts.front().view.bytes.data());
  const auto cols = static_cast<std::size_t>(w.cols());
  std::vector<float> out(static_cast<std::size_t>(w.numel()));
  for (std::int64_t r = 0; r < w.rows(); ++r) {
    // check_specs validated the storage, so a row always decodes.
    (void)w.dequantize_row(r, {out.data() + static_cast<std::size_t>(r) * cols, cols});
  }
  return out;
}

std::vector<std::int64_t> GgufTensors::ints(const std::string& hf_name) const {
  const auto& v = entries_.at(hf_name).parts.front().view;
  std::vector<std::int64_t> out(static_cast<std::size_t>(shape_numel(v.shape)));
  if (v.type == QuantType::kI64) {
    std::memcpy(out.data(), v.bytes.data(), out.size() * sizeof(std::int64_t));
  } else {
    for (std::size_t i = 0; i < out.size(); ++i) {
      std::int32_t x;
      std::memcpy(&x, v.bytes.data() + i * sizeof x, sizeof x);
      out[i] = x;
    }
  }
  return out;
}

}  // namespace fs
