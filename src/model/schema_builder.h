// Small helper for the per-family tensor lists: prefixes and pushes TensorSpecs.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/family.h"

namespace fs {

class SchemaBuilder {
 public:
  explicit SchemaBuilder(std::vector<TensorSpec>& out) : out_(out) {}
  void add(const std::string& prefix, const std::string& name, Shape shape) {
    out_.push_back({prefix + name, std::move(shape), false});
  }
  void add_index(const std::string& prefix, const std::string& name, Shape shape) {
    out_.push_back({prefix + name, std::move(shape), true});
  }

 private:
  std::vector<TensorSpec>& out_;
};

inline std::string layer_prefix(std::int64_t i) {
  return "layers." + std::to_string(i) + ".";
}

}  // namespace fs
