#include "backend/cuda/cuda_graph.h"

#include <algorithm>
#include <string>

namespace fs::cuda {
namespace {

Status graph_error(const char* what, cudaError_t e) {
  cudaGetLastError();  // graph API errors are not sticky; keep them out of the next op's check
  return internal_error(std::string("cuda: step graph: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

StepGraphs::~StepGraphs() {
  // An executable still running is freed when it completes (cudaGraphExecDestroy's contract).
  for (auto& k : kept_) {
    if (k.exec != nullptr) cudaGraphExecDestroy(k.exec);
  }
}

Status StepGraphs::launch(cudaGraph_t graph, std::int64_t shape, cudaStream_t stream) {
  std::size_t nodes = 0;
  if (const auto e = cudaGraphGetNodes(graph, nullptr, &nodes); e != cudaSuccess)
    return graph_error("count nodes", e);
  auto it = std::find_if(kept_.begin(), kept_.end(),
                         [&](const Kept& k) { return k.shape == shape && k.nodes == nodes; });
  bool updated = false;
  if (it != kept_.end()) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(it->exec, graph, &info) == cudaSuccess) {
      updated = true;
    } else {
      // Same node count, other topology or a parameter an update cannot change: rebuild it.
      cudaGetLastError();
      cudaGraphExecDestroy(it->exec);
      it->exec = nullptr;
    }
  } else {
    if (kept_.size() < kKept) {
      kept_.push_back({});
      it = kept_.end() - 1;
    } else {
      it = std::min_element(kept_.begin(), kept_.end(),
                            [](const Kept& a, const Kept& b) { return a.last_used < b.last_used; });
      cudaGraphExecDestroy(it->exec);
      it->exec = nullptr;
    }
    it->shape = shape;
    it->nodes = nodes;
  }
  if (!updated) {
    if (const auto e = cudaGraphInstantiate(&it->exec, graph, 0); e != cudaSuccess) {
      it->exec = nullptr;
      kept_.erase(it);
      return graph_error("instantiate", e);
    }
  }
  it->last_used = ++clock_;
  if (const auto e = cudaGraphLaunch(it->exec, stream); e != cudaSuccess)
    return graph_error("launch", e);
  ++stats_.launches;
  ++(updated ? stats_.updates : stats_.instantiations);
  return {};
}

}  // namespace fs::cuda
