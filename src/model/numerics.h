// Which arithmetic a model computes with (issue 16). kHf: the HF reference's plain fp32 (the
// default; the parity fixtures are HF's). kOfficial: the official DeepSeek V4 graph's
// quantisation simulations on top (FP8 on the KV rows' non-RoPE dims, Hadamard + FP4 on the
// indexer; model/deepseek_v4/numerics.h), as ds4 computes; only DeepSeek V4 has it. States
// computed under one are never resumed under the other (session/checkpoint.h
// state_fingerprint).
#pragma once

#include <string>

#include "util/status.h"

namespace fs {

enum class Numerics { kHf, kOfficial };

inline std::string numerics_name(Numerics n) {
  return n == Numerics::kOfficial ? "official" : "hf";
}

inline Expected<Numerics> parse_numerics(const std::string& s) {
  if (s == "hf") return Numerics::kHf;
  if (s == "official") return Numerics::kOfficial;
  return invalid_argument("unknown --numerics '" + s + "' (expected hf or official)");
}

}  // namespace fs
