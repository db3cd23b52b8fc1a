#include "format/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "format/json_parse.h"

namespace fs {
namespace {

using json = nlohmann::json;

Expected<std::uint64_t> json_u64(const json& v, const std::string& what) {
  if (!v.is_number_integer() || v.is_number_float()) return corrupt(what + " is not an integer");
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  const auto s = v.get<std::int64_t>();
  if (s < 0) return corrupt(what + " is negative (" + std::to_string(s) + ")");
  return static_cast<std::uint64_t>(s);
}

Expected<TensorEntry> parse_entry(const std::string& name, const json& v, std::uint64_t data_size) {
  const std::string where = "tensor '" + name + "'";
  if (!v.is_object()) return corrupt(where + ": entry is not an object");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(field)) return corrupt(where + ": missing field '" + field + "'");
  }
  TensorEntry e;
  e.name = name;
  if (!v["dtype"].is_string()) return corrupt(where + ": dtype is not a string");
  const auto dtype_text = v["dtype"].get<std::string>();
  const auto dtype = dtype_from_name(dtype_text);
  if (!dtype) return unsupported(where + ": unsupported dtype '" + dtype_text + "'");
  e.dtype = *dtype;

  if (!v["shape"].is_array()) return corrupt(where + ": shape is not an array");
  // Elements counted in 128 bits' worth of caution: stop before the byte size can overflow.
  std::uint64_t numel = 1;
  constexpr std::uint64_t kLimit = std::numeric_limits<std::uint64_t>::max() / 16;
  for (const auto& d : v["shape"]) {
    auto dim = json_u64(d, where + ": shape entry");
    if (!dim.ok()) return dim.status();
    if (*dim != 0 && numel > kLimit / *dim) return corrupt(where + ": shape overflows");
    numel *= *dim;
    e.shape.push_back(static_cast<std::int64_t>(*dim));
  }

  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    return corrupt(where + ": data_offsets is not [begin, end]");
  auto begin = json_u64(off[0], where + ": data_offsets[0]");
  if (!begin.ok()) return begin.status();
  auto end = json_u64(off[1], where + ": data_offsets[1]");
  if (!end.ok()) return end.status();
  e.begin = *begin;
  e.end = *end;
  if (e.end < e.begin) {
    return corrupt(where + ": data_offsets end " + std::to_string(e.end) + " before begin " +
                   std::to_string(e.begin));
  }
  if (e.end > data_size) {
    return corrupt(where + ": data_offsets [" + std::to_string(e.begin) + ", " +
                   std::to_string(e.end) + ") out of range: the data section has " +
                   std::to_string(data_size) + " bytes");
  }
  const std::uint64_t expected = numel * dtype_size(e.dtype);
  if (e.end - e.begin != expected) {
    return corrupt(where + ": size mismatch: shape " + shape_to_string(e.shape) + " of " +
                   std::string(dtype_name(e.dtype)) + " needs " + std::to_string(expected) +
                   " bytes but data_offsets span " + std::to_string(e.end - e.begin));
  }
  return e;
}

}  // namespace

Expected<SafetensorsHeader> parse_safetensors_header(std::span<const std::uint8_t> file) {
  if (file.size() < 8) {
    return corrupt("file is " + std::to_string(file.size()) +
                   " bytes, too short for the 8-byte header length");
  }
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | file[static_cast<std::size_t>(i)];
  if (header_len > kMaxSafetensorsHeaderBytes) {
    return corrupt("header length " + std::to_string(header_len) + " exceeds the limit of " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  }
  if (header_len > file.size() - 8) {
    return corrupt("header length " + std::to_string(header_len) + " runs past the end of the " +
                   std::to_string(file.size()) + "-byte file (truncated?)");
  }
  SafetensorsHeader h;
  h.data_start = 8 + header_len;
  const std::uint64_t data_size = file.size() - h.data_start;

  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  // Bounded and exception-free: a number out of range or deep nesting is a refusal too.
  JsonLimits limits;
  limits.max_bytes = kMaxSafetensorsHeaderBytes;
  limits.max_values = std::size_t{1} << 26;
  auto parsed = parse_json_bounded(std::string_view(text, header_len), limits);
  if (!parsed.ok()) return corrupt("header is not valid JSON: " + parsed.status().message());
  json root = std::move(*parsed);
  if (!root.is_object()) return corrupt("header JSON is not an object");

  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return corrupt("__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          return corrupt("__metadata__ value '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto entry = parse_entry(it.key(), it.value(), data_size);
    if (!entry.ok()) return entry.status();
    h.tensors.emplace(it.key(), std::move(entry).value());
  }

  // Tensors must not share bytes: sort by offset and compare neighbours.
  std::vector<const TensorEntry*> by_offset;
  for (const auto& [name, e] : h.tensors) {
    if (e.end > e.begin) by_offset.push_back(&e);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return corrupt("tensors '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                     "' overlap: [" + std::to_string(by_offset[i - 1]->begin) + ", " +
                     std::to_string(by_offset[i - 1]->end) + ") and [" +
                     std::to_string(by_offset[i]->begin) + ", " +
                     std::to_string(by_offset[i]->end) + ")");
    }
  }
  return h;
}

Expected<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  auto header = parse_safetensors_header(mapped->bytes());
  if (!header.ok()) return header.status().with_context(path);
  SafetensorsFile f;
  f.file_ = std::move(mapped).value();
  f.header_ = std::move(header).value();
  return f;
}

std::optional<TensorView> SafetensorsFile::view(const std::string& name) const {
  const auto it = header_.tensors.find(name);
  if (it == header_.tensors.end()) return std::nullopt;
  const TensorEntry& e = it->second;
  return TensorView{e.dtype, e.shape,
                    file_.bytes().subspan(header_.data_start + e.begin, e.end - e.begin)};
}

std::optional<std::string> canonical_tensor_name(const std::string& stored) {
  auto starts = [&](std::string_view p) { return stored.rfind(p, 0) == 0; };
  if (starts("model.visual.") || starts("model.vision_tower.") || starts("visual."))
    return std::nullopt;
  if (starts("model.language_model."))
    return stored.substr(std::string_view("model.language_model.").size());
  if (starts("model.")) return stored.substr(std::string_view("model.").size());
  return stored;
}

Expected<Checkpoint> Checkpoint::open(const std::string& path) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> shard_paths;
  // stored name -> shard file, when an index names it
  std::map<std::string, std::string> weight_map;
  if (stdfs::is_directory(path, ec)) {
    const auto index_path = (stdfs::path(path) / "model.safetensors.index.json").string();
    const auto single_path = (stdfs::path(path) / "model.safetensors").string();
    if (stdfs::exists(index_path, ec)) {
      auto text = read_text_file(index_path);
      if (!text.ok()) return text.status();
      auto parsed = parse_json_bounded(*text);
      if (!parsed.ok()) return corrupt(index_path + ": " + parsed.status().message());
      nlohmann::json index = std::move(*parsed);
      if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
        return corrupt(index_path + ": no 'weight_map' object");
      }
      std::set<std::string> files;
      for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          return corrupt(index_path + ": weight_map['" + it.key() + "'] is not a string");
        const auto file = it.value().get<std::string>();
        if (file.find('/') != std::string::npos || file == "..") {
          return corrupt(index_path + ": shard name '" + file + "' must be a plain file name");
        }
        weight_map[it.key()] = file;
        files.insert(file);
      }
      for (const auto& f : files) {
        const auto p = (stdfs::path(path) / f).string();
        if (!stdfs::exists(p, ec)) {
          return not_found("missing shard " + f + " named by " + index_path);
        }
        shard_paths.push_back(p);
      }
    } else if (stdfs::exists(single_path, ec)) {
      shard_paths.push_back(single_path);
    } else {
      return not_found("no model.safetensors or model.safetensors.index.json in " + path);
    }
  } else if (stdfs::exists(path, ec)) {
    shard_paths.push_back(path);
  } else {
    return not_found("no such model folder or file: " + path);
  }

  Checkpoint ck;
  for (const auto& p : shard_paths) {
    auto f = SafetensorsFile::open(p);
    if (!f.ok()) return f.status();
    ck.shards_.push_back(std::make_unique<SafetensorsFile>(std::move(f).value()));
  }
  for (std::size_t s = 0; s < ck.shards_.size(); ++s) {
    const auto shard_file = stdfs::path(ck.shards_[s]->path()).filename().string();
    for (const auto& [stored, entry] : ck.shards_[s]->tensors()) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(stored);
        if (it == weight_map.end()) {
          return corrupt("tensor '" + stored + "' in " + shard_file + " is not in the index");
        }
        if (it->second != shard_file) {
          return corrupt("tensor '" + stored + "' is in " + shard_file + " but the index names " +
                         it->second);
        }
      }
      const auto canonical = canonical_tensor_name(stored);
      if (!canonical) {
        ++ck.ignored_;
        continue;
      }
      const auto [pos, inserted] = ck.tensors_.emplace(*canonical, Stored{stored, s, &entry});
      if (!inserted) {
        return corrupt("tensor '" + *canonical + "' is stored twice, as '" +
                       pos->second.stored_name + "' and as '" + stored + "'");
      }
    }
  }
  for (const auto& [stored, file] : weight_map) {
    const auto canonical = canonical_tensor_name(stored);
    if (canonical && !ck.tensors_.count(*canonical)) {
      return corrupt("the index names tensor '" + stored + "' in " + file +
                     " but that shard lacks it");
    }
  }
  return ck;
}

std::optional<TensorView> Checkpoint::view(const std::string& canonical_name) const {
  const auto it = tensors_.find(canonical_name);
  if (it == tensors_.end()) return std::nullopt;
  return shards_[it->second.shard]->view(it->second.stored_name);
}

}  // namespace fs
