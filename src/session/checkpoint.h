// The session checkpoint file (DESIGN principle 6): a decode state with the token key it covers,
// never trusted blindly.
//
// Layout (little-endian):
//   [0, 40)   prefix: magic[8] (per family), format_version u32 (the family's own),
//             policy_version u32 (the engine's decode policy), header_len u64,
//             header_xxh3 u64, reserved u64 (0)
//   [40, 40 + header_len)   header JSON: family, fingerprint of the model, key (token ids),
//             caches (group, index, kind, covered tokens), tensors (name, shape, offset, bytes,
//             xxh3) with offsets relative to the payload, payload_bytes
//   [payload_offset, ...)   float32 tensors, 64-byte aligned, payload_offset = align64(40 +
//   header_len)
//
// Loading validates, in order and before any state tensor is allocated: size, magic, versions,
// header checksum, header schema, table bounds (inside the payload, bytes == shape x 4, no
// overlap, file size exact), the model fingerprint, the key against every cache's coverage, the
// table against the model's own caches, and every tensor checksum.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "decode/decode_state.h"
#include "model/family.h"

namespace fs {

// Bumped whenever a decode-policy change makes older saved states unsafe to resume.
inline constexpr std::uint32_t kEnginePolicyVersion = 1;
inline constexpr std::size_t kCheckpointPrefixBytes = 40;
inline constexpr std::uint64_t kMaxCheckpointHeaderBytes = 256u << 20;

std::array<char, 8> checkpoint_magic(Family family);
std::uint32_t checkpoint_format_version(Family family);

// Who may load a checkpoint: the family's format and policy, and exactly this model.
struct CheckpointIdentity {
  Family family = Family::kQwenNext;
  std::string model_fingerprint;
  std::uint32_t format_version = 0;  // 0: the family's current version
  std::uint32_t policy_version = kEnginePolicyVersion;
};

struct CheckpointCache {
  std::string group;  // "trunk" or "mtp"
  std::size_t index = 0;
  std::string kind;
  std::int64_t covered = 0;
};

struct CheckpointTensor {
  std::string name;  // "trunk/<state tensor>", "mtp/<state tensor>", "next_logits", "last_hidden"
  Shape shape;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
};

struct CheckpointHeader {
  Family family = Family::kQwenNext;
  std::uint32_t format_version = 0;
  std::uint32_t policy_version = 0;
  std::string model_fingerprint;
  std::vector<TokenId> key;
  std::vector<CheckpointCache> caches;
  std::vector<CheckpointTensor> tensors;
  std::uint64_t payload_offset = 0;
  std::uint64_t payload_bytes = 0;

  nlohmann::json to_json() const;
};

// The encoded file: prefix + header + padding, and the payload. save_checkpoint writes both.
struct EncodedCheckpoint {
  CheckpointHeader header;
  std::vector<std::uint8_t> head;  // prefix, header JSON, padding
  std::vector<std::uint8_t> payload;
};

// Refuses a state whose invariant does not hold: an incomplete state is never persisted.
Expected<EncodedCheckpoint> encode_checkpoint(const DecodeState& state,
                                              const CheckpointIdentity& id);
// Prefix + header bytes for `header` (payload_offset and payload_bytes are filled in).
std::vector<std::uint8_t> encode_checkpoint_head(CheckpointHeader& header);
Status save_checkpoint(const std::string& path, const DecodeState& state,
                       const CheckpointIdentity& id);

// Header and table checks that need no model (state inspect).
Expected<CheckpointHeader> parse_checkpoint(std::span<const std::uint8_t> file);
struct LoadedCheckpoint {
  CheckpointHeader header;
  DecodeState state;
};
// Every check above; on refusal `rejection_reason` gets a short stable word for metrics:
// io, truncated, magic, version, policy, header_checksum, header, table, fingerprint,
// key_coverage, tensor_checksum, shape.
Expected<LoadedCheckpoint> load_checkpoint(const std::string& path, Model& model,
                                           const CheckpointIdentity& id,
                                           std::string* rejection_reason = nullptr);

// Fingerprint of a model folder's identity: config.json text, the checkpoint's tensor index
// (names, dtypes, shapes) and the weights' bytes (weights_hash). Two folders with equal
// fingerprints load each other's checkpoints.
Expected<std::string> model_fingerprint(const std::string& model_dir);
// The fingerprint a saved state of `info`'s model is bound to (what the engine, `generate
// --save-state` and every checkpoint identity use): model_fingerprint(model_dir), followed by
// the numerics when they are not HF's, so that a state computed under one arithmetic is never
// resumed under the other. HF's is the plain fingerprint (earlier checkpoints stay valid).
Expected<std::string> state_fingerprint(const std::string& model_dir, const ModelInfo& info);
// xxh3 of every shard's bytes, cached beside the model keyed by each shard's stat (see
// fingerprint.cpp for the cost).
Expected<std::string> weights_hash(const std::string& model_dir);

}  // namespace fs
