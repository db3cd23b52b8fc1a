// Hyper-connections over `streams` residual streams ("GatedResidual", Q4M 1003-1031): a sublayer
// reads a gated mean of the normalised streams and writes its output back into every stream with
// its own scale. Also used (without injection) as the final mixer in place of a final norm.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace fs {

struct HyperConnectionWeights {
  Weight norm;      // [streams*width], grouped (1+w) RMSNorm
  Weight mix_down;  // [rank, streams*width]
  Weight mix_up;    // [streams*width, rank]
  Weight inject;    // [streams, streams*width]; empty for the final mixer
  std::int64_t streams = 0;
  std::int64_t width = 0;
  float eps = 1e-6f;
};

// mixed [S, width] = mean_s(sigmoid(up(silu(down(Xn)/hc))) * Xn), Xn = hc_norm(h);
// inject [S, streams] = 2*sigmoid(inject(Xn)/hc) when `inject` is not null.
void hyper_connection_read(Backend& be, const HyperConnectionWeights& w, const Tensor& h,
                           Tensor& mixed, Tensor* inject);
// The write, h[:, s] += inject[:, s] * y (h is the un-normalised input of the read), is a
// StreamsWrite{h, inject} (backend.h) handed to the sublayer: its last op writes its output into
// the streams (Backend::linear_into_streams, moe_block_into_streams), one kernel on a GPU.
// y = x · w^T written into the streams.
void project_into_streams(Backend& be, const Tensor& x, const Weight& w, const StreamsWrite& out);

}  // namespace fs
