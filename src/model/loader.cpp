#include "model/loader.h"

#include "backend/backend.h"
#include "model/deepseek_v4/forward.h"
#include "model/deepseek_v4/numerics.h"
#include "model/family.h"
#include "model/glm5/forward.h"
#include "model/mtp.h"
#include "model/qwen_next/forward.h"

namespace fs {
namespace {

using LoadFn = Expected<std::unique_ptr<Model>> (*)(const ModelDescription& d,
                                                    const std::string& dir,
                                                    std::unique_ptr<Backend> backend,
                                                    DType matrix_dtype, Numerics numerics);

// Qwen and GLM compute with HF's arithmetic only (load_model refuses any other).
Expected<std::unique_ptr<Model>> load_qwen_next(const ModelDescription& d, const std::string& dir,
                                                std::unique_ptr<Backend> backend,
                                                DType matrix_dtype, Numerics) {
  const auto& config = std::get<QwenNextConfig>(d.config);
  auto weights = load_qwen_next_weights(config, dir);
  if (!weights.ok()) return weights.status();
  if (Status s = upload_qwen_next_weights(*weights, *backend, matrix_dtype); !s.ok())
    return s.with_context("uploading " + dir + " to the " + backend->name() + " backend");
  return std::unique_ptr<Model>(
      std::make_unique<QwenNextModel>(config, std::move(weights).value(), std::move(backend)));
}

Expected<std::unique_ptr<Model>> load_glm5(const ModelDescription& d, const std::string& dir,
                                           std::unique_ptr<Backend> backend, DType matrix_dtype,
                                           Numerics) {
  const auto& config = std::get<Glm5Config>(d.config);
  auto weights = load_glm5_weights(config, dir);
  if (!weights.ok()) return weights.status();
  if (Status s = upload_glm5_weights(*weights, *backend, matrix_dtype); !s.ok())
    return s.with_context("uploading " + dir + " to the " + backend->name() + " backend");
  return std::unique_ptr<Model>(
      std::make_unique<Glm5Model>(config, std::move(weights).value(), std::move(backend)));
}

Expected<std::unique_ptr<Model>> load_deepseek_v4(const ModelDescription& d, const std::string& dir,
                                                  std::unique_ptr<Backend> backend,
                                                  DType matrix_dtype, Numerics numerics) {
  const auto& config = std::get<DeepseekV4Config>(d.config);
  if (numerics == Numerics::kOfficial) {
    if (Status s = check_official_numerics(config); !s.ok()) return s.with_context(dir);
  }
  auto weights = load_deepseek_v4_weights(config, dir);
  if (!weights.ok()) return weights.status();
  if (Status s = upload_deepseek_v4_weights(*weights, *backend, matrix_dtype); !s.ok())
    return s.with_context("uploading " + dir + " to the " + backend->name() + " backend");
  return std::unique_ptr<Model>(std::make_unique<DeepseekV4Model>(
      config, std::move(weights).value(), std::move(backend), numerics));
}

// The runnable families' constructors (the rest of what a family is lives in family_table.cpp).
struct FamilyLoader {
  Family family;
  LoadFn load;
};
constexpr FamilyLoader kLoaders[] = {{Family::kQwenNext, load_qwen_next},
                                     {Family::kGlm5, load_glm5},
                                     {Family::kDeepseekV4, load_deepseek_v4}};

}  // namespace

Expected<std::unique_ptr<Model>> load_model(const std::string& dir, const LoadOptions& options) {
  auto desc = describe_model(dir);
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
  if (*numerics == Numerics::kOfficial && desc->family != Family::kDeepseekV4)
    return invalid_argument("--numerics official: " + desc->model_type +
                            " has no official-graph numerics (only deepseek_v4 does)");
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
