// GGUF files (ggml's container, version 3; version 2 has the same layout): the metadata
// key/value pairs and the tensor infos, validated whole before any tensor is handed out, and the
// tensors as views into the memory-mapped file. A split model (NAME-00001-of-0000N.gguf with the
// split.* keys) opens as one model.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 key count; the key/value
// pairs (string key, u32 type, value); the tensor infos (string name, u32 n_dims, u64 dims
// inner-first, u32 ggml type, u64 offset into the data section); padding to the alignment
// (general.alignment, default 32); the data section. A string is a u64 length and its bytes; an
// array a u32 element type, a u64 count and the elements.
//
// Every length is checked against the bytes that remain before anything is read or allocated;
// every failure names the key or the tensor and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tensor/quant/quant_type.h"
#include "tensor/tensor_view.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace fs {

enum class GgufType : std::uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

std::string_view gguf_type_name(GgufType t);  // "u32", "string", "array", ...

inline constexpr std::uint32_t kGgufDefaultAlignment = 32;
// Tensor names are bounded by the format (ggml's GGML_MAX_NAME, the terminating zero included).
inline constexpr std::size_t kGgufMaxTensorName = 63;
inline constexpr std::uint32_t kGgufMaxDims = 4;
// Bounds on what one file may ask us to hold (real files: ~1,000 tensors, ~50 keys, a 150k-token
// vocabulary as the largest array).
inline constexpr std::uint64_t kGgufMaxStringBytes = 1u << 30;

// A metadata value: a scalar is an array of one (`is_array` false). Integers keep their sign
// class: unsigned types (and bool) in `uints`, signed in `ints`, floats in `floats`.
struct GgufValue {
  GgufType type = GgufType::kU8;
  GgufType element_type = GgufType::kU8;  // the element type of an array; == type for scalars
  bool is_array = false;
  std::vector<std::uint64_t> uints;
  std::vector<std::int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  std::size_t count() const;
  // A scalar's value; nullopt when the value is an array, of another kind, or out of range.
  std::optional<std::uint64_t> as_uint() const;
  std::optional<std::int64_t> as_int() const;
  std::optional<double> as_float() const;
  std::optional<std::string> as_string() const;
  std::optional<bool> as_bool() const;
  // Any integer array, as signed values (nullopt when not one, or a value exceeds int64).
  std::optional<std::vector<std::int64_t>> as_int_array() const;
  // "u32 4096", "string \"deepseek4\"", "array<i32>[43]": for listings.
  std::string summary() const;
};

struct GgufTensorInfo {
  std::string name;
  quant::QuantType type = quant::QuantType::kF32;
  Shape shape;               // row-major, outer first: GGUF's dims reversed ([rows, cols])
  std::uint64_t offset = 0;  // into the data section
  std::uint64_t bytes = 0;
};

struct GgufHeader {
  std::uint32_t version = 0;
  std::uint32_t alignment = kGgufDefaultAlignment;
  std::uint64_t data_start = 0;  // file offset of the data section
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensorInfo> tensors;       // in file order
  std::map<std::string, std::size_t> index;  // name -> position in `tensors`
};

// Parses and validates a whole GGUF file held in memory. Pure: used by the file reader, the
// tests and the fuzzer.
Expected<GgufHeader> parse_gguf(std::span<const std::uint8_t> file);

struct GgufTensorView {
  quant::QuantType type = quant::QuantType::kF32;
  Shape shape;
  std::span<const std::uint8_t> bytes;
};

class GgufFile {
 public:
  static Expected<GgufFile> open(const std::string& path);
  const GgufHeader& header() const { return header_; }
  const std::string& path() const { return file_.path(); }
  std::optional<GgufTensorView> view(const std::string& name) const;

 private:
  MappedFile file_;
  GgufHeader header_;
};

// A model in one GGUF file or in a split set. Any file of a set opens the whole set: its name
// gives the others (PREFIX-0000k-of-0000N.gguf); each must be present, carry split.no = k-1 and
// split.count = N, and together hold split.tensors.count distinct tensors. Metadata is the first
// file's.
class GgufModel {
 public:
  static Expected<GgufModel> open(const std::string& path);

  struct Stored {
    std::size_t split = 0;
    const GgufTensorInfo* info = nullptr;
  };
  const std::map<std::string, GgufValue>& metadata() const {
    return files_.front()->header().metadata;
  }
  const GgufValue* find(const std::string& key) const;
  const std::map<std::string, Stored>& tensors() const { return tensors_; }
  std::optional<GgufTensorView> view(const std::string& name) const;
  std::size_t split_count() const { return files_.size(); }
  const GgufFile& split(std::size_t i) const { return *files_.at(i); }

 private:
  std::vector<std::unique_ptr<GgufFile>> files_;  // unique_ptr: stable info addresses
  std::map<std::string, Stored> tensors_;
};

// "NAME-00002-of-00005.gguf" -> {prefix "NAME", 2, 5}; nullopt for names of another shape.
struct GgufSplitName {
  std::string prefix;  // with the folder
  int number = 0;      // 1-based
  int count = 0;
};
std::optional<GgufSplitName> parse_gguf_split_name(const std::string& path);
std::string gguf_split_path(const std::string& prefix, int number, int count);

}  // namespace fs
