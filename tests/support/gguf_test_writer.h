// A GGUF writer for tests: builds files by hand, valid or deliberately broken (any field can be
// overridden), so the reader's every check can be reached.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace fs::test {

class GgufBuilder {
 public:
  GgufBuilder& version(std::uint32_t v) {
    version_ = v;
    return *this;
  }
  GgufBuilder& alignment(std::uint32_t a) {
    alignment_ = a;
    return *this;
  }
  // A key with its type id and the value's bytes as the file holds them.
  GgufBuilder& raw_kv(const std::string& key, std::uint32_t type, std::vector<std::uint8_t> value) {
    kv_.push_back({key, type, std::move(value)});
    return *this;
  }
  GgufBuilder& kv_u32(const std::string& key, std::uint32_t v) { return raw_kv(key, 4, le(v)); }
  GgufBuilder& kv_u16(const std::string& key, std::uint16_t v) { return raw_kv(key, 2, le(v)); }
  GgufBuilder& kv_i32(const std::string& key, std::int32_t v) { return raw_kv(key, 5, le(v)); }
  GgufBuilder& kv_f32(const std::string& key, float v) { return raw_kv(key, 6, le(v)); }
  GgufBuilder& kv_bool(const std::string& key, bool v) {
    return raw_kv(key, 7, {static_cast<std::uint8_t>(v)});
  }
  GgufBuilder& kv_string(const std::string& key, const std::string& v) {
    return raw_kv(key, 8, str(v));
  }
  GgufBuilder& kv_i32_array(const std::string& key, const std::vector<std::int32_t>& v) {
    auto b = le(std::uint32_t{5});
    append(b, le(static_cast<std::uint64_t>(v.size())));
    for (auto x : v) append(b, le(x));
    return raw_kv(key, 9, b);
  }
  GgufBuilder& kv_string_array(const std::string& key, const std::vector<std::string>& v) {
    auto b = le(std::uint32_t{8});
    append(b, le(static_cast<std::uint64_t>(v.size())));
    for (const auto& s : v) append(b, str(s));
    return raw_kv(key, 9, b);
  }

  struct Tensor {
    std::string name;
    std::uint32_t ggml_type = 0;
    std::vector<std::uint64_t> dims;  // inner first, as GGUF stores them
    std::vector<std::uint8_t> data;
    std::optional<std::uint64_t> offset;  // default: the next aligned offset
  };
  GgufBuilder& tensor(Tensor t) {
    tensors_.push_back(std::move(t));
    return *this;
  }
  // An F32 tensor of the given dims filled with 0, 1, 2, ...
  GgufBuilder& f32_tensor(const std::string& name, std::vector<std::uint64_t> dims) {
    std::uint64_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<std::uint8_t> data;
    for (std::uint64_t i = 0; i < n; ++i) append(data, le(static_cast<float>(i)));
    return tensor({name, 0, std::move(dims), std::move(data), std::nullopt});
  }

  std::vector<std::uint8_t> build() const {
    std::vector<std::uint8_t> out = {'G', 'G', 'U', 'F'};
    append(out, le(version_));
    append(out, le(static_cast<std::uint64_t>(tensors_.size())));
    append(out, le(static_cast<std::uint64_t>(kv_.size())));
    for (const auto& kv : kv_) {
      append(out, str(kv.key));
      append(out, le(kv.type));
      append(out, kv.value);
    }
    std::vector<std::uint64_t> offsets;
    std::uint64_t next = 0;
    for (const auto& t : tensors_) {
      const std::uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = align(std::max(next, off + t.data.size()));
      append(out, str(t.name));
      append(out, le(static_cast<std::uint32_t>(t.dims.size())));
      for (auto d : t.dims) append(out, le(d));
      append(out, le(t.ggml_type));
      append(out, le(off));
    }
    out.resize(align(out.size()), 0);
    const std::size_t data_start = out.size();
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      const std::size_t at = data_start + offsets[i];
      if (out.size() < at + t.data.size()) out.resize(at + t.data.size(), 0);
      if (!t.data.empty()) std::memcpy(out.data() + at, t.data.data(), t.data.size());
    }
    return out;
  }

  template <typename T>
  static std::vector<std::uint8_t> le(T v) {
    std::vector<std::uint8_t> b(sizeof v);
    std::memcpy(b.data(), &v, sizeof v);
    return b;
  }
  static std::vector<std::uint8_t> str(const std::string& s) {
    auto b = le(static_cast<std::uint64_t>(s.size()));
    // resize + memcpy: GCC 12 warns falsely (-Warray-bounds) on inserting a string's range here.
    b.resize(8 + s.size());
    if (!s.empty()) std::memcpy(b.data() + 8, s.data(), s.size());
    return b;
  }
  static void append(std::vector<std::uint8_t>& to, const std::vector<std::uint8_t>& b) {
    to.insert(to.end(), b.begin(), b.end());
  }

 private:
  std::uint64_t align(std::uint64_t x) const {
    return (x + alignment_ - 1) / alignment_ * alignment_;
  }

  struct Kv {
    std::string key;
    std::uint32_t type;
    std::vector<std::uint8_t> value;
  };
  std::uint32_t version_ = 3;
  std::uint32_t alignment_ =
      32;  // the writer's padding; say general.alignment to change the reader's
  std::vector<Kv> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace fs::test
