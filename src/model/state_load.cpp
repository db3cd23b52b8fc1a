#include "model/state_load.h"

namespace fs {

Expected<const StateTensorView*> find_state_tensor(std::span<const StateTensorView> tensors,
                                                   const std::string& name, const Shape& shape) {
  for (const auto& t : tensors) {
    if (t.name != name) continue;
    if (t.shape != shape || static_cast<std::int64_t>(t.data.size()) != shape_numel(shape))
      return invalid_argument("state tensor " + name + " has shape " + shape_to_string(t.shape) +
                              ", expected " + shape_to_string(shape));
    return &t;
  }
  return not_found("state tensor " + name + " is missing");
}

Status load_state_tensor(std::span<const StateTensorView> tensors, const std::string& name,
                         Tensor& dst, const Shape& shape, const std::shared_ptr<Memory>& memory) {
  auto t = find_state_tensor(tensors, name, shape);
  if (!t.ok()) return t.status();
  if (!dst.allocate(memory, shape))
    return out_of_range("out of " + device_name(memory->device()) +
                        " memory loading state tensor " + name);
  dst.copy_from_host((*t)->data);
  return {};
}

}  // namespace fs
