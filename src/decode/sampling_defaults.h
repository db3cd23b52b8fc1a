// The sampling a model's release recommends, from the generation_config.json beside its weights
// (HF GenerationConfig's temperature, top_p, top_k, min_p, repetition_penalty, do_sample): the
// values `serve` and `run`
// use for whatever a request or the command line leaves unset, as vLLM does by default. The
// released Flash models ask for sampling (greedy decoding of a thinking model can loop), so a
// client that sends no temperature should get the release's, not greedy.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "decode/sampler.h"
#include "util/status.h"

namespace fs {

struct SamplingDefaults {
  std::optional<double> temperature;  // 0 when the file says do_sample: false
  std::optional<double> top_p;
  std::optional<std::int32_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;

  bool empty() const { return !temperature && !top_p && !top_k && !min_p && !repetition_penalty; }
  // `base` with each field the file sets.
  SamplerConfig over(SamplerConfig base) const;
  // "temperature 0.7, top_p 0.8, top_k 20" (the fields set), or "none".
  std::string describe() const;
};

// The defaults of `model` (a folder; a GGUF file or a folder without generation_config.json has
// none). A field of the wrong type or outside the sampler's range is an error naming the file and
// the field, as a request with it would be refused.
Expected<SamplingDefaults> read_sampling_defaults(const std::string& model);

}  // namespace fs
