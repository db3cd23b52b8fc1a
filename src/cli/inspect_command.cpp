// flashserve inspect --model DIR [--json]
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/inspect.h"

namespace fs::cli {
namespace {

nlohmann::json report_json(const InspectReport& r) {
  nlohmann::json j;
  j["family"] = family_name(r.description.family);
  j["model_type"] = r.description.model_type;
  j["num_layers"] = r.description.layers.size();
  auto layers = nlohmann::json::array();
  for (std::size_t i = 0; i < r.description.layers.size(); ++i) {
    const auto& l = r.description.layers[i];
    layers.push_back(
        {{"layer", i}, {"attention", l.attention}, {"mlp", l.mlp}, {"features", l.features}});
  }
  j["layers"] = layers;
  j["parameters"] = r.parameters;
  j["bytes_by_dtype"] = r.bytes_by_dtype;
  j["shards"] = r.shards;
  j["missing_tensors"] = r.missing_tensors;
  j["unexpected_tensors"] = r.unexpected_tensors;
  j["mismatched_tensors"] = r.mismatched_tensors;
  j["mtp_tensors"] = r.mtp_tensors.size();
  j["complete"] = r.complete();
  return j;
}

void print_text(const InspectReport& r) {
  std::cout << "family      " << family_name(r.description.family) << " (model_type "
            << r.description.model_type << ")\n";
  std::cout << "parameters  " << r.parameters << " in " << r.shards << " shard(s)\n";
  for (const auto& [dtype, bytes] : r.bytes_by_dtype) {
    std::cout << "bytes " << dtype << "  " << bytes << "\n";
  }
  std::cout << "layers      " << r.description.layers.size() << "\n";
  for (std::size_t i = 0; i < r.description.layers.size(); ++i) {
    const auto& l = r.description.layers[i];
    std::cout << "  " << i << "  " << l.attention << " + " << l.mlp;
    for (const auto& f : l.features) std::cout << "  [" << f << "]";
    std::cout << "\n";
  }
  std::cout << "mtp tensors " << r.mtp_tensors.size() << "\n";
  for (const auto& n : r.missing_tensors) std::cout << "missing     " << n << "\n";
  for (const auto& n : r.unexpected_tensors) std::cout << "unexpected  " << n << "\n";
  for (const auto& n : r.mismatched_tensors) std::cout << "mismatch    " << n << "\n";
}

}  // namespace

void add_inspect_command(CLI::App& app, Action& action) {
  struct Options {
    std::string model;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand(
      "inspect", "Family, layer schedule, parameters and tensor check of a checkpoint");
  cmd->add_option("--model", opts->model, "Model folder (config.json + safetensors)")->required();
  cmd->add_flag("--json", opts->json, "Print one JSON object");
  cmd->callback([opts, &action] {
    action = [opts] {
      auto report = inspect_model_dir(opts->model);
      if (!report.ok()) {
        std::cerr << "flashserve inspect: " << report.status().to_string() << "\n";
        return 1;
      }
      if (opts->json) {
        std::cout << report_json(*report).dump(2) << "\n";
      } else {
        print_text(*report);
      }
      // A checkpoint that does not match its config is reported in full, then fails.
      return report->complete() ? 0 : 3;
    };
  });
}

}  // namespace fs::cli
