// libFuzzer target: a session checkpoint file through parse_checkpoint and, when it parses,
// load_checkpoint against the toy model (written to a temporary file, since the loader maps a
// path). A loaded state must satisfy its invariant and the sizes the model gives it.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>

#include "session/checkpoint.h"
#include "toy_model.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> file(data, size);
  if (!fs::parse_checkpoint(file).ok()) return 0;
  static fs::test::ToyModel model;
  static const std::string path = "/tmp/fuzz_checkpoint." + std::to_string(::getpid()) + ".fsck";
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    std::fwrite(data, 1, size, f);
    std::fclose(f);
  }
  const fs::CheckpointIdentity id{fs::Family::kQwenNext, "toy-model-1", 0,
                                  fs::kEnginePolicyVersion};
  auto loaded = fs::load_checkpoint(path, model, id);
  if (loaded.ok()) {
    const auto& s = loaded->state;
    if (!s.check_invariant().ok()) __builtin_trap();
    if (!s.tokens.empty() &&
        static_cast<std::int64_t>(s.next_logits.size()) != model.info().vocab_size)
      __builtin_trap();
    if (!s.tokens.empty() &&
        static_cast<std::int64_t>(s.last_hidden.size()) != model.mtp()->hidden_width())
      __builtin_trap();
  }
  return 0;
}
