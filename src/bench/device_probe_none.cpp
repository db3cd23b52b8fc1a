// Builds without CUDA: the bench's device probes say so.
#include "bench/device_probe.h"

namespace fs::bench {

Expected<std::size_t> device_free_bytes() {
  return unsupported("bench: flashserve was built without CUDA");
}

Expected<double> copy_bandwidth(std::size_t, int) {
  return unsupported("bench: flashserve was built without CUDA");
}

void profiler_range_begin() {}
void profiler_range_end() {}

}  // namespace fs::bench
