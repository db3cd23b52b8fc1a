// RECONSTRUCTED by the glm5 helper at 18:10 UTC after it overwrote this file by accident (a `cd`
// that did not apply): rebuilt from mhc.cpp and notes/shared_api.md. Please check it against
// your own copy.
//
// Manifold-constrained hyper-connections (DS V4 M:867-963, GLM M:220-303).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace fs {

struct MhcWeights {                     // one site (attn_hc or ffn_hc) of one layer
  Weight fn;                            // [(2+H)*H, H*D] f32
  Weight base;                          // [(2+H)*H]
  Weight scale;                         // [3]
  std::int64_t streams = 0, width = 0;  // H, D
  float norm_eps = 1e-6f;               // rms_norm_eps (the unweighted RMSNorm over H*D)
  float hc_eps = 1e-6f;
  std::int64_t sinkhorn_iters = 20;
};
struct MhcMix {
  Tensor post;  // [S, H] f32
  Tensor comb;  // [S, H*H] f32, comb[s, j*H+k]
};
// h [S, H*D]. collapsed [S, D] = sum_h pre[s,h]*h[s,h,:]; mix gets post and the
// Sinkhorn-normalised comb.
void mhc_read(Backend& be, const MhcWeights& w, const Tensor& h, Tensor& collapsed, MhcMix& mix);
// h[s,k,:] <- post[s,k]*y[s,:] + sum_j comb[s,j,k]*h[s,j,:]   (in place)
void mhc_write(Backend& be, const MhcMix& mix, const Tensor& y, Tensor& h);

struct MhcHeadWeights {
  Weight fn;     // [H, H*D]
  Weight base;   // [H]
  Weight scale;  // [1]
  std::int64_t streams = 0, width = 0;
  float norm_eps = 1e-6f, hc_eps = 1e-6f;
};
// DS V4's final collapse (DeepseekV4HyperHead). GLM uses be.stream_mean(h, H, out).
void mhc_head(Backend& be, const MhcHeadWeights& w, const Tensor& h, Tensor& out);

}  // namespace fs
