#include "format/gguf.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

namespace fs {
namespace {

using quant::QuantType;

constexpr std::uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32

// Fixed sizes of the scalar types; 0 for string and array.
std::uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    default:
      return 0;
  }
}

bool known_type(std::uint32_t t) {
  return t <= static_cast<std::uint32_t>(GgufType::kF64);
}

// A cursor over the file: every read checks the bytes that remain first.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> file) : file_(file) {}
  std::uint64_t pos() const { return pos_; }
  std::uint64_t remaining() const { return file_.size() - pos_; }

  Status need(std::uint64_t n, const std::string& what) const {
    if (n > remaining()) {
      return corrupt(what + " needs " + std::to_string(n) + " bytes at offset " +
                     std::to_string(pos_) + " but the file has " + std::to_string(remaining()) +
                     " left (truncated?)");
    }
    return Status::ok_status();
  }
  template <typename T>
  Expected<T> read(const std::string& what) {
    if (auto st = need(sizeof(T), what); !st.ok()) return st;
    T v;
    std::memcpy(&v, file_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  Expected<std::string> read_string(const std::string& what, std::uint64_t max_len) {
    auto len = read<std::uint64_t>(what + " length");
    if (!len.ok()) return len.status();
    if (*len > max_len) {
      return corrupt(what + " length " + std::to_string(*len) + " exceeds the limit of " +
                     std::to_string(max_len));
    }
    if (auto st = need(*len, what + " of length " + std::to_string(*len)); !st.ok()) return st;
    std::string s(reinterpret_cast<const char*>(file_.data() + pos_), *len);
    pos_ += *len;
    return s;
  }

 private:
  std::span<const std::uint8_t> file_;
  std::uint64_t pos_ = 0;
};

// One stored scalar of C, widened into `field`.
template <typename C, typename Field>
Status push(Reader& r, std::vector<Field>& field, const std::string& what) {
  auto x = r.read<C>(what);
  if (!x.ok()) return x.status();
  field.push_back(static_cast<Field>(*x));
  return Status::ok_status();
}

// One scalar of type t appended to v.
Status read_scalar(Reader& r, GgufType t, GgufValue& v, const std::string& what) {
  switch (t) {
    case GgufType::kU8:
      return push<std::uint8_t>(r, v.uints, what);
    case GgufType::kU16:
      return push<std::uint16_t>(r, v.uints, what);
    case GgufType::kU32:
      return push<std::uint32_t>(r, v.uints, what);
    case GgufType::kU64:
      return push<std::uint64_t>(r, v.uints, what);
    case GgufType::kI8:
      return push<std::int8_t>(r, v.ints, what);
    case GgufType::kI16:
      return push<std::int16_t>(r, v.ints, what);
    case GgufType::kI32:
      return push<std::int32_t>(r, v.ints, what);
    case GgufType::kI64:
      return push<std::int64_t>(r, v.ints, what);
    case GgufType::kF32:
      return push<float>(r, v.floats, what);
    case GgufType::kF64:
      return push<double>(r, v.floats, what);
    case GgufType::kBool: {
      auto x = r.read<std::uint8_t>(what);
      if (!x.ok()) return x.status();
      if (*x > 1)
        return corrupt(what + ": bool byte " + std::to_string(*x) + " is neither 0 nor 1");
      v.uints.push_back(*x);
      return Status::ok_status();
    }
    case GgufType::kString: {
      auto s = r.read_string(what, kGgufMaxStringBytes);
      if (!s.ok()) return s.status();
      v.strings.push_back(std::move(s).value());
      return Status::ok_status();
    }
    default:
      return corrupt(what + ": type " + std::string(gguf_type_name(t)) + " is not a scalar");
  }
}

Expected<GgufValue> read_value(Reader& r, const std::string& key) {
  const std::string where = "key '" + key + "'";
  auto type = r.read<std::uint32_t>(where + " type");
  if (!type.ok()) return type.status();
  if (!known_type(*type)) return corrupt(where + ": unknown value type " + std::to_string(*type));
  GgufValue v;
  v.type = static_cast<GgufType>(*type);
  v.element_type = v.type;
  if (v.type != GgufType::kArray) {
    if (auto st = read_scalar(r, v.type, v, where); !st.ok()) return st;
    return v;
  }
  v.is_array = true;
  auto elem = r.read<std::uint32_t>(where + " array element type");
  if (!elem.ok()) return elem.status();
  if (!known_type(*elem))
    return corrupt(where + ": unknown array element type " + std::to_string(*elem));
  v.element_type = static_cast<GgufType>(*elem);
  if (v.element_type == GgufType::kArray)
    return unsupported(where + ": arrays of arrays are not supported");
  auto count = r.read<std::uint64_t>(where + " array length");
  if (!count.ok()) return count.status();
  // Each element takes at least its fixed size (a string at least its 8-byte length): a count
  // the rest of the file cannot hold is refused before anything is allocated.
  const std::uint64_t min_size =
      v.element_type == GgufType::kString ? 8 : scalar_size(v.element_type);
  if (*count > r.remaining() / min_size) {
    return corrupt(where + ": array of " + std::to_string(*count) + " " +
                   std::string(gguf_type_name(v.element_type)) + " elements cannot fit in the " +
                   std::to_string(r.remaining()) + " bytes left");
  }
  const auto n = static_cast<std::size_t>(*count);
  if (v.element_type == GgufType::kString) {
    v.strings.reserve(n);
  } else if (v.element_type == GgufType::kF32 || v.element_type == GgufType::kF64) {
    v.floats.reserve(n);
  } else if (v.element_type == GgufType::kI8 || v.element_type == GgufType::kI16 ||
             v.element_type == GgufType::kI32 || v.element_type == GgufType::kI64) {
    v.ints.reserve(n);
  } else {
    v.uints.reserve(n);
  }
  const std::string element = where + " array element";
  for (std::size_t i = 0; i < n; ++i) {
    if (auto st = read_scalar(r, v.element_type, v, element); !st.ok()) return st;
  }
  return v;
}

std::string dims_text(const std::vector<std::uint64_t>& dims) {
  std::string s = "(";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  s += ")";
  return s;
}

Expected<GgufTensorInfo> read_tensor_info(Reader& r, std::uint64_t i) {
  auto name = r.read_string("tensor " + std::to_string(i) + " name", 1u << 20);
  if (!name.ok()) return name.status();
  const std::string where = "tensor '" + *name + "'";
  if (name->empty()) return corrupt("tensor " + std::to_string(i) + " has an empty name");
  if (name->size() > kGgufMaxTensorName) {
    return corrupt(where + ": name of " + std::to_string(name->size()) +
                   " bytes exceeds the format's " + std::to_string(kGgufMaxTensorName));
  }
  auto n_dims = r.read<std::uint32_t>(where + " dimension count");
  if (!n_dims.ok()) return n_dims.status();
  if (*n_dims > kGgufMaxDims) {
    return corrupt(where + ": " + std::to_string(*n_dims) + " dimensions, at most " +
                   std::to_string(kGgufMaxDims));
  }
  std::vector<std::uint64_t> dims;
  std::uint64_t numel = 1;
  for (std::uint32_t d = 0; d < *n_dims; ++d) {
    auto dim = r.read<std::uint64_t>(where + " dimension " + std::to_string(d));
    if (!dim.ok()) return dim.status();
    dims.push_back(*dim);
  }
  for (const auto d : dims) {
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        (d != 0 &&
         numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / d)) {
      return corrupt(where + ": shape " + dims_text(dims) + " overflows");
    }
    numel *= d;
  }
  auto type_id = r.read<std::uint32_t>(where + " type");
  if (!type_id.ok()) return type_id.status();
  auto offset = r.read<std::uint64_t>(where + " offset");
  if (!offset.ok()) return offset.status();

  GgufTensorInfo t;
  t.name = std::move(name).value();
  const auto type = quant::quant_type_from_ggml(*type_id);
  if (!type) return corrupt(where + ": unknown ggml type " + std::to_string(*type_id));
  t.type = *type;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it)
    t.shape.push_back(static_cast<std::int64_t>(*it));
  t.offset = *offset;
  const std::int64_t row = dims.empty() ? 1 : static_cast<std::int64_t>(dims[0]);
  auto per_row = quant::row_bytes(t.type, row);
  if (!per_row.ok()) {
    return corrupt(where + ": shape " + dims_text(dims) + " does not fit type " +
                   std::string(quant::quant_name(t.type)) + ": " + per_row.status().message());
  }
  const std::uint64_t rows = row == 0 ? 0 : numel / static_cast<std::uint64_t>(row);
  if (rows != 0 && *per_row > std::numeric_limits<std::uint64_t>::max() / rows)
    return corrupt(where + ": byte size of shape " + dims_text(dims) + " overflows");
  t.bytes = *per_row * rows;
  return t;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "?";
}

std::size_t GgufValue::count() const {
  return uints.size() + ints.size() + floats.size() + strings.size();
}

std::optional<std::uint64_t> GgufValue::as_uint() const {
  if (is_array || type == GgufType::kBool) return std::nullopt;
  if (uints.size() == 1) return uints[0];
  if (ints.size() == 1 && ints[0] >= 0) return static_cast<std::uint64_t>(ints[0]);
  return std::nullopt;
}

std::optional<std::int64_t> GgufValue::as_int() const {
  if (is_array || type == GgufType::kBool) return std::nullopt;
  if (ints.size() == 1) return ints[0];
  if (uints.size() == 1 &&
      uints[0] <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    return static_cast<std::int64_t>(uints[0]);
  return std::nullopt;
}

std::optional<double> GgufValue::as_float() const {
  if (is_array || floats.size() != 1) return std::nullopt;
  return floats[0];
}

std::optional<std::string> GgufValue::as_string() const {
  if (is_array || strings.size() != 1) return std::nullopt;
  return strings[0];
}

std::optional<bool> GgufValue::as_bool() const {
  if (is_array || type != GgufType::kBool) return std::nullopt;
  return uints.at(0) != 0;
}

std::optional<std::vector<std::int64_t>> GgufValue::as_int_array() const {
  if (!is_array || !floats.empty() || !strings.empty() || element_type == GgufType::kBool)
    return std::nullopt;
  if (!ints.empty()) return ints;
  std::vector<std::int64_t> out;
  for (const auto u : uints) {
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      return std::nullopt;
    out.push_back(static_cast<std::int64_t>(u));
  }
  return out;
}

std::string GgufValue::summary() const {
  if (is_array) {
    return "array<" + std::string(gguf_type_name(element_type)) + ">[" + std::to_string(count()) +
           "]";
  }
  std::string s = std::string(gguf_type_name(type)) + " ";
  if (type == GgufType::kBool) return s + (uints.at(0) ? "true" : "false");
  if (!strings.empty())
    return s + "\"" + strings[0].substr(0, 80) + (strings[0].size() > 80 ? "..." : "") + "\"";
  if (!uints.empty()) return s + std::to_string(uints[0]);
  if (!ints.empty()) return s + std::to_string(ints[0]);
  if (!floats.empty()) return s + std::to_string(floats[0]);
  return s;
}

Expected<GgufHeader> parse_gguf(std::span<const std::uint8_t> file) {
  Reader r(file);
  GgufHeader h;
  auto magic = r.read<std::uint32_t>("the magic");
  if (!magic.ok()) return magic.status();
  if (*magic != kMagic) {
    std::string shown;
    for (int i = 0; i < 4; ++i) {
      const char c = static_cast<char>((*magic >> (8 * i)) & 0xff);
      shown += (c >= 32 && c < 127) ? c : '?';
    }
    return corrupt("bad magic '" + shown + "', not a GGUF file");
  }
  auto version = r.read<std::uint32_t>("the version");
  if (!version.ok()) return version.status();
  if (*version != 2 && *version != 3) {
    return unsupported("GGUF version " + std::to_string(*version) + " (this reader knows 2 and 3)");
  }
  h.version = *version;
  auto n_tensors = r.read<std::uint64_t>("the tensor count");
  if (!n_tensors.ok()) return n_tensors.status();
  auto n_kv = r.read<std::uint64_t>("the key count");
  if (!n_kv.ok()) return n_kv.status();
  // A key/value pair takes at least 13 bytes (8-byte length, 4-byte type, 1-byte value) and a
  // tensor info 24 (8-byte name length, 4 n_dims, 4 type, 8 offset).
  if (*n_kv > r.remaining() / 13) {
    return corrupt(std::to_string(*n_kv) + " keys cannot fit in the " +
                   std::to_string(r.remaining()) + " bytes left (truncated?)");
  }
  if (*n_tensors > r.remaining() / 24) {
    return corrupt(std::to_string(*n_tensors) + " tensor infos cannot fit in the " +
                   std::to_string(r.remaining()) + " bytes left (truncated?)");
  }

  for (std::uint64_t i = 0; i < *n_kv; ++i) {
    auto key = r.read_string("key " + std::to_string(i), 1u << 16);
    if (!key.ok()) return key.status();
    if (key->empty()) return corrupt("key " + std::to_string(i) + " is empty");
    auto value = read_value(r, *key);
    if (!value.ok()) return value.status();
    if (!h.metadata.emplace(*key, std::move(value).value()).second)
      return corrupt("key '" + *key + "' appears twice");
  }
  if (const auto it = h.metadata.find("general.alignment"); it != h.metadata.end()) {
    const GgufValue& a = it->second;
    if (a.is_array || a.type != GgufType::kU32)
      return corrupt("key 'general.alignment' must be a u32, is " + a.summary());
    const std::uint64_t v = a.uints.at(0);
    if (v == 0 || (v & (v - 1)) != 0)
      return corrupt("key 'general.alignment' = " + std::to_string(v) + " is not a power of two");
    h.alignment = static_cast<std::uint32_t>(v);
  }

  h.tensors.reserve(static_cast<std::size_t>(*n_tensors));
  for (std::uint64_t i = 0; i < *n_tensors; ++i) {
    auto t = read_tensor_info(r, i);
    if (!t.ok()) return t.status();
    if (!h.index.emplace(t->name, h.tensors.size()).second)
      return corrupt("tensor '" + t->name + "' appears twice");
    h.tensors.push_back(std::move(t).value());
  }

  const std::uint64_t end_of_infos = r.pos();
  h.data_start = (end_of_infos + h.alignment - 1) / h.alignment * h.alignment;
  if (h.data_start > file.size() && !h.tensors.empty()) {
    // Even an empty tensor's view starts at the data section, so the section must exist.
    return corrupt("the data section would start at byte " + std::to_string(h.data_start) +
                   ", past the end of the " + std::to_string(file.size()) +
                   "-byte file (truncated?)");
  }
  const std::uint64_t data_size = h.data_start <= file.size() ? file.size() - h.data_start : 0;
  for (const auto& t : h.tensors) {
    const std::string where = "tensor '" + t.name + "'";
    if (t.offset % h.alignment != 0) {
      return corrupt(where + ": offset " + std::to_string(t.offset) +
                     " is not a multiple of the alignment " + std::to_string(h.alignment));
    }
    if (t.offset > data_size || t.bytes > data_size - t.offset) {
      return corrupt(where + ": bytes [" + std::to_string(t.offset) + ", " +
                     std::to_string(t.offset + t.bytes) +
                     ") of the data section run past its end (" + std::to_string(data_size) +
                     " bytes; truncated?)");
    }
  }
  // Tensors must not share bytes: sort by offset and compare neighbours.
  std::vector<const GgufTensorInfo*> by_offset;
  for (const auto& t : h.tensors) {
    if (t.bytes > 0) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const auto* a = by_offset[i - 1];
    const auto* b = by_offset[i];
    if (b->offset < a->offset + a->bytes) {
      return corrupt("tensors '" + a->name + "' and '" + b->name + "' overlap: [" +
                     std::to_string(a->offset) + ", " + std::to_string(a->offset + a->bytes) +
                     ") and [" + std::to_string(b->offset) + ", " +
                     std::to_string(b->offset + b->bytes) + ")");
    }
  }
  return h;
}

Expected<GgufFile> GgufFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  auto header = parse_gguf(mapped->bytes());
  if (!header.ok()) return header.status().with_context(path);
  GgufFile f;
  f.file_ = std::move(mapped).value();
  f.header_ = std::move(header).value();
  return f;
}

std::optional<GgufTensorView> GgufFile::view(const std::string& name) const {
  const auto it = header_.index.find(name);
  if (it == header_.index.end()) return std::nullopt;
  const GgufTensorInfo& t = header_.tensors[it->second];
  return GgufTensorView{t.type, t.shape,
                        file_.bytes().subspan(header_.data_start + t.offset, t.bytes)};
}

std::optional<GgufSplitName> parse_gguf_split_name(const std::string& path) {
  // PREFIX-NNNNN-of-NNNNN.gguf: 5 digits each, as llama.cpp's gguf-split writes them.
  constexpr std::string_view kSuffix = ".gguf";
  constexpr std::size_t kTail = 1 + 5 + 4 + 5;  // "-00001-of-00003"
  if (path.size() < kTail + kSuffix.size() + 1) return std::nullopt;
  if (path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) return std::nullopt;
  const std::string tail = path.substr(path.size() - kSuffix.size() - kTail, kTail);
  auto digits = [&](std::size_t at) {
    int v = 0;
    for (std::size_t i = at; i < at + 5; ++i) {
      if (tail[i] < '0' || tail[i] > '9') return -1;
      v = v * 10 + (tail[i] - '0');
    }
    return v;
  };
  if (tail[0] != '-' || tail.compare(6, 4, "-of-") != 0) return std::nullopt;
  const int number = digits(1);
  const int count = digits(10);
  if (number < 1 || count < 1 || number > count) return std::nullopt;
  return GgufSplitName{path.substr(0, path.size() - kSuffix.size() - kTail), number, count};
}

std::string gguf_split_path(const std::string& prefix, int number, int count) {
  char tail[32];
  std::snprintf(tail, sizeof tail, "-%05d-of-%05d.gguf", number, count);
  return prefix + tail;
}

const GgufValue* GgufModel::find(const std::string& key) const {
  const auto& m = metadata();
  const auto it = m.find(key);
  return it == m.end() ? nullptr : &it->second;
}

std::optional<GgufTensorView> GgufModel::view(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return std::nullopt;
  return files_[it->second.split]->view(name);
}

Expected<GgufModel> GgufModel::open(const std::string& path) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  if (!stdfs::exists(path, ec)) return not_found("no such GGUF file: " + path);
  std::vector<std::string> paths;
  const auto split = parse_gguf_split_name(path);
  if (split) {
    for (int k = 1; k <= split->count; ++k) {
      const auto p = gguf_split_path(split->prefix, k, split->count);
      if (!stdfs::exists(p, ec)) {
        return not_found("missing split " + std::to_string(k) + " of " +
                         std::to_string(split->count) + ": " + p);
      }
      paths.push_back(p);
    }
  } else {
    paths.push_back(path);
  }

  GgufModel m;
  for (const auto& p : paths) {
    auto f = GgufFile::open(p);
    if (!f.ok()) return f.status();
    m.files_.push_back(std::make_unique<GgufFile>(std::move(f).value()));
  }
  auto key_of = [](const GgufFile& f, const char* key) -> std::optional<std::uint64_t> {
    const auto it = f.header().metadata.find(key);
    if (it == f.header().metadata.end()) return std::nullopt;
    return it->second.as_uint();
  };
  const auto first_count = key_of(*m.files_[0], "split.count");
  if (split || (first_count && *first_count > 1)) {
    const auto n = static_cast<std::uint64_t>(m.files_.size());
    if (!split) {
      return not_found(path + " is split " + std::to_string(*first_count) +
                       " ways (split.count) but its name does not say where the other parts are");
    }
    for (std::size_t k = 0; k < m.files_.size(); ++k) {
      const auto& f = *m.files_[k];
      const auto no = key_of(f, "split.no");
      const auto count = key_of(f, "split.count");
      if (!no || !count)
        return corrupt(f.path() + ": a split file without split.no and split.count");
      if (*no != k) {
        return corrupt(f.path() + ": split.no is " + std::to_string(*no) +
                       " but the name says part " + std::to_string(k + 1) +
                       " (split.no counts from 0)");
      }
      if (*count != n) {
        return corrupt(f.path() + ": split.count is " + std::to_string(*count) +
                       " but the name says " + std::to_string(n));
      }
    }
  }
  for (std::size_t s = 0; s < m.files_.size(); ++s) {
    for (const auto& t : m.files_[s]->header().tensors) {
      const auto [pos, inserted] = m.tensors_.emplace(t.name, Stored{s, &t});
      if (!inserted) {
        return corrupt("tensor '" + t.name + "' is in " + m.files_[pos->second.split]->path() +
                       " and in " + m.files_[s]->path());
      }
    }
  }
  if (const auto total = key_of(*m.files_[0], "split.tensors.count"); total && split) {
    if (*total != m.tensors_.size()) {
      return corrupt(m.files_[0]->path() + ": split.tensors.count is " + std::to_string(*total) +
                     " but the " + std::to_string(m.files_.size()) + " files hold " +
                     std::to_string(m.tensors_.size()) + " tensors");
    }
  }
  return m;
}

}  // namespace fs
