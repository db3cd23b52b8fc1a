// flashserve inspect --model DIR [--json]
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "model/gguf_inspect.h"
#include "model/inspect.h"

namespace fs::cli {
namespace {

std::string gib(std::uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB",
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

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
  j["official_names"] = r.official_names;
  j["bytes_by_format"] = r.bytes_by_format;
  auto tensors = nlohmann::json::array();
  for (const auto& t : r.tensors) {
    nlohmann::json e = {{"name", t.name},
                        {"format", t.format},
                        {"shape", t.shape},
                        {"bytes", t.bytes},
                        {"decode_bytes", t.decode_bytes},
                        {"mtp", t.mtp}};
    if (!t.hf_name.empty()) e["hf_name"] = t.hf_name;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = tensors;
  j["decode_bytes_per_token"] = {{"total", r.decode_bytes},
                                 {"by_format", r.decode_bytes_by_format},
                                 {"mtp_per_draft", r.mtp_decode_bytes},
                                 {"experts", r.experts},
                                 {"experts_per_token", r.experts_per_token}};
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
  if (r.official_names) std::cout << "names       DeepSeek V4's official release\n";
  for (const auto& [format, bytes] : r.bytes_by_format)
    std::cout << "format " << format << "  " << bytes << " bytes\n";
  std::cout << "decode reads per token  " << r.decode_bytes << " bytes (" << gib(r.decode_bytes)
            << ")";
  if (r.experts) std::cout << ", experts " << r.experts_per_token << " of " << r.experts;
  std::cout << "\n";
  for (const auto& [format, b] : r.decode_bytes_by_format)
    std::cout << "  " << format << "  " << b << "\n";
  if (r.mtp_decode_bytes) std::cout << "mtp reads per draft  " << r.mtp_decode_bytes << " bytes\n";
  for (const auto& n : r.missing_tensors) std::cout << "missing     " << n << "\n";
  for (const auto& n : r.unexpected_tensors) std::cout << "unexpected  " << n << "\n";
  for (const auto& n : r.mismatched_tensors) std::cout << "mismatch    " << n << "\n";
  for (const auto& t : r.tensors) {
    std::cout << "tensor  " << t.name << "  " << t.format << "  " << shape_to_string(t.shape)
              << "  " << t.bytes;
    if (!t.hf_name.empty()) std::cout << "  (" << t.hf_name << ")";
    std::cout << "\n";
  }
}

nlohmann::json decode_json(const GgufDecodeBytes& d) {
  return {{"total", d.total}, {"by_type", d.by_type}};
}

nlohmann::json gguf_json(const GgufInspectReport& r) {
  nlohmann::json j;
  j["format"] = "gguf";
  j["version"] = r.version;
  j["splits"] = r.splits;
  j["architecture"] = r.architecture;
  j["metadata"] = r.metadata;
  j["parameters"] = r.parameters;
  j["bytes"] = r.bytes;
  auto by_type = nlohmann::json::object();
  for (const auto& [type, t] : r.by_type) {
    by_type[type] = {{"tensors", t.tensors}, {"elements", t.elements}, {"bytes", t.bytes}};
  }
  j["by_type"] = by_type;
  auto tensors = nlohmann::json::array();
  for (const auto& t : r.tensors) {
    nlohmann::json e = {{"name", t.name},
                        {"type", t.type},
                        {"shape", t.shape},
                        {"bytes", t.bytes},
                        {"decode_bytes", t.decode_bytes}};
    if (!t.hf_name.empty()) e["hf_name"] = t.hf_name;
    tensors.push_back(std::move(e));
  }
  j["tensors"] = tensors;
  j["tokenizer"] = {{"usable", r.tokenizer.usable},
                    {"source", r.tokenizer.source},
                    {"tokens", r.tokenizer.tokens},
                    {"problem", r.tokenizer.problem}};
  j["names_mapped"] = r.names_mapped;
  j["unmapped_tensors"] = r.unmapped_tensors;
  auto per_layer = nlohmann::json::array();
  for (const auto& l : r.decode_per_layer) per_layer.push_back(decode_json(l));
  j["decode_bytes_per_token"] = {{"total", r.decode.total},
                                 {"by_type", r.decode.by_type},
                                 {"outside_layers", decode_json(r.decode_outside_layers)},
                                 {"per_layer", per_layer},
                                 {"mtp", decode_json(r.mtp)},
                                 {"expert_count", r.expert_count},
                                 {"expert_used_count", r.expert_used_count},
                                 {"tied_output", r.tied_output}};
  return j;
}

void print_gguf_text(const GgufInspectReport& r) {
  std::cout << "format      GGUF v" << r.version << " in " << r.splits << " file(s)\n";
  std::cout << "arch        "
            << (r.architecture.empty() ? "(no general.architecture)" : r.architecture) << "\n";
  for (const auto& [key, summary] : r.metadata) {
    if (key.rfind("tokenizer.", 0) == 0 && summary.rfind("array", 0) == 0) continue;
    std::cout << "  " << key << " = " << summary << "\n";
  }
  std::cout << "tokenizer   " << r.tokenizer.source;
  if (r.tokenizer.usable)
    std::cout << ", " << r.tokenizer.tokens << " tokens";
  else
    std::cout << ": not usable (" << r.tokenizer.problem
              << "); text needs a tokenizer.json beside the file";
  std::cout << "\n";
  std::cout << "parameters  " << r.parameters << ", " << r.bytes << " bytes (" << gib(r.bytes)
            << ")\n";
  for (const auto& [type, t] : r.by_type) {
    std::cout << "type " << type << "  " << t.tensors << " tensors, " << t.elements << " elements, "
              << t.bytes << " bytes\n";
  }
  std::cout << "decode reads per token  " << r.decode.total << " bytes (" << gib(r.decode.total)
            << ")";
  if (r.expert_count) std::cout << ", experts " << r.expert_used_count << " of " << r.expert_count;
  std::cout << "\n";
  for (const auto& [type, b] : r.decode.by_type) std::cout << "  " << type << "  " << b << "\n";
  std::cout << "  outside layers  " << r.decode_outside_layers.total << "\n";
  for (std::size_t i = 0; i < r.decode_per_layer.size(); ++i) {
    std::cout << "  layer " << i << "  " << r.decode_per_layer[i].total;
    for (const auto& [type, b] : r.decode_per_layer[i].by_type)
      std::cout << "  " << type << " " << b;
    std::cout << "\n";
  }
  if (r.mtp.total) std::cout << "mtp reads per draft  " << r.mtp.total << " bytes\n";
  for (const auto& n : r.unmapped_tensors) std::cout << "unmapped    " << n << "\n";
  for (const auto& t : r.tensors) {
    std::cout << "tensor  " << t.name << "  " << t.type << "  " << shape_to_string(t.shape) << "  "
              << t.bytes << "\n";
  }
}

int inspect_gguf_command(const std::string& path, bool json) {
  auto report = inspect_gguf_path(path);
  if (!report.ok()) {
    std::cerr << "flashserve inspect: " << report.status().to_string() << "\n";
    return 1;
  }
  if (json) {
    std::cout << gguf_json(*report).dump(2) << "\n";
  } else {
    print_gguf_text(*report);
  }
  return 0;
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
  cmd->add_option(
         "--model", opts->model,
         "Model folder (config.json + safetensors), or a GGUF file (any part of a split set)")
      ->required();
  cmd->add_flag("--json", opts->json, "Print one JSON object");
  cmd->callback([opts, &action] {
    action = [opts] {
      const auto& m = opts->model;
      const bool gguf_name = m.size() > 5 && m.compare(m.size() - 5, 5, ".gguf") == 0;
      if (gguf_name || is_gguf_file(m)) return inspect_gguf_command(m, opts->json);
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
