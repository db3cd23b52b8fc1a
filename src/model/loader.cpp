#include "model/loader.h"

#include "backend/backend.h"
#include "model/family.h"
#include "model/family_table.h"

namespace fs {

Expected<std::unique_ptr<Model>> load_model(const std::string& dir, const LoadOptions& options) {
  auto desc = describe_model(dir);
  if (!desc.ok()) return desc.status();
  const auto& entry = family_entry(desc->family);
  if (entry.load == nullptr)
    return unsupported(desc->model_type + ": no forward pass for this family yet");
  if (options.dtype != "auto" && options.dtype != "f32" && options.dtype != "bf16")
    return invalid_argument("unknown --dtype '" + options.dtype + "' (expected f32, bf16 or auto)");
  auto backend = make_backend(options.backend);
  if (!backend.ok()) return backend.status();
  // On the CPU "auto" is f32, which keeps every matrix as stored: the CPU widens bf16 tiles
  // exactly, so it computes on the mapped checkpoint in place, with no conversion and no copy.
  const bool host = (*backend)->memory()->device() == Device::kHost;
  const DType dtype =
      options.dtype == "bf16" || (options.dtype == "auto" && !host) ? DType::kBF16 : DType::kF32;
  return entry.load(*desc, dir, std::move(backend).value(), dtype);
}

}  // namespace fs
