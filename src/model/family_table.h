// The one table of model families. Everything that differs by family and is not inside the
// family's own folder is an entry field here: the HF model_type names, how the config becomes a
// description, and the checkpoint identity. Adding a family is one entry plus its folder (and,
// once it has a forward pass, its constructor in loader.cpp, which is kept apart so that the
// parsers, their sanitizer builds and the fuzzers link without the model code).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/family.h"
#include "util/status.h"

namespace fs {

class ConfigReader;

struct FamilyEntry {
  Family family;
  std::string model_type;            // canonical HF model_type
  std::vector<std::string> aliases;  // also accepted (e.g. the text config of a multimodal one)
  // Session checkpoints: a per-family magic, and the version of the family's state layout (bump
  // it when the caches change).
  std::array<char, 8> checkpoint_magic;
  std::uint32_t checkpoint_version;
  // Fills config, layers, tensors and mtp_prefixes of `d` from the config.
  Status (*describe)(ConfigReader& config, ModelDescription& d);
};

std::span<const FamilyEntry> family_table();
const FamilyEntry& family_entry(Family f);

}  // namespace fs
