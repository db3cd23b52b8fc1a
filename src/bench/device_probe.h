// What the bench asks the device directly: free memory (to size --layers) and the
// device-to-device copy bandwidth, the ceiling decode is compared with.
#pragma once

#include <cstddef>

#include "util/status.h"

namespace fs::bench {

// Free bytes on the current CUDA device; an error without CUDA.
Expected<std::size_t> device_free_bytes();

// cudaMemcpyAsync device-to-device of `bytes`, best of `repeats`, as (read + write) bytes per
// second, the convention under which an H200 copies at about 4.2-4.3 TB/s.
Expected<double> copy_bandwidth(std::size_t bytes, int repeats);

// The profiler's collection range (cudaProfilerStart/Stop): the bench brackets the first
// context's timed autoregressive run with it, so `ncu --profile-from-start off flashserve bench
// ...` sees only decode steps. Without a profiler attached (or without CUDA) they do nothing.
void profiler_range_begin();
void profiler_range_end();

}  // namespace fs::bench
