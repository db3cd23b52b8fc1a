#include "model/loader.h"

#include <type_traits>
#include "backend/backend.h"

#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/numerics.h"
#include "model/family.h"
#include "model/gguf_config.h"
#include "model/gguf_inspect.h"
#include "model/glm5/forward.h"
#include "model/mtp.h"
#include "model/qwen_next/forward.h"

namespace fs {
namespace {

using LoadFn = Expected<std::unique_ptr<Model>> (*)(const ModelDescription& d,
                                                    const std::string& dir,
                                                    std::unique_ptr<Backend> backend,
                                                    DType matrix_dtype, Numerics numerics);

// One family's load: its weights read from `dir` and uploaded to the backend, and the model over
// them. The weights are read and checked completely before anything is uploaded. Only DeepSeek V4
// takes a numerics (load_model refuses kOfficial for the other families).
template <typename Config, typename FamilyModel, auto load_weights, auto upload_weights>
Expected<std::unique_ptr<Model>> load_family(const ModelDescription& d, const std::string& dir,
                                             std::unique_ptr<Backend> backend, DType matrix_dtype,
                                             [[maybe_unused]] Numerics numerics) {
  const auto& config = std::get<Config>(d.config);
  auto weights = load_weights(config, dir);
  if (!weights.ok()) return weights.status();
  if (Status s = upload_weights(*weights, *backend, matrix_dtype); !s.ok())
    return s.with_context("uploading " + dir + " to the " + backend->name() + " backend");
  if constexpr (std::is_same_v<FamilyModel, DeepseekV4Model>)
    return std::unique_ptr<Model>(std::make_unique<FamilyModel>(config, std::move(weights).value(),
                                                                std::move(backend), numerics));
  else
    return std::unique_ptr<Model>(
        std::make_unique<FamilyModel>(config, std::move(weights).value(), std::move(backend)));
}

// The runnable families' constructors (the rest of what a family is lives in family_table.cpp).
struct FamilyLoader {
  Family family;
  LoadFn load;
};
constexpr FamilyLoader kLoaders[] = {
    {Family::kQwenNext,
     load_family<QwenNextConfig, QwenNextModel, load_qwen_next_weights, upload_qwen_next_weights>},
    {Family::kGlm5, load_family<Glm5Config, Glm5Model, load_glm5_weights, upload_glm5_weights>},
    {Family::kDeepseekV4, load_family<DeepseekV4Config, DeepseekV4Model, load_deepseek_v4_weights,
                                      upload_deepseek_v4_weights>}};

}  // namespace

Expected<std::unique_ptr<Model>> load_model(const std::string& dir, const LoadOptions& options) {
  // A GGUF file's config is its metadata; a folder's, its config.json.
  auto desc = is_gguf_file(dir) ? describe_gguf_model(dir) : describe_model(dir);
  if (!desc.ok()) return desc.status();
  LoadFn load = nullptr;
  for (const auto& l : kLoaders) {
    if (l.family == desc->family) load = l.load;
  }
  if (load == nullptr)
    return unsupported(desc->model_type + ": no forward pass for this family yet");
  if (options.dtype != "auto" && options.dtype != "f32" && options.dtype != "bf16")
    return invalid_argument("unknown --dtype '" + options.dtype + "' (expected f32, bf16 or auto)");
  auto numerics = parse_numerics(options.numerics);
  if (!numerics.ok()) return numerics.status();
  if (*numerics == Numerics::kOfficial) {
    if (desc->family != Family::kDeepseekV4)
      return invalid_argument("--numerics official: " + desc->model_type +
                              " has no official-graph numerics (only deepseek_v4 does)");
    if (Status s = check_official_numerics(std::get<DeepseekV4Config>(desc->config)); !s.ok())
      return s.with_context(dir);
  }
  auto backend = make_backend(options.backend);
  if (!backend.ok()) return backend.status();
  // On the CPU "auto" is f32, which keeps every matrix as stored: the CPU widens bf16 tiles
  // exactly, so it computes on the mapped checkpoint in place, with no conversion and no copy.
  const bool host = (*backend)->memory()->device() == Device::kHost;
  const DType dtype =
      options.dtype == "bf16" || (options.dtype == "auto" && !host) ? DType::kBF16 : DType::kF32;
  auto model = load(*desc, dir, std::move(backend).value(), dtype, *numerics);
  if (!model.ok() || options.draft_vocab == 0) return model;
  MtpHead* head = (*model)->mtp();
  if (head == nullptr)
    return invalid_argument("--draft-vocab needs a checkpoint with an MTP head; " + dir +
                            " has none");
  if (auto s = head->set_draft_vocabulary(options.draft_vocab); !s.ok()) return s;
  return model;
}

}  // namespace fs
