// A GGUF model's config, from its metadata: the file's `general.architecture` picks the family
// and the architecture's keys become the HF config the family's parser reads, so a GGUF model
// passes the same validation and gets the same schema as its safetensors release.
//
// `deepseek4` (ds4's DeepSeek V4 files, ../shared/research/arch-dsv4.md 1.2): the keys ds4's
// loader requires are required here, and a missing one is an error that names it; what ds4
// hard-codes without a key (the sqrt(softplus) router, YaRN's attention factor 1) is the
// architecture's, and the output head is tied when the file has no `output.weight`.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "format/gguf.h"
#include "model/family.h"
#include "util/status.h"

namespace fs {

// The HF config.json text the metadata stands for (for `describe_model_config`).
Expected<std::string> hf_config_from_gguf(const GgufModel& model);
// For a GGUF file, the HF config its metadata stands for, parsed (for callers that read one field:
// the model_type of the chat format, the context length); nullopt for any other path or a file
// the loader would refuse.
std::optional<nlohmann::json> gguf_hf_config(const std::string& path);
// describe_model of a GGUF file (or any file of a split set).
Expected<ModelDescription> describe_gguf_model(const std::string& path);

}  // namespace fs
