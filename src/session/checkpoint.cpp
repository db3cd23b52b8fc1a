#include "session/checkpoint.h"

#include "model/family_table.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "format/json_parse.h"
#include "format/safetensors.h"
#include "util/atomic_file.h"
#include "util/hash.h"
#include "util/mapped_file.h"

namespace fs {
namespace {

using json = nlohmann::json;

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
std::uint64_t get_u64(std::span<const std::uint8_t> b, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | b[at + static_cast<std::size_t>(i)];
  return v;
}
std::uint32_t get_u32(std::span<const std::uint8_t> b, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | b[at + static_cast<std::size_t>(i)];
  return v;
}
std::uint64_t align64(std::uint64_t v) {
  return (v + 63) / 64 * 64;
}

std::span<const std::uint8_t> float_bytes(std::span<const float> v) {
  return {reinterpret_cast<const std::uint8_t*>(v.data()), v.size() * sizeof(float)};
}

// A failure with the metrics word that classifies it.
struct Rejection {
  std::string reason;
  Status status;
};

}  // namespace

std::array<char, 8> checkpoint_magic(Family family) {
  return family_entry(family).checkpoint_magic;
}

std::uint32_t checkpoint_format_version(Family family) {
  return family_entry(family).checkpoint_version;
}

json CheckpointHeader::to_json() const {
  json j;
  j["family"] = family_name(family);
  j["format_version"] = format_version;
  j["policy_version"] = policy_version;
  j["model_fingerprint"] = model_fingerprint;
  j["key"] = key;
  j["key_length"] = key.size();
  auto caches_j = json::array();
  for (const auto& c : caches)
    caches_j.push_back(
        {{"group", c.group}, {"index", c.index}, {"kind", c.kind}, {"covered", c.covered}});
  j["caches"] = caches_j;
  auto tensors_j = json::array();
  for (const auto& t : tensors) {
    tensors_j.push_back({{"name", t.name},
                         {"shape", t.shape},
                         {"offset", t.offset},
                         {"bytes", t.bytes},
                         {"xxh3", hex64(t.xxh3)}});
  }
  j["tensors"] = tensors_j;
  j["payload_offset"] = payload_offset;
  j["payload_bytes"] = payload_bytes;
  return j;
}

std::vector<std::uint8_t> encode_checkpoint_head(CheckpointHeader& h) {
  // payload_offset depends on the header's length, which depends on payload_offset's digits:
  // iterate to the fixed point (two rounds at most in practice).
  std::string text;
  for (int i = 0; i < 4; ++i) {
    text = h.to_json().dump();
    const std::uint64_t offset = align64(kCheckpointPrefixBytes + text.size());
    if (offset == h.payload_offset) break;
    h.payload_offset = offset;
  }
  text = h.to_json().dump();
  std::vector<std::uint8_t> prefix;
  put_u32(prefix, h.format_version);
  put_u32(prefix, h.policy_version);
  put_u64(prefix, text.size());
  put_u64(prefix, xxh3_64(text));
  put_u64(prefix, 0);
  std::vector<std::uint8_t> out(h.payload_offset, 0);
  const auto magic = checkpoint_magic(h.family);
  std::memcpy(out.data(), magic.data(), magic.size());
  std::memcpy(out.data() + magic.size(), prefix.data(), prefix.size());
  std::memcpy(out.data() + kCheckpointPrefixBytes, text.data(), text.size());
  return out;
}

Expected<EncodedCheckpoint> encode_checkpoint(const DecodeState& state,
                                              const CheckpointIdentity& id) {
  if (auto s = state.check_invariant(); !s.ok())
    return s.with_context("refusing to save an incomplete state");
  EncodedCheckpoint e;
  CheckpointHeader& h = e.header;
  h.family = id.family;
  h.format_version = id.format_version ? id.format_version : checkpoint_format_version(id.family);
  h.policy_version = id.policy_version;
  h.model_fingerprint = id.model_fingerprint;
  h.key = state.tokens;
  auto add = [&](const std::string& name, const Shape& shape, std::span<const float> data) {
    CheckpointTensor t;
    t.name = name;
    t.shape = shape;
    t.offset = e.payload.size();
    const auto bytes = float_bytes(data);
    t.bytes = bytes.size();
    t.xxh3 = xxh3_64(bytes);
    e.payload.insert(e.payload.end(), bytes.begin(), bytes.end());
    e.payload.resize(align64(e.payload.size()), 0);
    h.tensors.push_back(std::move(t));
  };
  auto add_state = [&](const std::string& group, const ModelState& ms) {
    for (std::size_t i = 0; i < ms.cache_count(); ++i) {
      h.caches.push_back({group, i, ms.cache(i).kind(), ms.cache(i).covered_tokens()});
    }
    // Device-neutral: every tensor is copied to the host as f32, whichever backend holds it.
    for (const auto& t : ms.tensors())
      add(group + "/" + t.name, t.tensor->shape(), t.tensor->to_host_vector());
  };
  add_state("trunk", *state.trunk);
  if (state.mtp_history) add_state("mtp", *state.mtp_history);
  const auto next_logits = state.host_logits();  // greedy decoding may have left them on the GPU
  add("next_logits", {static_cast<std::int64_t>(next_logits.size())}, next_logits);
  add("last_hidden", {static_cast<std::int64_t>(state.last_hidden.size())}, state.last_hidden);
  h.payload_bytes = e.payload.size();
  e.head = encode_checkpoint_head(h);
  return e;
}

Status save_checkpoint(const std::string& path, const DecodeState& state,
                       const CheckpointIdentity& id) {
  auto e = encode_checkpoint(state, id);
  if (!e.ok()) return e.status();
  const std::span<const std::uint8_t> parts[2] = {e->head, e->payload};
  return write_file_atomically(path, parts);
}

namespace {

Expected<CheckpointHeader> parse_checkpoint_impl(std::span<const std::uint8_t> file,
                                                 std::string& reason) {
  reason = "truncated";
  if (file.size() < kCheckpointPrefixBytes) {
    return corrupt("file is " + std::to_string(file.size()) + " bytes, shorter than the " +
                   std::to_string(kCheckpointPrefixBytes) + "-byte prefix");
  }
  CheckpointHeader h;
  reason = "magic";
  bool known = false;
  for (const auto& e : family_table()) {
    if (std::memcmp(file.data(), e.checkpoint_magic.data(), e.checkpoint_magic.size()) == 0) {
      h.family = e.family;
      known = true;
    }
  }
  if (!known) return corrupt("not a flashserve checkpoint (bad magic)");
  h.format_version = get_u32(file, 8);
  h.policy_version = get_u32(file, 12);
  const std::uint64_t header_len = get_u64(file, 16);
  const std::uint64_t header_sum = get_u64(file, 24);
  reason = "version";
  if (h.format_version != checkpoint_format_version(h.family)) {
    return unsupported("format version " + std::to_string(h.format_version) + " of " +
                       family_name(h.family) + " checkpoints; this build reads version " +
                       std::to_string(checkpoint_format_version(h.family)));
  }
  reason = "policy";
  if (h.policy_version != kEnginePolicyVersion) {
    return unsupported("engine policy version " + std::to_string(h.policy_version) +
                       "; this build is at " + std::to_string(kEnginePolicyVersion));
  }
  reason = "truncated";
  if (header_len > kMaxCheckpointHeaderBytes || header_len > file.size() - kCheckpointPrefixBytes) {
    return corrupt("header length " + std::to_string(header_len) + " runs past the end of the " +
                   std::to_string(file.size()) + "-byte file");
  }
  const auto text = file.subspan(kCheckpointPrefixBytes, header_len);
  reason = "header_checksum";
  if (xxh3_64(text) != header_sum) return corrupt("header checksum mismatch");
  reason = "header";
  JsonLimits limits;
  limits.max_bytes = kMaxCheckpointHeaderBytes;
  limits.max_values = std::size_t{1} << 28;
  auto parsed = parse_json_bounded(
      std::string_view(reinterpret_cast<const char*>(text.data()), text.size()), limits);
  if (!parsed.ok()) return corrupt("header: " + parsed.status().message());
  const json& j = *parsed;
  try {
    h.model_fingerprint = j.at("model_fingerprint").get<std::string>();
    if (j.at("family").get<std::string>() != family_name(h.family))
      return corrupt("header family disagrees with the magic");
    h.key = j.at("key").get<std::vector<TokenId>>();
    for (const auto& c : j.at("caches")) {
      h.caches.push_back({c.at("group").get<std::string>(), c.at("index").get<std::size_t>(),
                          c.at("kind").get<std::string>(), c.at("covered").get<std::int64_t>()});
    }
    for (const auto& t : j.at("tensors")) {
      CheckpointTensor e;
      e.name = t.at("name").get<std::string>();
      e.shape = t.at("shape").get<Shape>();
      e.offset = t.at("offset").get<std::uint64_t>();
      e.bytes = t.at("bytes").get<std::uint64_t>();
      e.xxh3 = std::stoull(t.at("xxh3").get<std::string>(), nullptr, 16);
      h.tensors.push_back(std::move(e));
    }
    h.payload_offset = j.at("payload_offset").get<std::uint64_t>();
    h.payload_bytes = j.at("payload_bytes").get<std::uint64_t>();
  } catch (const std::exception& e) {
    return corrupt(std::string("header: ") + e.what());
  }
  reason = "table";
  if (h.payload_offset != align64(kCheckpointPrefixBytes + header_len))
    return corrupt("payload offset is not where the header ends");
  reason = "truncated";
  if (file.size() != h.payload_offset + h.payload_bytes) {
    return corrupt("file is " + std::to_string(file.size()) + " bytes; the header says " +
                   std::to_string(h.payload_offset + h.payload_bytes));
  }
  reason = "table";
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  std::set<std::string> names;
  for (const auto& t : h.tensors) {
    if (!names.insert(t.name).second) return corrupt("tensor '" + t.name + "' is listed twice");
    std::uint64_t numel = 1;
    for (auto d : t.shape) {
      if (d < 0 || d > (1ll << 40)) return corrupt("tensor '" + t.name + "' has a bad shape");
      numel *= static_cast<std::uint64_t>(d);
    }
    if (numel * sizeof(float) != t.bytes)
      return corrupt("tensor '" + t.name + "': shape and byte size disagree");
    if (t.offset > h.payload_bytes || t.bytes > h.payload_bytes - t.offset) {
      return corrupt("tensor '" + t.name + "' lies outside the payload");
    }
    spans.emplace_back(t.offset, t.offset + t.bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) return corrupt("tensors overlap in the payload");
  }
  // The key must be exactly what every cache covers (the MTP history one row less): a longer
  // key is the DS4Server corruption. Checked here so that `state inspect` refuses it too.
  reason = "key_coverage";
  const auto n = static_cast<std::int64_t>(h.key.size());
  for (const auto& c : h.caches) {
    const std::int64_t want = c.group == "mtp" ? std::max<std::int64_t>(n - 1, 0) : n;
    if (c.covered != want) {
      return corrupt("key has " + std::to_string(n) + " tokens but " + c.group + " cache " +
                     std::to_string(c.index) + " (" + c.kind + ") covers " +
                     std::to_string(c.covered));
    }
  }
  reason.clear();
  return h;
}

}  // namespace

Expected<CheckpointHeader> parse_checkpoint(std::span<const std::uint8_t> file) {
  std::string reason;
  return parse_checkpoint_impl(file, reason);
}

Expected<LoadedCheckpoint> load_checkpoint(const std::string& path, Model& model,
                                           const CheckpointIdentity& id,
                                           std::string* rejection_reason) {
  std::string reason;
  auto fail = [&](const std::string& why, Status s) -> Expected<LoadedCheckpoint> {
    if (rejection_reason) *rejection_reason = why;
    return s.with_context(path);
  };
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return fail("io", mapped.status());
  const auto file = mapped->bytes();
  auto parsed = parse_checkpoint_impl(file, reason);
  if (!parsed.ok()) return fail(reason, parsed.status());
  const CheckpointHeader& h = *parsed;
  if (h.family != id.family)
    return fail("fingerprint", failed_precondition("checkpoint of another family"));
  if (h.model_fingerprint != id.model_fingerprint) {
    return fail("fingerprint", failed_precondition("checkpoint of another model (fingerprint " +
                                                   h.model_fingerprint + ", this model " +
                                                   id.model_fingerprint + ")"));
  }

  // (The key against every cache's coverage was checked by the parse.)
  const auto n = static_cast<std::int64_t>(h.key.size());
  bool has_mtp = false;
  for (const auto& c : h.caches) has_mtp |= c.group == "mtp";
  for (TokenId t : h.key) {
    if (t < 0 || t >= model.info().vocab_size)
      return fail("header",
                  corrupt("key holds token id " + std::to_string(t) + " outside the vocabulary"));
  }

  // The table against this model's caches: same groups, kinds and tensor names.
  DecodeState state = new_decode_state(model);
  if (has_mtp != static_cast<bool>(state.mtp_history)) {
    return fail("table",
                corrupt(has_mtp ? "checkpoint has an MTP history; this model has no MTP head"
                                : "checkpoint lacks the MTP history this model needs"));
  }
  std::map<std::string, const CheckpointTensor*> by_name;
  for (const auto& t : h.tensors) by_name[t.name] = &t;
  auto expect_group = [&](const std::string& group, const ModelState& ms) -> Status {
    std::size_t seen = 0;
    for (const auto& c : h.caches) {
      if (c.group != group) continue;
      if (c.index >= ms.cache_count() || ms.cache(c.index).kind() != c.kind) {
        return corrupt(group + " cache " + std::to_string(c.index) + " (" + c.kind +
                       ") does not match this model");
      }
      ++seen;
    }
    if (seen != ms.cache_count())
      return corrupt(group + " has " + std::to_string(seen) + " caches; the model has " +
                     std::to_string(ms.cache_count()));
    return {};
  };
  if (auto s = expect_group("trunk", *state.trunk); !s.ok()) return fail("table", s);
  if (state.mtp_history) {
    if (auto s = expect_group("mtp", *state.mtp_history); !s.ok()) return fail("table", s);
  }
  // Exactly this model's tensors, no more and no fewer (cache tensor names do not depend on
  // coverage), and the two vectors at the sizes the model gives them.
  std::set<std::string> want_names = {"next_logits", "last_hidden"};
  for (const auto& t : state.trunk->tensors()) want_names.insert("trunk/" + t.name);
  if (state.mtp_history)
    for (const auto& t : state.mtp_history->tensors()) want_names.insert("mtp/" + t.name);
  for (const auto& t : h.tensors)
    if (!want_names.count(t.name))
      return fail("table",
                  corrupt("tensor '" + t.name + "' is not a tensor of this model's state"));
  for (const auto& name : want_names)
    if (!by_name.count(name)) return fail("table", corrupt("no '" + name + "' tensor"));
  const auto expect_vector = [&](const char* name, std::int64_t size) -> Status {
    const Shape& shape = by_name.at(name)->shape;
    if (shape.size() == 1 && shape[0] == size) return {};
    return corrupt(std::string(name) + " has shape " + shape_to_string(shape) +
                   "; this model's is [" + std::to_string(size) + "]");
  };
  if (auto s = expect_vector("next_logits", n > 0 ? model.info().vocab_size : 0); !s.ok())
    return fail("shape", s);
  // last_hidden is the MTP head's input: its width exactly when there is a head; a model without
  // one never reads it, and an empty one is all it may hold before the first token.
  if (MtpHead* head = model.mtp(); head || n == 0) {
    if (auto s = expect_vector("last_hidden", n > 0 ? head->hidden_width() : 0); !s.ok())
      return fail("shape", s);
  }
  const auto payload = file.subspan(h.payload_offset, h.payload_bytes);
  for (const auto& t : h.tensors) {
    if (xxh3_64(payload.subspan(t.offset, t.bytes)) != t.xxh3) {
      return fail("tensor_checksum", corrupt("tensor '" + t.name + "' fails its checksum"));
    }
  }

  // Everything checked: build the caches.
  auto view_of = [&](const CheckpointTensor& t, const std::string& local) {
    const auto bytes = payload.subspan(t.offset, t.bytes);
    return StateTensorView{
        local, t.shape, {reinterpret_cast<const float*>(bytes.data()), t.bytes / sizeof(float)}};
  };
  auto load_group = [&](const std::string& group, ModelState& ms) -> Status {
    for (const auto& c : h.caches) {
      if (c.group != group) continue;
      const std::string prefix = group + "/" + std::to_string(c.index) + "." + c.kind + ".";
      std::vector<StateTensorView> views;
      for (const auto& t : h.tensors) {
        if (t.name.rfind(prefix, 0) == 0) views.push_back(view_of(t, t.name.substr(prefix.size())));
      }
      if (auto s = ms.cache(c.index).load(views, c.covered); !s.ok()) return s;
    }
    return {};
  };
  if (auto s = load_group("trunk", *state.trunk); !s.ok()) return fail("shape", s);
  if (state.mtp_history) {
    if (auto s = load_group("mtp", *state.mtp_history); !s.ok()) return fail("shape", s);
  }
  for (const char* name : {"next_logits", "last_hidden"}) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) return fail("table", corrupt(std::string("no ") + name + " tensor"));
    const auto v = view_of(*it->second, name);
    (std::string(name) == "next_logits" ? state.next_logits : state.last_hidden)
        .assign(v.data.begin(), v.data.end());
  }
  state.tokens = h.key;
  if (auto s = state.check_invariant(); !s.ok()) return fail("key_coverage", s);
  return LoadedCheckpoint{h, std::move(state)};
}

// model_fingerprint and weights_hash: fingerprint.cpp.

}  // namespace fs
