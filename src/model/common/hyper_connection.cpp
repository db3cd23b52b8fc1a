#include "model/common/hyper_connection.h"

namespace fs {

void hyper_connection_read(Backend& be, const HyperConnectionWeights& w, const Tensor& h,
                           Tensor& mixed, Tensor* inject) {
  const float inv_streams = 1.0f / static_cast<float>(w.streams);
  Tensor xn, u;
  be.rms_norm(h, w.norm, w.width, w.eps, /*unit_offset=*/true, xn);
  be.linear(xn, w.mix_down, u);
  be.scale(u, inv_streams);
  be.activate(u, Activation::kSilu);
  be.stream_mix(xn, u, w.mix_up, w.streams, mixed);
  if (inject != nullptr) {
    be.linear(xn, w.inject, *inject);
    be.scale(*inject, inv_streams);
    be.activate(*inject, Activation::kSigmoid);
    be.scale(*inject, 2.0f);
  }
}

void hyper_connection_write(Backend& be, Tensor& h, const Tensor& y, const Tensor& inject) {
  be.add_scaled_streams(h, y, inject);
}

}  // namespace fs
