#include "model/common/mhc.h"

namespace fs {

void mhc_read(Backend& be, const MhcWeights& w, const Tensor& h, Tensor& collapsed, MhcMix& mix) {
  // The mix logits from the raw streams; mhc_weights applies the row's RMSNorm scalar to them.
  Tensor m, pre;
  be.linear(h, w.fn, m);
  be.mhc_weights(h, m, w.base, w.scale, w.streams, w.norm_eps, w.hc_eps, w.sinkhorn_iters, pre,
                 &mix.post, &mix.comb);
  be.weighted_stream_sum(h, pre, collapsed);
}

void mhc_write(Backend& be, const MhcMix& mix, const Tensor& y, Tensor& h) {
  be.mhc_expand(h, y, mix.post, mix.comb);
}

void mhc_head(Backend& be, const MhcHeadWeights& w, const Tensor& h, Tensor& out) {
  Tensor m, pre;
  be.linear(h, w.fn, m);
  be.mhc_weights(h, m, w.base, w.scale, w.streams, w.norm_eps, w.hc_eps, 0, pre, nullptr, nullptr);
  be.weighted_stream_sum(h, pre, out);
}

}  // namespace fs
