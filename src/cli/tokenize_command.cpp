// flashserve tokenize --tokenizer DIR (--text T | --file F) [--json]
// flashserve detokenize --tokenizer DIR --ids 1,2,3 [--skip-special]
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "tokenizer/metadata.h"
#include "util/mapped_file.h"

namespace fs::cli {
namespace {

void print_ids(std::ostream& out, const std::vector<TokenId>& ids) {
  out << '[';
  for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
  out << ']';
}

Expected<std::vector<TokenId>> parse_id_list(const std::string& text) {
  std::vector<TokenId> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto id = parse_token_id(item);
    if (!id) return invalid_argument("--ids: '" + item + "' is not a token id");
    ids.push_back(*id);
  }
  return ids;
}

int fail(const char* command, const Status& s) {
  std::cerr << "flashserve " << command << ": " << s.to_string() << "\n";
  return 1;
}

}  // namespace

void add_tokenize_command(CLI::App& app, Action& action) {
  struct Options {
    std::string tokenizer, text, file;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("tokenize", "Token ids of raw text (no special tokens added), as JSON");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "Folder with tokenizer.json, or a GGUF model file")
      ->required();
  auto* text = cmd->add_option("--text", opts->text, "The text to encode");
  auto* file = cmd->add_option(
      "--file", opts->file, "A JSON file holding a list of strings; prints one array per string");
  text->excludes(file);
  cmd->add_flag("--json", opts->json, "JSON output (always on: the output is a JSON array)");
  cmd->callback([opts, &action, text, file] {
    action = [opts, text, file] {
      if (text->count() == 0 && file->count() == 0)
        return fail("tokenize", invalid_argument("give --text or --file"));
      auto bundle = load_tokenizer_dir(opts->tokenizer);
      if (!bundle.ok()) return fail("tokenize", bundle.status());
      if (text->count()) {
        auto ids = bundle->tokenizer.encode(opts->text);
        if (!ids.ok()) return fail("tokenize", ids.status());
        print_ids(std::cout, *ids);
        std::cout << "\n";
        return 0;
      }
      auto content = read_text_file(opts->file, 1u << 30);
      if (!content.ok()) return fail("tokenize", content.status());
      nlohmann::json list;
      try {
        list = nlohmann::json::parse(*content);
      } catch (const nlohmann::json::parse_error& e) {
        return fail("tokenize", invalid_argument(opts->file + ": not valid JSON: " + e.what()));
      }
      if (!list.is_array())
        return fail("tokenize", invalid_argument(opts->file + ": expected a JSON list of strings"));
      std::ostringstream out;
      out << "[\n";
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (!list[i].is_string()) {
          return fail("tokenize", invalid_argument(opts->file + ": item " + std::to_string(i) +
                                                   " is not a string"));
        }
        auto ids = bundle->tokenizer.encode(list[i].get_ref<const std::string&>());
        if (!ids.ok())
          return fail("tokenize",
                      ids.status().with_context(opts->file + " item " + std::to_string(i)));
        print_ids(out, *ids);
        out << (i + 1 < list.size() ? ",\n" : "\n");
      }
      out << "]\n";
      std::cout << out.str();
      return 0;
    };
  });
}

void add_detokenize_command(CLI::App& app, Action& action) {
  struct Options {
    std::string tokenizer, ids;
    bool skip_special = false;
  };
  auto opts = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("detokenize", "The text of a list of token ids");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "Folder with tokenizer.json, or a GGUF model file")
      ->required();
  cmd->add_option("--ids", opts->ids, "Comma-separated token ids")->required();
  cmd->add_flag("--skip-special", opts->skip_special, "Leave out special tokens");
  cmd->callback([opts, &action] {
    action = [opts] {
      auto ids = parse_id_list(opts->ids);
      if (!ids.ok()) return fail("detokenize", ids.status());
      auto bundle = load_tokenizer_dir(opts->tokenizer);
      if (!bundle.ok()) return fail("detokenize", bundle.status());
      auto text = bundle->tokenizer.decode(*ids, opts->skip_special);
      if (!text.ok()) return fail("detokenize", text.status());
      // Exactly the text, no newline added, so scripts can compare bytes.
      std::cout << *text;
      return 0;
    };
  });
}

}  // namespace fs::cli
