#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace fs {

Expected<std::int64_t> ModelState::covered_tokens() const {
  if (caches_.empty()) return std::int64_t{0};
  const std::int64_t n = caches_.front()->covered_tokens();
  for (std::size_t i = 1; i < caches_.size(); ++i) {
    if (caches_[i]->covered_tokens() != n) {
      return internal_error("cache " + std::to_string(i) + " (" + caches_[i]->kind() + ") covers " +
                            std::to_string(caches_[i]->covered_tokens()) + " tokens, cache 0 (" +
                            caches_.front()->kind() + ") covers " + std::to_string(n));
    }
  }
  return n;
}

std::unique_ptr<ModelState> ModelState::clone() const {
  std::vector<std::unique_ptr<LayerCache>> copies;
  copies.reserve(caches_.size());
  for (const auto& c : caches_) copies.push_back(c->clone());
  return std::make_unique<ModelState>(std::move(copies));
}

std::size_t ModelState::bytes() const {
  std::size_t total = 0;
  for (const auto& c : caches_) total += c->bytes();
  return total;
}

Status ModelState::truncate(std::int64_t length) {
  // Check every cache first so a refused truncation leaves the state untouched.
  for (std::size_t i = 0; i < caches_.size(); ++i) {
    const auto covered = caches_[i]->covered_tokens();
    if (length > covered) {
      return out_of_range("cannot truncate cache " + std::to_string(i) + " to " +
                          std::to_string(length) + " tokens: it covers " + std::to_string(covered));
    }
    if (!caches_[i]->can_truncate(length)) {
      return failed_precondition("cache " + std::to_string(i) + " (" + caches_[i]->kind() +
                                 ") cannot go back from " + std::to_string(covered) + " to " +
                                 std::to_string(length) + " tokens");
    }
  }
  for (auto& c : caches_) {
    if (auto s = c->truncate(length); !s.ok()) return s;
  }
  return {};
}

std::vector<StateTensor> ModelState::tensors() const {
  std::vector<StateTensor> out;
  for (std::size_t i = 0; i < caches_.size(); ++i) {
    for (auto& t : caches_[i]->tensors()) {
      t.name = std::to_string(i) + "." + caches_[i]->kind() + "." + t.name;
      out.push_back(std::move(t));
    }
  }
  return out;
}

Status ModelState::check_allocated() const {
  // Runs before every forward: per-cache names only (short), the full name on failure.
  for (std::size_t i = 0; i < caches_.size(); ++i) {
    for (const auto& t : caches_[i]->tensors()) {
      if (t.tensor->ok()) continue;
      return out_of_range("state tensor " + std::to_string(i) + "." + caches_[i]->kind() + "." +
                          t.name + " " + shape_to_string(t.tensor->shape()) +
                          " could not be allocated in " + device_name(t.tensor->device()) +
                          " memory");
    }
  }
  return {};
}

HostStateTensors copy_to_host(const LayerCache& cache) {
  HostStateTensors out;
  const auto tensors = cache.tensors();
  out.values.reserve(tensors.size());
  for (const auto& t : tensors) {
    out.values.push_back(t.tensor->to_host_vector());
    out.views.push_back({t.name, t.tensor->shape(), out.values.back()});
  }
  return out;
}

std::vector<TensorDifference> compare_states(const ModelState& a, const ModelState& b) {
  std::map<std::string, const Tensor*> right;
  for (auto& t : b.tensors()) right.emplace(t.name, t.tensor);
  std::vector<TensorDifference> out;
  for (const auto& t : a.tensors()) {
    TensorDifference d;
    d.name = t.name;
    const auto it = right.find(t.name);
    if (it == right.end() || it->second->shape() != t.tensor->shape()) {
      d.shape_mismatch = true;
    } else {
      const auto x = t.tensor->to_host_vector(), y = it->second->to_host_vector();
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double diff = std::fabs(static_cast<double>(x[i]) - y[i]);
        // NaN on either side counts as an unbounded difference.
        d.max_abs = std::isnan(diff) ? INFINITY : std::max(d.max_abs, diff);
      }
      right.erase(it);
    }
    out.push_back(d);
  }
  for (const auto& [name, t] : right) out.push_back({name, 0, true});
  return out;
}

double max_difference(const std::vector<TensorDifference>& diffs) {
  double m = 0;
  for (const auto& d : diffs) m = d.shape_mismatch ? INFINITY : std::max(m, d.max_abs);
  return m;
}

}  // namespace fs
