// The model fingerprint that checkpoints are bound to (checkpoint.h): config.json, the tensor
// index, and the tensor bytes themselves, so that a fine-tune with the same shapes does not
// resume another model's sessions.
//
// Cost: hashing the weights reads every byte of every shard once (xxh3 runs at memory speed; the
// bound is the disk: a cold 300 GB checkpoint at 2 GB/s takes 2.5 minutes). The result is cached
// per shard in `<model>/.flashserve-weights-xxh3`, keyed by the shard's size, inode, mtime and
// ctime (ctime cannot be set back by a user, so a rewritten shard is always re-hashed); a later
// start costs one stat per shard. A read-only model folder gets no cache and is hashed at every
// start. A GGUF model (one file or a split set) is fingerprinted by the config its metadata
// stands for, its tensor index and its files' bytes, cached in the folder the file is in.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/gguf_config.h"
#include "model/gguf_inspect.h"
#include "model/gguf_tensors.h"
#include "session/checkpoint.h"
#include "util/atomic_file.h"
#include "util/hash.h"
#include "util/mapped_file.h"

namespace fs {
namespace {

constexpr const char* kCacheName = ".flashserve-weights-xxh3";

// What identifies a shard's bytes without reading them.
std::string stat_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  std::ostringstream o;
  o << st.st_size << ' ' << st.st_ino << ' ' << st.st_mtim.tv_sec << '.' << st.st_mtim.tv_nsec
    << ' ' << st.st_ctim.tv_sec << '.' << st.st_ctim.tv_nsec;
  return o.str();
}

Expected<std::uint64_t> hash_file(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  const auto bytes = mapped->bytes();
  XXH3_state_t* st = XXH3_createState();
  if (!st) return internal_error("out of memory for the weights hash");
  XXH3_64bits_reset(st);
  constexpr std::size_t kChunk = std::size_t{64} << 20;
  for (std::size_t at = 0; at < bytes.size(); at += kChunk)
    XXH3_64bits_update(st, bytes.data() + at, std::min(kChunk, bytes.size() - at));
  const std::uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

// The hashes of `files` (a checkpoint's shards, a GGUF model's splits), cached in `folder`.
Expected<std::string> files_hash(const std::string& folder, const std::vector<std::string>& files) {
  const std::string cache_path = (std::filesystem::path(folder) / kCacheName).string();
  // Cache lines: "<hash> <file name> <stat key>".
  std::map<std::string, std::pair<std::string, std::string>> cached;
  if (std::ifstream in(cache_path); in) {
    std::string hash, name, rest;
    while (in >> hash >> name && std::getline(in, rest))
      cached[name] = {rest.empty() ? rest : rest.substr(1), hash};
  }
  std::string all;
  std::ostringstream fresh;
  bool changed = false;
  for (const auto& path : files) {
    const std::string name = std::filesystem::path(path).filename().string();
    const std::string key = stat_key(path);
    std::string hash;
    if (const auto it = cached.find(name);
        it != cached.end() && !key.empty() && it->second.first == key)
      hash = it->second.second;
    if (hash.empty()) {
      auto h = hash_file(path);
      if (!h.ok()) return h.status();
      hash = hex64(*h);
      changed = true;
    }
    all += name + ' ' + hash + ';';
    fresh << hash << ' ' << name << ' ' << key << '\n';
  }
  if (changed) {
    // Best effort: a read-only folder is hashed again next time.
    const std::string text = fresh.str();
    const std::span<const std::uint8_t> parts[1] = {
        {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}};
    (void)write_file_atomically(cache_path, parts);
  }
  return hex64(xxh3_64(all));
}

// A GGUF model's fingerprint: the HF config its metadata stands for, its tensor index (names,
// types, shapes) and its files' bytes, its MTP side file's included.
Expected<std::string> gguf_fingerprint(const std::string& path) {
  auto m = GgufModel::open(path);
  if (!m.ok()) return m.status();
  auto config = hf_config_from_gguf(*m);
  if (!config.ok()) return config.status();
  std::string index;
  std::vector<std::string> files;
  // The model and the MTP side file the loader takes with it.
  auto side = gguf_mtp_side_file(path, m->find("general.architecture")->as_string().value_or(""));
  if (!side.ok()) return side.status();
  for (const GgufModel* g : {&*m, side->get()}) {
    if (g == nullptr) continue;
    for (std::size_t i = 0; i < g->split_count(); ++i) files.push_back(g->split(i).path());
    for (const auto& [name, stored] : g->tensors()) {
      index += name + ' ' + std::string(quant::quant_name(stored.info->type)) +
               shape_to_string(stored.info->shape) + ';';
    }
  }
  const auto folder = std::filesystem::path(path).parent_path();
  auto weights = files_hash(folder.empty() ? "." : folder.string(), files);
  if (!weights.ok()) return weights.status();
  return hex64(xxh3_64(*config)) + hex64(xxh3_64(index)) + *weights;
}

}  // namespace

Expected<std::string> weights_hash(const std::string& model_dir) {
  auto ck = Checkpoint::open(model_dir);
  if (!ck.ok()) return ck.status();
  std::vector<std::string> files;
  for (std::size_t i = 0; i < ck->shard_count(); ++i) files.push_back(ck->shard_path(i));
  return files_hash(model_dir, files);
}

Expected<std::string> model_fingerprint(const std::string& model_dir) {
  if (is_gguf_file(model_dir)) return gguf_fingerprint(model_dir);
  auto config = read_text_file((std::filesystem::path(model_dir) / "config.json").string());
  if (!config.ok()) return config.status();
  auto ck = Checkpoint::open(model_dir);
  if (!ck.ok()) return ck.status();
  std::string index;
  for (const auto& [name, stored] : ck->tensors()) {
    index += name;
    index += ' ';
    index += dtype_name(stored.entry->dtype);
    index += shape_to_string(stored.entry->shape);
    index += ';';
  }
  auto weights = weights_hash(model_dir);
  if (!weights.ok()) return weights.status();
  return hex64(xxh3_64(*config)) + hex64(xxh3_64(index)) + *weights;
}

Expected<std::string> state_fingerprint(const std::string& model_dir, const ModelInfo& info) {
  auto fingerprint = model_fingerprint(model_dir);
  if (!fingerprint.ok() || info.numerics == Numerics::kHf) return fingerprint;
  return *fingerprint + "+numerics=" + numerics_name(info.numerics);
}

}  // namespace fs
