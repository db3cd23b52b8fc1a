// Synthetic weights with a config's shapes, generated where the backend computes (GPU: by a
// kernel), so a benchmark runs the production model code without a checkpoint. Values keep the
// activations finite through any depth: matrices uniform in +-1/sqrt(fan_in), (1+w) norm weights
// near 0 (scale near 1), gated-norm weights near 1, decay rates in [-2, -0.5]. The PLE n-gram
// table stays in host memory, as a loaded model's does.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "bench/decode_bytes.h"
#include "bench/weight_mix.h"
#include "model/qwen_next/config.h"
#include "model/qwen_next/weights.h"
#include "tensor/tensor.h"
#include "util/status.h"

namespace fs::bench {

// Owns every buffer the weights view; must outlive the model built on them.
class SyntheticWeightStore {
 public:
  SyntheticWeightStore(std::shared_ptr<Memory> device, std::uint64_t seed)
      : device_(std::move(device)), seed_(seed) {}
  // A matrix in device memory as `dtype`, uniform in +-scale; kF8E4M3 makes a block-scaled FP8
  // matrix (e4m3 codes and f32 128x128-block scales, both generated where they live).
  Weight matrix(Shape shape, DType dtype, float scale);
  // A matrix stored as `storage`: elements as above, or a packed format's bytes (bench/fill.h
  // fill_packed) with FP4's E8M0 scales beside them.
  Weight matrix(Shape shape, const MatrixStorage& storage, float scale);
  // An f32 vector (or filter) in device memory, offset + uniform in +-scale.
  Weight vector(Shape shape, float scale, float offset);
  // A bf16 table in host memory, uniform in +-scale.
  Weight host_table(Shape shape, float scale);
  // The first failure (allocation, fill), ok when none.
  const Status& status() const { return status_; }
  std::size_t device_bytes() const { return device_bytes_; }
  std::size_t host_bytes() const { return host_bytes_; }

 private:
  Weight keep(Tensor t, float scale, float offset);
  Weight packed(Shape shape, quant::QuantType q, float scale);

  std::shared_ptr<Memory> device_;
  std::uint64_t seed_;
  std::vector<std::unique_ptr<Tensor>> buffers_;
  std::size_t device_bytes_ = 0, host_bytes_ = 0;
  Status status_;
};

// Every weight of the trunk and the MTP head (one QSA + MoE layer) for `c`, matrices stored as
// `mix` says (bench/weight_mix.h), laid out as load_qwen_next_weights + upload_qwen_next_weights
// leave them.
Expected<QwenNextWeights> synthetic_qwen_next_weights(const QwenNextConfig& c,
                                                      SyntheticWeightStore& store,
                                                      const WeightMix& mix);

// Device bytes of one decoder layer of each kind (MoE included), of the MTP head, and of the
// embedding + lm_head + final mixer, for sizing `--layers` before anything is allocated.
struct WeightBudget {
  std::size_t linear_layer = 0, qsa_layer = 0, mtp = 0, fixed = 0;
};
WeightBudget weight_budget(const QwenNextConfig& c, const MatrixBytes& matrix_bytes);

}  // namespace fs::bench
