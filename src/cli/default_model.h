// Where the embedded default model lives when no --model is given.
#pragma once

#include <string>

#include "util/status.h"

namespace fs::cli {

// $FLASHSERVE_MODEL if set; else models/qwen4-tiny-code found beside the executable's build
// tree (build/src/flashserve -> models/); else the source tree this binary was built from.
Expected<std::string> default_model_dir();

}  // namespace fs::cli
