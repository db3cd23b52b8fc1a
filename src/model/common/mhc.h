// Manifold-constrained hyper-connections (mHC; Xie et al. 2026), as DeepSeek V4
// Flash (modeling_deepseek_v4.py 867-963) and GLM 5.3 Flash
// (modeling_glm5_next.py 220-303) use them: H parallel residual streams; each
// sublayer reads a `pre`-weighted collapse of the streams and writes back `post
// * y + comb^T · streams`, comb projected by Sinkhorn-Knopp onto the doubly
// stochastic matrices (the "manifold" that keeps the residual mixing
// norm-preserving).
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace fs {

// One site (the attention's or the FFN's) of one layer.
struct MhcWeights {
  Weight fn;                 // [(2+H)*H, H*D] f32: the mix logits of pre, post and comb
  Weight base;               // [(2+H)*H]
  Weight scale;              // [3]: pre, post, comb
  std::int64_t streams = 0;  // H
  std::int64_t width = 0;    // D
  float norm_eps = 1e-6f;    // the unweighted RMSNorm over H*D (rms_norm_eps)
  float hc_eps = 1e-6f;
  std::int64_t sinkhorn_iters = 20;
};

// A site's write-back weights, from its read.
struct MhcMix {
  Tensor post;  // [S, H]
  Tensor comb;  // [S, H*H], comb[j*H + k]: stream j's share of new stream k
};

// DeepSeek V4's final collapse (DeepseekV4HyperHead): a `pre`-weighted sum with
// its own mix.
struct MhcHeadWeights {
  Weight fn;     // [H, H*D]
  Weight base;   // [H]
  Weight scale;  // [1]
  std::int64_t streams = 0;
  std::int64_t width = 0;
  float norm_eps = 1e-6f;
  float hc_eps = 1e-6f;
};

// h [S, H*D] (a token's H streams side by side). collapsed [S, D] = sum_j
// pre[j] * h[j]; `mix` gets post and comb for the site's write.
void mhc_read(Backend& be, const MhcWeights& w, const Tensor& h, Tensor& collapsed, MhcMix& mix);
// h[k] <- post[k] * y + sum_j comb[j, k] * h[j], in place (y [S, D], the
// sublayer's output).
void mhc_write(Backend& be, const MhcMix& mix, const Tensor& y, Tensor& h);
// out [S, D]: DeepSeek V4's hyper head. (GLM 5.3 collapses with a plain
// Backend::stream_mean.)
void mhc_head(Backend& be, const MhcHeadWeights& w, const Tensor& h, Tensor& out);

}  // namespace fs
