#include "model/common/hyper_connection.h"

namespace fs {

void hyper_connection_read(Backend& be, const HyperConnectionWeights& w, const Tensor& h,
                           Tensor& mixed, Tensor* inject) {
  // One backend op (Backend::hyper_connection_read: norm, the two low-rank products with their
  // activations, the stream mix and the injection gates).
  be.hyper_connection_read(h, w.norm, w.mix_down, w.mix_up, w.inject, w.streams, w.width, w.eps,
                           mixed, inject);
}

void project_into_streams(Backend& be, const Tensor& x, const Weight& w, const StreamsWrite& out) {
  be.linear_into_streams(x, w, out);
}

}  // namespace fs
