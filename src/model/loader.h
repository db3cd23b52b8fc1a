// Opens a model folder (config.json + safetensors) as a runnable Model on a backend.
#pragma once

#include <memory>
#include <string>

#include "model/model.h"
#include "util/status.h"

namespace fs {

struct LoadOptions {
  std::string backend = "cpu";
};

// Families without a forward pass yet (deepseek_v4, glm5_next) are `unsupported`.
Expected<std::unique_ptr<Model>> load_model(const std::string& dir,
                                            const LoadOptions& options = {});

}  // namespace fs
