// Executable graphs of the decode step (DESIGN "On the GPU" rule 5), kept across steps.
//
// Every step is captured afresh (the token, the position and the cache lengths are kernel
// arguments), so a captured graph differs from the last step's only in node parameters, except on
// the steps whose op sequence differs (a QSA block completed, a cache regrown, the first warm
// step). Building an executable graph costs far more than updating one, so a few executables are
// kept, keyed by the step's shape (its token count: a one-token step and a 4-row verify run other
// kernels) and the captured graph's node count; a step updates the one of its count in place
// (cudaGraphExecUpdate) and instantiates only when none fits or the update is refused.
#pragma once

// See cuda_backend.h: nvcc's warning 2810 on discarded [[nodiscard]] class values.
#pragma nv_diag_suppress 2810

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "util/status.h"

namespace fs::cuda {

class StepGraphs {
 public:
  StepGraphs() = default;
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Updates (or builds) an executable graph from `graph`, recorded for a step of `shape`, and
  // launches it on `stream`; the caller still owns `graph`.
  Status launch(cudaGraph_t graph, std::int64_t shape, cudaStream_t stream);
  const Backend::StepGraphStats& stats() const { return stats_; }

 private:
  struct Kept {
    std::int64_t shape = 0;
    std::size_t nodes = 0;
    cudaGraphExec_t exec = nullptr;
    std::uint64_t last_used = 0;
  };
  // Executables kept: a decode step alternates between a few op sequences (plain step, block
  // completed; a regrowth is one step), and MTP adds the verify width: eight cover it.
  static constexpr std::size_t kKept = 8;
  std::vector<Kept> kept_;
  std::uint64_t clock_ = 0;
  Backend::StepGraphStats stats_;
};

}  // namespace fs::cuda
