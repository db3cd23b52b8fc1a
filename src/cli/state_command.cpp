// flashserve state inspect F | state diff A B [--tol X]
#include <cmath>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "session/checkpoint.h"
#include "util/hash.h"
#include "util/mapped_file.h"

namespace fs::cli {
namespace {

struct OpenCheckpoint {
  MappedFile file;
  CheckpointHeader header;
  std::span<const float> tensor(const CheckpointTensor& t) const {
    const auto b = file.bytes().subspan(header.payload_offset + t.offset, t.bytes);
    return {reinterpret_cast<const float*>(b.data()), t.bytes / sizeof(float)};
  }
};

// Parses the header and verifies every tensor checksum; no model needed.
Expected<OpenCheckpoint> open_checkpoint(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped.ok()) return mapped.status();
  auto header = parse_checkpoint(mapped->bytes());
  if (!header.ok()) return header.status().with_context(path);
  OpenCheckpoint c{std::move(mapped).value(), std::move(header).value()};
  for (const auto& t : c.header.tensors) {
    const auto bytes = c.file.bytes().subspan(c.header.payload_offset + t.offset, t.bytes);
    if (xxh3_64(bytes) != t.xxh3)
      return corrupt(path + ": tensor '" + t.name + "' fails its checksum");
  }
  return c;
}

int run_inspect(const std::string& path) {
  auto c = open_checkpoint(path);
  if (!c.ok()) {
    std::cerr << "flashserve state inspect: " << c.status().to_string() << "\n";
    return 2;
  }
  std::cout << c->header.to_json().dump(2) << "\n";
  return 0;
}

int run_diff(const std::string& a_path, const std::string& b_path, double tol) {
  auto a = open_checkpoint(a_path);
  auto b = open_checkpoint(b_path);
  for (auto* c : {&a, &b}) {
    if (!c->ok()) {
      std::cerr << "flashserve state diff: " << c->status().to_string() << "\n";
      return 2;
    }
  }
  std::map<std::string, const CheckpointTensor*> right;
  for (const auto& t : b->header.tensors) right[t.name] = &t;
  nlohmann::json tensors = nlohmann::json::array();
  double worst = 0;
  bool all_present = true;
  for (const auto& t : a->header.tensors) {
    const auto it = right.find(t.name);
    if (it == right.end() || it->second->shape != t.shape) {
      tensors.push_back(
          {{"name", t.name}, {"status", it == right.end() ? "only_in_a" : "shape_mismatch"}});
      all_present = false;
      if (it != right.end()) right.erase(it);
      continue;
    }
    const auto x = a->tensor(t), y = b->tensor(*it->second);
    double m = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double d = std::fabs(static_cast<double>(x[i]) - y[i]);
      m = std::isnan(d) ? INFINITY : std::max(m, d);
    }
    worst = std::max(worst, m);
    tensors.push_back({{"name", t.name}, {"max_abs", m}});
    right.erase(it);
  }
  for (const auto& [name, t] : right) {
    tensors.push_back({{"name", name}, {"status", "only_in_b"}});
    all_present = false;
  }
  const bool keys_equal = a->header.key == b->header.key;
  const bool within = all_present && worst <= tol;
  nlohmann::json out = {
      {"keys_equal", keys_equal},   {"key_lengths", {a->header.key.size(), b->header.key.size()}},
      {"max_abs", worst},           {"tolerance", tol},
      {"within_tolerance", within}, {"tensors", tensors}};
  std::cout << out.dump(2) << "\n";
  return keys_equal && within ? 0 : 1;
}

}  // namespace

void add_state_command(CLI::App& app, Action& action) {
  auto* state = app.add_subcommand("state", "Inspect and compare session checkpoints");
  state->require_subcommand(1);

  auto inspect_path = std::make_shared<std::string>();
  auto* inspect =
      state->add_subcommand("inspect", "Print a checkpoint's header as JSON (exit 2 if invalid)");
  inspect->add_option("file", *inspect_path, "Checkpoint file")->required();
  inspect->callback(
      [inspect_path, &action] { action = [inspect_path] { return run_inspect(*inspect_path); }; });

  struct DiffOptions {
    std::string a, b;
    double tol = 0;
  };
  auto d = std::make_shared<DiffOptions>();
  auto* diff = state->add_subcommand(
      "diff", "Per-tensor max |a - b| and key equality (exit 0 when equal within --tol)");
  diff->add_option("a", d->a)->required();
  diff->add_option("b", d->b)->required();
  diff->add_option("--tol", d->tol, "Largest allowed per-element difference");
  diff->callback([d, &action] { action = [d] { return run_diff(d->a, d->b, d->tol); }; });
}

}  // namespace fs::cli
