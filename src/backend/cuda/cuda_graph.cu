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
  for (auto& g : kept_) destroy(*g);
}

void StepGraphs::destroy(StepGraph& g) {
  // Its last launch must finish before its pinned buffers go (cudaFreeHost of memory a queued
  // copy still reads is undefined); the device blocks go back to the pool, whose later users are
  // ordered after the launch on the one stream.
  if (g.done != nullptr) {
    cudaEventSynchronize(g.done);
    cudaEventDestroy(g.done);
    g.done = nullptr;
  }
  if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  g.exec = nullptr;
  memory_.free_arena(g.arena);
  if (g.params_dev != nullptr) memory_.release(g.params_dev, kStepScalars * sizeof(std::int64_t));
  g.params_dev = nullptr;
  if (g.params_host != nullptr) cudaFreeHost(g.params_host);
  g.params_host = nullptr;
  g.staging.clear();
  g.staging_extra.clear();
  g.staging_block.reset();
}

StepGraph* StepGraphs::find(const Backend::StepGraphKey& key) {
  for (auto& g : kept_) {
    if (g->exec != nullptr && g->key == key) {
      g->last_used = ++clock_;
      return g.get();
    }
  }
  return nullptr;
}

Expected<StepGraph*> StepGraphs::create(const Backend::StepGraphKey& key) {
  if (kept_.size() >= kKept) {
    const auto lru = std::min_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
      return a->last_used < b->last_used;
    });
    destroy(**lru);
    kept_.erase(lru);
    ++stats_.evictions;
  }
  auto g = std::make_unique<StepGraph>();
  g->key = key;
  g->last_used = ++clock_;
  constexpr auto bytes = kStepScalars * sizeof(std::int64_t);
  if (const auto e = cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming); e != cudaSuccess)
    return graph_error("create event", e);
  void* host = nullptr;
  if (const auto e = cudaHostAlloc(&host, bytes, cudaHostAllocDefault); e != cudaSuccess) {
    destroy(*g);
    return graph_error("parameter block", e);
  }
  g->params_host = static_cast<std::int64_t*>(host);
  std::fill(g->params_host, g->params_host + kStepScalars, 0);
  void* staging = nullptr;
  if (const auto e = cudaHostAlloc(&staging, kStepStagingBytes, cudaHostAllocDefault);
      e != cudaSuccess) {
    destroy(*g);
    return graph_error("staging", e);
  }
  g->staging_block.reset(staging);
  g->params_dev = static_cast<std::int64_t*>(memory_.allocate(bytes));
  if (g->params_dev == nullptr) {
    destroy(*g);
    return out_of_range("cuda: step graph: out of device memory for the parameter block");
  }
  kept_.push_back(std::move(g));
  return kept_.back().get();
}

void StepGraphs::drop(StepGraph* g) {
  const auto it =
      std::find_if(kept_.begin(), kept_.end(), [&](const auto& p) { return p.get() == g; });
  if (it == kept_.end()) return;
  destroy(**it);
  kept_.erase(it);
}

}  // namespace fs::cuda
