#include "model/inspect.h"

#include <set>

namespace fs {
namespace {

bool shape_matches(const Shape& want, const Shape& got) {
  if (want.size() != got.size()) return false;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] != -1 && want[i] != got[i]) return false;
  }
  return true;
}

}  // namespace

InspectReport inspect_checkpoint(const ModelDescription& d, const Checkpoint& ck) {
  InspectReport r;
  r.description = d;
  r.shards = ck.shard_count();
  std::set<std::string> expected;
  for (const auto& spec : d.tensors) {
    expected.insert(spec.name);
    const auto view = ck.view(spec.name);
    if (!view) {
      r.missing_tensors.push_back(spec.name);
      continue;
    }
    const bool dtype_ok = spec.integer ? !dtype_is_float(view->dtype) : dtype_is_float(view->dtype);
    if (!shape_matches(spec.shape, view->shape) || !dtype_ok) {
      r.mismatched_tensors.push_back(spec.name + ": expected " + shape_to_string(spec.shape) +
                                     (spec.integer ? " integer" : " float") + ", found " +
                                     shape_to_string(view->shape) + " " +
                                     std::string(dtype_name(view->dtype)));
    }
  }
  for (const auto& [name, stored] : ck.tensors()) {
    const TensorEntry& e = *stored.entry;
    r.bytes_by_dtype[std::string(dtype_name(e.dtype))] += e.end - e.begin;
    if (dtype_is_float(e.dtype)) r.parameters += shape_numel(e.shape);
    if (expected.count(name)) continue;
    if (is_mtp_tensor(d, name)) {
      r.mtp_tensors.push_back(name);
    } else {
      r.unexpected_tensors.push_back(name);
    }
  }
  return r;
}

Expected<InspectReport> inspect_model_dir(const std::string& dir) {
  auto d = describe_model(dir);
  if (!d.ok()) return d.status();
  auto ck = Checkpoint::open(dir);
  if (!ck.ok()) return ck.status();
  return inspect_checkpoint(*d, *ck);
}

}  // namespace fs
