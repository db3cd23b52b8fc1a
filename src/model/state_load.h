// What the families' caches share when they load a state (LayerCache::load): finding a named
// tensor of the expected shape among host copies, and copying it into the cache's memory.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "model/model.h"

namespace fs {

// Finds `name` among `tensors` with exactly `shape`; an error names what is wrong.
Expected<const StateTensorView*> find_state_tensor(std::span<const StateTensorView> tensors,
                                                   const std::string& name, const Shape& shape);
// Copies the values of `name` into `dst`, a fresh tensor of `shape` in `memory`.
Status load_state_tensor(std::span<const StateTensorView> tensors, const std::string& name,
                         Tensor& dst, const Shape& shape, const std::shared_ptr<Memory>& memory);

}  // namespace fs
