// flashserve convert --model DIR [--dtype bf16|f32] [--quantize fp8|fp4] [--split-ngram-parts N]
//                    --out DIR2
#include <iostream>

#include "cli/commands.h"
#include "model/convert.h"

namespace fs::cli {

void add_convert_command(CLI::App& app, Action& action) {
  struct Options {
    std::string model, dtype, quantize, out;
    std::int64_t parts = 0;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd =
      app.add_subcommand("convert", "Rewrite a checkpoint (dtype, FP8, PLE table sharding)");
  cmd->add_option("--model", opt->model, "Model folder")->required();
  cmd->add_option("--dtype", opt->dtype, "bf16 or f32 for every float tensor");
  cmd->add_option("--quantize", opt->quantize,
                  "fp8: projections to FP8 E4M3 with 128x128 block scales (the official FP8 "
                  "releases' layout); fp4: DeepSeek V4's official release layout (FP8 E4M3 "
                  "projections with E8M0 scales, FP4 E2M1 routed experts, the release's names)");
  cmd->add_option("--split-ngram-parts", opt->parts, "Split PLE n-gram tables into N row shards");
  cmd->add_option("--out", opt->out, "Output folder")->required();
  cmd->callback([opt, &action] {
    action = [opt]() -> int {
      ConvertOptions o;
      if (opt->dtype == "bf16" || opt->dtype == "BF16")
        o.dtype = DType::kBF16;
      else if (opt->dtype == "f32" || opt->dtype == "F32")
        o.dtype = DType::kF32;
      else if (!opt->dtype.empty()) {
        std::cerr << "flashserve convert: --dtype must be bf16 or f32, not '" << opt->dtype
                  << "'\n";
        return 1;
      }
      if (opt->parts > 0) o.split_ngram_parts = opt->parts;
      if (opt->quantize == "fp8") {
        o.quantize_fp8 = true;
      } else if (opt->quantize == "fp4") {
        o.quantize_fp4 = true;
      } else if (!opt->quantize.empty()) {
        std::cerr << "flashserve convert: --quantize must be fp8 or fp4, not '" << opt->quantize
                  << "'\n";
        return 1;
      }
      if (auto s = convert_checkpoint(opt->model, opt->out, o); !s.ok()) {
        std::cerr << "flashserve convert: " << s.to_string() << "\n";
        return 1;
      }
      return 0;
    };
  });
}

}  // namespace fs::cli
