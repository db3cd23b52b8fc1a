#include "model/loader.h"

#include "backend/backend.h"
#include "model/family.h"
#include "model/qwen_next/forward.h"

namespace fs {

Expected<std::unique_ptr<Model>> load_model(const std::string& dir, const LoadOptions& options) {
  auto desc = describe_model(dir);
  if (!desc.ok()) return desc.status();
  if (options.backend != "cpu")
    return unsupported("backend '" + options.backend + "' is not available (only cpu so far)");
  if (desc->family != Family::kQwenNext)
    return unsupported(desc->model_type + ": no forward pass for this family yet (only qwen4_exp)");
  const auto& config = std::get<QwenNextConfig>(desc->config);
  auto weights = load_qwen_next_weights(config, dir);
  if (!weights.ok()) return weights.status();
  return std::unique_ptr<Model>(
      std::make_unique<QwenNextModel>(config, std::move(weights).value(), make_cpu_backend()));
}

}  // namespace fs
