// safetensors checkpoints: one file, or shards named by model.safetensors.index.json. Files are
// memory-mapped; every header is validated before any tensor is handed out, and a bad header is
// an error that names the file, the tensor and the problem.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor_view.h"
#include "util/mapped_file.h"
#include "util/status.h"

namespace fs {

// Bound on the JSON header. The format's own reference implementation uses 100 MB; real
// checkpoints need well under 1 MB per shard.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::uint64_t begin = 0;  // byte offsets relative to the start of the data section
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::uint64_t data_start = 0;  // 8 + header length
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses and validates the header of a whole safetensors file held in memory. Pure: used by the
// file reader, the tests and the fuzzer.
Expected<SafetensorsHeader> parse_safetensors_header(std::span<const std::uint8_t> file);

class SafetensorsFile {
 public:
  static Expected<SafetensorsFile> open(const std::string& path);

  const std::map<std::string, TensorEntry>& tensors() const { return header_.tensors; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  const std::string& path() const { return file_.path(); }
  // nullopt when the file holds no tensor of that name.
  std::optional<TensorView> view(const std::string& name) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// A model folder's tensors, from model.safetensors or from the shards an index names.
//
// Names are kept as written, and each also gets a canonical name: the text model's tensors lose
// the `model.` or `model.language_model.` prefix (`layers.0.mlp.gate.weight`), `lm_head.*` and
// `mtp.*` are kept as they are, and the vision tower (`model.visual.*`) is ignored.
class Checkpoint {
 public:
  // `path` is a model folder or a single .safetensors file.
  static Expected<Checkpoint> open(const std::string& path);

  struct Stored {
    std::string stored_name;  // the name as written in the file
    std::size_t shard = 0;
    const TensorEntry* entry = nullptr;
  };

  // Canonical name -> where it is stored.
  const std::map<std::string, Stored>& tensors() const { return tensors_; }
  std::optional<TensorView> view(const std::string& canonical_name) const;
  bool contains(const std::string& canonical_name) const { return tensors_.count(canonical_name); }
  std::size_t shard_count() const { return shards_.size(); }
  const std::string& shard_path(std::size_t i) const { return shards_.at(i)->path(); }
  std::size_t ignored_count() const { return ignored_; }

 private:
  // unique_ptr keeps TensorEntry addresses stable when the vector grows.
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, Stored> tensors_;
  std::size_t ignored_ = 0;
};

// The canonical name of a stored tensor name, or nullopt for tensors that are not the text model's
// (the vision tower).
std::optional<std::string> canonical_tensor_name(const std::string& stored_name);

}  // namespace fs
