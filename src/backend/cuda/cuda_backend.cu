// The CUDA backend's construction, weight upload, embeddings and shared helpers.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#include "tensor/quant/iq2_xxs_grid.h"

namespace fs {
namespace cuda {

namespace {
// A switch that is on unless its variable is "0", read once per process.
bool on_unless_zero(const char* var) {
  const char* v = std::getenv(var);
  return v == nullptr || std::strcmp(v, "0") != 0;
}
}  // namespace

bool overlap_enabled() {
  static const bool on = on_unless_zero("FLASHSERVE_CUDA_OVERLAP");
  return on;
}

namespace {

// What the launch helpers ask of the GPUs, queried once a process over every visible device (a
// launch must not pay a query): the lowest compute capability major and the smallest opt-in
// shared memory, so a machine of mixed GPUs is served by its smallest.
struct DeviceFacts {
  int major = 0;
  std::size_t shared_limit = 0;
  std::int64_t multiprocessors = 132;  // an H200's, where nothing could be asked
};

DeviceFacts query_device_facts() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return {};  // nothing overlapped, no opt-in: the ordinary launches, the kernels' fallbacks
  }
  DeviceFacts f{
      .major = 1 << 30, .shared_limit = ~std::size_t{0}, .multiprocessors = std::int64_t{1} << 30};
  for (int d = 0; d < count; ++d) {
    int major = 0, optin = 0, sms = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, d) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    f.major = std::min(f.major, major);
    f.shared_limit = std::min(f.shared_limit, static_cast<std::size_t>(optin));
    f.multiprocessors = std::min<std::int64_t>(f.multiprocessors, sms);
  }
  return f;
}

const DeviceFacts& device_facts() {
  static const DeviceFacts facts = query_device_facts();
  return facts;
}

// A kernel of this build's own module, asked which virtual architecture its code was compiled
// for (it never runs).
__global__ void compiled_arch_probe_kernel() {}

// The virtual architecture (major * 10 + minor) of the device code the GPUs run: the sm_90a
// machine code's 90, or, where the driver compiled an 80-virtual build's PTX for a newer GPU, 80.
// Every module of the build is compiled for the same list, so this kernel speaks for all of them.
int compiled_arch() {
  cudaFuncAttributes a{};
  if (cudaFuncGetAttributes(&a, compiled_arch_probe_kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return a.ptxVersion;
}

}  // namespace

bool overlapped_launches() {
  // The GPU must take the launch attribute (compute capability 9.0) and the kernels must have
  // been compiled with the wait it needs (wait_for_inputs is griddepcontrol.wait only where
  // __CUDA_ARCH__ >= 900). An 80-virtual build on a Hopper or Blackwell GPU has the first
  // without the second: its kernels, launched overlapped, could read their inputs before the
  // kernel before them had made them visible: GLM 5 and DeepSeek V4's split prefills diverged
  // on an H100 in session 29, and with this rule the PTX build passes every suite (session 30).
  static const bool on = overlap_enabled() && device_facts().major >= 9 && compiled_arch() >= 90;
  return on;
}

std::int64_t multiprocessors() {
  return device_facts().multiprocessors;
}

std::int64_t resident_blocks(const void* kernel, int threads, std::size_t smem) {
  // Asked at launch time, several times a step: the calculator's answer kept per (kernel, size).
  static std::mutex mutex;
  static std::map<std::pair<const void*, std::size_t>, std::int64_t> known;
  const std::lock_guard lock(mutex);
  const auto key = std::make_pair(kernel, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 1;
  }
  return known[key] = std::max(n, 1);
}

unsigned streamed_grid(const void* kernel, int threads, std::size_t smem, std::int64_t units,
                       std::int64_t min_blocks) {
  const auto resident = resident_blocks(kernel, threads, smem);
  if (resident < min_blocks) return 0;
  const std::int64_t warps = threads / 32;
  return static_cast<unsigned>(
      std::clamp<std::int64_t>((units + warps - 1) / warps, 1, resident * multiprocessors()));
}

std::size_t shared_memory_limit() {
  std::size_t limit = device_facts().shared_limit;
  // Read at every call (they are few: a kernel's first launch, a prefill's tile choice), so a
  // test can lower it and raise it again.
  if (const char* v = std::getenv("FLASHSERVE_CUDA_SHARED_LIMIT"); v != nullptr && *v != '\0')
    limit = std::min<std::size_t>(limit, std::strtoull(v, nullptr, 10));
  return limit;
}

bool staged_x_enabled() {
  static const bool on = on_unless_zero("FLASHSERVE_CUDA_STAGE_X");
  return on;
}

bool moe_block_enabled() {
  static const bool on = on_unless_zero("FLASHSERVE_CUDA_MOE_BLOCK");
  return on;
}

namespace {

constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;
constexpr std::size_t kUploadChunk = std::size_t{16} << 20;  // elements converted per step

std::string cuda_message(const char* what, cudaError_t e) {
  return std::string("cuda: ") + what + ": " + cudaGetErrorString(e);
}

// dst[i] = src[i] converted (f32 <-> bf16, or a copy).
template <typename Src, typename Dst>
__global__ void convert_kernel(const Src* src, Dst* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = widen(src[i]);
    if constexpr (sizeof(Dst) == 2) {
      dst[i] = narrow_bf16(v);
    } else {
      dst[i] = v;
    }
  }
}

// One row of an embedding: where it is read from (a device shard row, or a host-gathered row
// copied into the scratch) and its element type.
struct EmbedRow {
  const void* src;
  std::int32_t bf16;
  std::int32_t pad;
};

// Bytes a host row takes in the staging: bf16 kept, anything else widened to f32; 16-aligned.
std::size_t staged_row_bytes(DType t, std::int64_t cols) {
  const auto bytes = static_cast<std::size_t>(cols) * (t == DType::kBF16 ? 2 : 4);
  return (bytes + 15) / 16 * 16;
}

__global__ void embedding_kernel(const EmbedRow* rows, std::int64_t cols, float* out) {
  const EmbedRow r = rows[blockIdx.x];
  float* o = out + blockIdx.x * cols;
  if (r.bf16 != 0) {
    const auto* s = static_cast<const bf16_bits*>(r.src);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = widen(s[c]);
  } else {
    const auto* s = static_cast<const float*>(r.src);
    for (std::int64_t c = threadIdx.x; c < cols; c += blockDim.x) o[c] = s[c];
  }
}

}  // namespace

// --- HostStaging ---------------------------------------------------------------------------------

HostStaging::~HostStaging() {
  for (auto& s : slots_) {
    if (s.done != nullptr) {
      cudaEventSynchronize(s.done);
      cudaEventDestroy(s.done);
    }
    if (s.data != nullptr) cudaFreeHost(s.data);
  }
}

bool HostStaging::reserve(Slot& s, std::size_t bytes) {
  if (s.capacity >= bytes) return true;
  const auto want = std::max<std::size_t>({bytes, kMinBytes, s.capacity * 2});
  if (s.data != nullptr) cudaFreeHost(s.data);
  s.data = nullptr;
  s.capacity = 0;
  if (cudaHostAlloc(&s.data, want, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    s.data = nullptr;
    return false;
  }
  s.capacity = want;
  return true;
}

void* HostStaging::acquire(std::size_t bytes) {
  Slot& s = slots_[next_];
  if (s.done == nullptr) {
    if (cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming) != cudaSuccess) return nullptr;
  } else if (cudaEventSynchronize(s.done) != cudaSuccess) {
    return nullptr;
  }
  if (!reserve(s, bytes)) return nullptr;
  return s.data;
}

cudaError_t HostStaging::submitted(cudaStream_t stream) {
  const auto e = cudaEventRecord(slots_[next_].done, stream);
  next_ = (next_ + 1) % kSlots;
  return e;
}

// --- construction --------------------------------------------------------------------------------

CudaBackend::CudaBackend(std::shared_ptr<CudaMemory> memory) noexcept
    : memory_(memory), cuda_memory_(memory.get()), graphs_(*memory) {}

namespace {

__global__ void probe_kernel() {}

// The list the build compiled for (src/backend/cuda/CMakeLists.txt defines it for this file).
constexpr const char* kArchsBuilt = FLASHSERVE_CUDA_ARCHS_BUILT;

// Whether this build runs on `device` (current): compute capability 8.0 or later (the bf16
// tensor-core products, cp.async), and kernels compiled for it, as machine code or as PTX the
// driver can compile. Every kernel is built for the same list (cmake/cuda_archs.cmake), so one
// kernel's image answers for all.
Status check_device_supported(int device) {
  cudaDeviceProp p{};
  if (const auto e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) {
    (void)cudaGetLastError();
    return internal_error(cuda_message("device properties", e));
  }
  const std::string gpu = "CUDA device " + std::to_string(device) + " (" + p.name +
                          ", compute capability " + std::to_string(p.major) + "." +
                          std::to_string(p.minor) + ")";
  if (p.major < 8)
    return unsupported(gpu + ": flashserve's kernels need compute capability 8.0 or later");
  cudaFuncAttributes attributes{};
  if (const auto e = cudaFuncGetAttributes(&attributes, probe_kernel); e != cudaSuccess) {
    (void)cudaGetLastError();
    return unsupported("this build of flashserve has no kernels for " + gpu +
                       ": they were compiled for " + kArchsBuilt + " (" + cudaGetErrorString(e) +
                       "); rebuild with -DFLASHSERVE_CUDA_ARCHS=native on that machine, or add " +
                       std::to_string(p.major) + std::to_string(p.minor) +
                       " to the list (docs/GPU.md \"Other GPUs\")");
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<Backend>> CudaBackend::create(int device) {
  int count = 0;
  if (const auto e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0)
    return unsupported("no CUDA device is available" +
                       (e != cudaSuccess ? std::string(" (") + cudaGetErrorString(e) + ")" : ""));
  if (device < 0 || device >= count)
    return invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" +
                            std::to_string(count) + " present)");
  auto memory = CudaMemory::create(device);
  if (!memory.ok()) return memory.status();
  if (auto s = check_device_supported(device); !s.ok()) return s;
  // cuBLAS is opened here, with a device present, not at program start (cuda_blas.h).
  auto blas = cublas();
  if (!blas.ok()) return blas.status();
  std::unique_ptr<CudaBackend> b(new CudaBackend(*memory));
  b->blas_ = *blas;
  if (const auto s = b->blas_->create(&b->cublas_); s != CUBLAS_STATUS_SUCCESS) {
    b->cublas_ = nullptr;
    return internal_error(std::string("cuda: cublasCreate: ") + b->blas_->status_string(s));
  }
  void* ws = nullptr;
  if (const auto e = cudaMalloc(&ws, kCublasWorkspace); e != cudaSuccess)
    return internal_error(cuda_message("cuBLAS workspace", e));
  b->cublas_workspace_.reset(ws);
  if (const char* env = std::getenv("FLASHSERVE_CUDA_GRAPHS"); env != nullptr && *env != '\0')
    b->graphs_on_ = std::string(env) != "0";
  const CublasApi& api = *b->blas_;
  for (const auto s : {api.set_stream(b->cublas_, b->stream()),
                       // fp32 products stay fp32: no TF32, no reduced-precision reductions.
                       api.set_math_mode(b->cublas_, CUBLAS_PEDANTIC_MATH),
                       api.set_workspace(b->cublas_, ws, kCublasWorkspace)}) {
    if (s != CUBLAS_STATUS_SUCCESS)
      return internal_error(std::string("cuda: cuBLAS setup: ") + api.status_string(s));
  }
  return std::unique_ptr<Backend>(std::move(b));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream());
  if (cublas_ != nullptr) blas_->destroy(cublas_);
}

void CudaBackend::synchronize() {
  if (mode_ != StepMode::kEager) {
    fail(internal_error("cuda: synchronize inside a step graph"));
    return;
  }
  if (const auto e = cudaStreamSynchronize(stream()); e != cudaSuccess)
    fail(internal_error(cuda_message("synchronize", e)));
  if (auto m = cuda_memory_->error(); !m.empty()) fail(internal_error(m));
}

// --- step graphs ---------------------------------------------------------------------------------

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void CudaBackend::begin_step_graph(const StepGraphKey& key) {
  if (failed()) return;
  if (!check(graphs_on_, "step graph", "graphs are turned off")) return;
  if (!check(mode_ == StepMode::kEager, "step graph", "a step is already open")) return;
  const auto began = now_ns();
  StepGraph* g = graphs_.find(key);
  const bool replay = g != nullptr;
  if (replay) {
    // Its last launch has read the parameter mirror and the staging this walk rewrites.
    if (const auto e = cudaEventSynchronize(g->done); e != cudaSuccess) {
      fail(internal_error(cuda_message("step graph: wait for the last replay", e)));
      return;
    }
  } else {
    auto made = graphs_.create(key);
    if (!made.ok()) {
      fail(made.status());
      return;
    }
    g = *made;
  }
  // Relaxed: a recording's pool may still cudaMalloc a new block (not part of the graph; the
  // block is the graph's from then on). A walk captures too, into a graph that is thrown away:
  // an op that queues work despite walking() lands there instead of running twice.
  if (const auto e = cudaStreamBeginCapture(stream(), cudaStreamCaptureModeRelaxed);
      e != cudaSuccess) {
    cudaGetLastError();
    if (!replay) graphs_.drop(g);
    fail(internal_error(cuda_message("step graph: begin capture", e)));
    return;
  }
  step_ = g;
  if (replay) {
    g->params_next = 0;
    g->staging_next = 0;
    cuda_memory_->begin_replay(g->arena);
    mode_ = StepMode::kWalk;
    walk_began_ns_ = began;
    return;
  }
  // The graph's first node: the per-step scalars, from the mirror the walk writes.
  const auto e = cudaMemcpyAsync(g->params_dev, g->params_host, kStepScalars * sizeof(std::int64_t),
                                 cudaMemcpyHostToDevice, stream());
  cuda_memory_->begin_record(g->arena);
  mode_ = StepMode::kCapture;
  if (e != cudaSuccess) fail(internal_error(cuda_message("step graph: parameter copy", e)));
}

void CudaBackend::launch_step_graph() {
  if (mode_ == StepMode::kEager) {
    // begin_step_graph failed (recorded) or was never called.
    if (!failed()) fail(internal_error("cuda: step graph: launch without a recording"));
    return;
  }
  end_step_graph(true);
}

void CudaBackend::discard_step_graph() {
  if (mode_ != StepMode::kEager) end_step_graph(false);
}

void CudaBackend::end_step_graph(bool run) {
  const bool replay = mode_ == StepMode::kWalk;
  StepGraph* g = step_;
  mode_ = StepMode::kEager;
  step_ = nullptr;
  const auto divergence = cuda_memory_->end_step();
  step_scratch_.clear();  // arena blocks: they stay with the graph
  cudaGraph_t graph = nullptr;
  const auto e = cudaStreamEndCapture(stream(), &graph);
  auto& stats = graphs_.stats();
  Status s;
  if (e != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    // Invalidated: something inside the step synchronised or used another stream.
    s = internal_error(cuda_message("step graph: end capture", e));
  } else if (auto m = cuda_memory_->error(); !m.empty()) {
    s = internal_error(m);
  } else if (!divergence.empty()) {
    s = internal_error(divergence);
  } else if (replay && (g->params_next != g->params_used || g->staging_next != g->staging.size())) {
    s = internal_error("cuda: step graph: the replay took " + std::to_string(g->params_next) +
                       " scalars and " + std::to_string(g->staging_next) +
                       " staging buffers, the recording " + std::to_string(g->params_used) +
                       " and " + std::to_string(g->staging.size()) +
                       ": the step's key does not fix its ops");
  }
  if (replay && graph != nullptr) {
    std::size_t nodes = 0;
    if (cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess)
      stats.walk_leaked_nodes += static_cast<std::int64_t>(nodes);
  }
  if (s.ok() && !replay && !failed()) {
    if (const auto ei = cudaGraphInstantiate(&g->exec, graph, 0); ei != cudaSuccess) {
      cudaGetLastError();
      g->exec = nullptr;
      s = internal_error(cuda_message("step graph: instantiate", ei));
    }
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (s.ok() && run && !failed()) {
    if (const auto el = cudaGraphLaunch(g->exec, stream()); el != cudaSuccess) {
      cudaGetLastError();
      s = internal_error(cuda_message("step graph: launch", el));
    } else if (const auto er = cudaEventRecord(g->done, stream()); er != cudaSuccess) {
      s = internal_error(cuda_message("step graph: record", er));
    } else {
      ++stats.launches;
      if (replay) {
        ++stats.replays;
        stats.walk_ns += now_ns() - walk_began_ns_;
      } else {
        ++stats.captures;
      }
    }
  }
  // A recording that did not complete, or a walk that diverged, leaves no graph to reuse.
  if (!s.ok() || (!replay && (failed() || !run))) graphs_.drop(g);
  if (!s.ok()) fail(std::move(s));
}

StepScalar CudaBackend::step_scalar(std::int64_t v) {
  if (mode_ == StepMode::kEager) return {nullptr, v};
  StepGraph& g = *step_;
  if (g.params_next >= kStepScalars) {
    fail(internal_error("cuda: step graph: more than " + std::to_string(kStepScalars) +
                        " per-step scalars in one step"));
    return {nullptr, v};
  }
  const auto i = g.params_next++;
  g.params_host[i] = v;
  if (mode_ == StepMode::kCapture) g.params_used = g.params_next;
  return {g.params_dev + i, v};
}

Tensor& CudaBackend::scratch(Tensor& member) {
  if (mode_ == StepMode::kEager) return member;
  return step_scratch_.emplace_back();
}

void* CudaBackend::host_staging(std::size_t bytes, const char* op) {
  if (mode_ == StepMode::kEager) {
    void* p = staging_.acquire(bytes);
    if (p == nullptr)
      fail(internal_error(std::string("cuda: ") + op + ": cannot allocate pinned staging memory"));
    return p;
  }
  StepGraph& g = *step_;
  if (mode_ == StepMode::kWalk) {
    if (g.staging_next < g.staging.size() && g.staging[g.staging_next].bytes >= bytes)
      return g.staging[g.staging_next++].data;
    fail(internal_error(std::string("cuda: ") + op + ": step graph: staging buffer " +
                        std::to_string(g.staging_next) +
                        " of the replay does not match the recording's"));
    return nullptr;
  }
  // Recording: bytes the graph owns, from its block while they fit (16-aligned), else a buffer
  // of their own (cudaHostAlloc is legal in a relaxed capture).
  const auto at = (g.staging_used + 15) / 16 * 16;
  void* p = nullptr;
  if (at + bytes <= kStepStagingBytes) {
    p = static_cast<std::uint8_t*>(g.staging_block.get()) + at;
    g.staging_used = at + bytes;
  } else if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) == cudaSuccess) {
    g.staging_extra.emplace_back(p);
  } else {
    cudaGetLastError();
    fail(internal_error(std::string("cuda: ") + op + ": cannot allocate pinned staging memory"));
    return nullptr;
  }
  g.staging.push_back({p, bytes});
  ++g.staging_next;
  return p;
}

cudaError_t CudaBackend::staged() {
  return mode_ == StepMode::kEager ? staging_.submitted(stream()) : cudaSuccess;
}

bool CudaBackend::launched(const char* op) {
  if (walking()) return true;  // nothing was queued
  const auto e = cudaGetLastError();
  if (e == cudaSuccess) return true;
  fail(internal_error(cuda_message(op, e)));
  return false;
}

bool CudaBackend::launched(const char* op, cudaError_t returned) {
  if (walking()) return true;
  if (returned == cudaSuccess) return launched(op);
  cudaGetLastError();  // the returned error is the one to report
  fail(internal_error(cuda_message(op, returned)));
  return false;
}

bool CudaBackend::cublas_ok(cublasStatus_t s, const char* op) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  fail(internal_error(std::string("cuda: ") + op + ": cuBLAS " + blas_->status_string(s)));
  return false;
}

bool CudaBackend::on_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    if (t->numel() != 0 && (t->device() != Device::kCuda || t->raw() == nullptr)) {
      fail(invalid_argument(std::string("cuda: ") + op +
                            ": an input tensor is not in device memory"));
      return false;
    }
  }
  return true;
}

bool CudaBackend::on_device(const char* op, const Weight& w, bool packed_ok) {
  if (w.is_packed() && !packed_ok) {
    fail(unsupported_format(std::string("cuda: ") + op, w, "F32/BF16 or FP8 weights"));
    return false;
  }
  if (w.device == Device::kCuda && (w.data != nullptr || w.numel() == 0)) return true;
  fail(invalid_argument(std::string("cuda: ") + op +
                        ": the weight was not uploaded to the device (Backend::upload)"));
  return false;
}

bool CudaBackend::check(bool ok, const char* op, const char* what) {
  if (!ok) fail(invalid_argument(std::string("cuda: ") + op + ": " + what));
  return ok;
}

// --- upload --------------------------------------------------------------------------------------

// A block-scaled or packed weight keeps its stored bytes on the device (the kernels decode
// them), and its scales beside it: two buffers, nothing widened. E8M0 scales of 128x128 FP8
// blocks are widened to f32 on the way (2^(e-127) is exact in f32, and the grid is 1/16384 of
// the weights), so the FP8 kernels read one scale type; FP4's per-32 E8M0 scales stay bytes.
Expected<Weight> CudaBackend::upload_stored(const Weight& w) {
  if (auto st = w.check_storage(); !st.ok()) return st.with_context("cuda upload");
  const bool fp8 = !w.is_packed() && w.dtype == DType::kF8E4M3;
  const bool fp4 = w.storage() == quant::QuantType::kF4E2M1x2;
  if (fp8 && (w.scales.block_rows != 128 || w.scales.block_cols != 128))
    return unsupported("cuda upload: " + w.format_name() + " weights (FP8 needs 128x128 blocks)");
  if (fp4 && (w.scales.format != quant::ScaleFormat::kE8M0 || w.scales.block_rows != 1 ||
              w.scales.block_cols != 32))
    return unsupported("cuda upload: " + w.format_name() + " weights (FP4 needs 1x32 E8M0 scales)");
  if (!fp8 && !w.is_packed()) return unsupported("cuda upload: " + w.format_name() + " weights");
  std::vector<float> widened_scales;
  Weight src = w;
  if (fp8 && w.scales.format == quant::ScaleFormat::kE8M0) {
    if (w.device != Device::kHost)
      return unsupported("cuda upload: " + w.format_name() + " weights already on the device");
    widened_scales.resize(w.scale_bytes());
    for (std::size_t i = 0; i < widened_scales.size(); ++i)
      widened_scales[i] = quant::e8m0_to_f32(w.scales.data[i]);
    src.scales.format = quant::ScaleFormat::kF32;
    src.scales.data = reinterpret_cast<const std::uint8_t*>(widened_scales.data());
  }
  if (w.storage() == quant::QuantType::kIQ2_XXS && iq2_grid() == nullptr) return status();
  return copy_stored(src);
}

const std::uint8_t* CudaBackend::iq2_grid() {
  const std::lock_guard lock(weights_mutex_);
  if (iq2_grid_) return static_cast<const std::uint8_t*>(iq2_grid_.get());
  constexpr std::size_t kBytes = sizeof(quant::kIq2XxsGrid);
  void* dst = nullptr;
  if (const auto e = cudaMalloc(&dst, kBytes); e != cudaSuccess) {
    cudaGetLastError();
    fail(out_of_range(std::string("cuda: the IQ2_XXS codebook: ") + cudaGetErrorString(e)));
    return nullptr;
  }
  DeviceBuffer buffer(dst);
  if (const auto e = cudaMemcpy(dst, quant::kIq2XxsGrid.data(), kBytes, cudaMemcpyHostToDevice);
      e != cudaSuccess) {
    fail(internal_error(cuda_message("the IQ2_XXS codebook", e)));
    return nullptr;
  }
  iq2_grid_ = std::move(buffer);
  return static_cast<const std::uint8_t*>(dst);
}

// The copy upload_stored makes: `w`'s bytes and scales into two device buffers.
Expected<Weight> CudaBackend::copy_stored(const Weight& w) {
  Weight out = w;
  out.device = Device::kCuda;
  const std::size_t sizes[2] = {w.bytes(), w.scale_bytes()};
  const std::uint8_t* srcs[2] = {w.data, w.scales.data};
  const std::uint8_t* dsts[2] = {nullptr, nullptr};
  const auto kind = w.device == Device::kCuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  std::vector<DeviceBuffer> buffers;
  for (int i = 0; i < 2; ++i) {
    if (sizes[i] == 0) continue;
    void* dst = nullptr;
    if (const auto e = cudaMalloc(&dst, sizes[i]); e != cudaSuccess) {
      cudaGetLastError();
      return out_of_range("cuda upload: out of device memory allocating " +
                          std::to_string(sizes[i]) + " bytes: " + cudaGetErrorString(e));
    }
    buffers.emplace_back(dst);
    if (const auto e = cudaMemcpy(dst, srcs[i], sizes[i], kind); e != cudaSuccess)
      return internal_error(cuda_message("upload", e));
    dsts[i] = static_cast<const std::uint8_t*>(dst);
  }
  out.data = dsts[0];
  out.scales.data = dsts[1];
  const std::lock_guard lock(weights_mutex_);
  for (auto& b : buffers) weights_.push_back(std::move(b));
  return out;
}

std::optional<Backend::DeviceMemoryInfo> CudaBackend::device_memory() const {
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return DeviceMemoryInfo{free, total};
}

// An index table (DeepSeek V4's tid2eid) becomes int32 on the device; int64 entries are
// narrowed on the host and must fit.
Expected<Weight> CudaBackend::upload_index_table(const Weight& w) {
  Weight out{DType::kI32, w.shape, nullptr, Device::kCuda};
  const auto n = static_cast<std::size_t>(w.numel());
  if (n == 0) return out;
  if (w.data == nullptr || w.device != Device::kHost)
    return invalid_argument("cuda upload: an index table must be a host weight with data");
  std::vector<std::int32_t> narrow(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t v = w.dtype == DType::kI64
                               ? reinterpret_cast<const std::int64_t*>(w.data)[i]
                               : reinterpret_cast<const std::int32_t*>(w.data)[i];
    if (v < INT32_MIN || v > INT32_MAX)
      return invalid_argument("cuda upload: index table entry " + std::to_string(v) +
                              " does not fit int32");
    narrow[i] = static_cast<std::int32_t>(v);
  }
  void* dst = nullptr;
  if (const auto e = cudaMalloc(&dst, n * 4); e != cudaSuccess) {
    cudaGetLastError();
    return out_of_range("cuda upload: out of device memory allocating " + std::to_string(n * 4) +
                        " bytes: " + cudaGetErrorString(e));
  }
  DeviceBuffer buffer(dst);
  if (const auto e = cudaMemcpy(dst, narrow.data(), n * 4, cudaMemcpyHostToDevice);
      e != cudaSuccess)
    return internal_error(cuda_message("upload", e));
  out.data = static_cast<const std::uint8_t*>(dst);
  const std::lock_guard lock(weights_mutex_);
  weights_.push_back(std::move(buffer));
  return out;
}

Expected<Weight> CudaBackend::upload(const Weight& w, DType matrix_dtype) {
  if ((w.block_scaled() || w.is_packed()) && w.numel() > 0) return upload_stored(w);
  if (w.dtype == DType::kI32 || w.dtype == DType::kI64) return upload_index_table(w);
  const DType target = w.shape.size() >= 2 ? matrix_dtype : DType::kF32;
  if (target != DType::kF32 && target != DType::kBF16)
    return invalid_argument("cuda upload: matrices are stored as F32 or BF16, not " +
                            std::string(dtype_name(target)));
  if (!dtype_is_float(w.dtype))
    return invalid_argument("cuda upload: weight of integer dtype " +
                            std::string(dtype_name(w.dtype)));
  Weight out{target, w.shape, nullptr, Device::kCuda};
  const auto n = static_cast<std::size_t>(w.numel());
  if (n == 0) return out;
  if (w.data == nullptr) return invalid_argument("cuda upload: weight has no data");
  void* dst = nullptr;
  if (const auto e = cudaMalloc(&dst, n * dtype_size(target)); e != cudaSuccess) {
    cudaGetLastError();
    return out_of_range("cuda upload: out of device memory allocating " +
                        std::to_string(n * dtype_size(target)) +
                        " bytes: " + cudaGetErrorString(e));
  }
  DeviceBuffer buffer(dst);
  const auto kind = w.device == Device::kCuda ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
  Status status;
  auto check_cuda = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess && status.ok()) status = internal_error(cuda_message(what, e));
    return e == cudaSuccess;
  };
  if (w.dtype == target) {
    check_cuda(cudaMemcpyAsync(dst, w.data, n * dtype_size(target), kind, stream()), "upload");
  } else if (w.dtype == DType::kF32 || w.dtype == DType::kBF16) {
    // Copy the source elements in chunks, convert on the device.
    void* raw = nullptr;
    const auto chunk = std::min(n, kUploadChunk);
    if (!check_cuda(cudaMalloc(&raw, chunk * dtype_size(w.dtype)), "upload staging")) return status;
    DeviceBuffer staging(raw);
    for (std::size_t i = 0; i < n && status.ok(); i += chunk) {
      const auto m = std::min(chunk, n - i);
      if (!check_cuda(cudaMemcpyAsync(raw, w.data + i * dtype_size(w.dtype),
                                      m * dtype_size(w.dtype), kind, stream()),
                      "upload"))
        break;
      const auto blocks = std::min<unsigned>(grid_for(static_cast<std::int64_t>(m), 256), 4096);
      const auto count = static_cast<std::int64_t>(m);
      if (w.dtype == DType::kF32) {
        convert_kernel<<<blocks, 256, 0, stream()>>>(static_cast<const float*>(raw),
                                                     static_cast<bf16_bits*>(dst) + i, count);
      } else {
        convert_kernel<<<blocks, 256, 0, stream()>>>(static_cast<const bf16_bits*>(raw),
                                                     static_cast<float*>(dst) + i, count);
      }
      check_cuda(cudaGetLastError(), "upload convert");
    }
    check_cuda(cudaStreamSynchronize(stream()), "upload");
  } else {
    // F16 / F8 checkpoints: widen on the host, then as an f32 source.
    if (w.device != Device::kHost)
      return unsupported("cuda upload: a device weight of dtype " +
                         std::string(dtype_name(w.dtype)) + " cannot be converted");
    std::vector<float> wide(std::min(n, kUploadChunk));
    std::vector<std::uint16_t> narrow(target == DType::kBF16 ? wide.size() : 0);
    for (std::size_t i = 0; i < n && status.ok(); i += wide.size()) {
      const auto m = std::min(wide.size(), n - i);
      convert_to_f32(w.dtype, w.data + i * dtype_size(w.dtype), wide.data(), m);
      if (target == DType::kBF16) {
        for (std::size_t j = 0; j < m; ++j) narrow[j] = f32_to_bf16(wide[j]);
        check_cuda(cudaMemcpy(static_cast<std::uint16_t*>(dst) + i, narrow.data(), m * 2,
                              cudaMemcpyHostToDevice),
                   "upload");
      } else {
        check_cuda(
            cudaMemcpy(static_cast<float*>(dst) + i, wide.data(), m * 4, cudaMemcpyHostToDevice),
            "upload");
      }
    }
  }
  check_cuda(cudaStreamSynchronize(stream()), "upload");
  if (!status.ok()) return status;
  out.data = static_cast<const std::uint8_t*>(dst);
  {
    const std::lock_guard lock(weights_mutex_);  // a loader may upload from several threads
    weights_.push_back(std::move(buffer));
  }
  return out;
}

// --- embedding -----------------------------------------------------------------------------------

void CudaBackend::embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                            Tensor& out) {
  constexpr const char* kOp = "embedding";
  if (failed()) return;
  if (!check(!shards.empty(), kOp, "no table shards")) return;
  const auto cols = shards.front().cols();
  const auto per_shard = shards.front().rows();  // row shards are equal (split along dim 0)
  const auto n = static_cast<std::int64_t>(ids.size());
  if (!ensure(out, {n, cols})) return;
  if (n == 0 || cols == 0) return;
  if (!check(per_shard > 0, kOp, "the table shards have no rows")) return;
  for (const auto& w : shards) {
    // Packed and block-scaled tables are read on the host (each row dequantised into the
    // staging, as the CPU backend computes it): the PLE table stays memory-mapped there.
    if (w.device == Device::kCuda && !w.plain())
      return fail(unsupported_format("cuda: embedding", w,
                                     "F32/BF16 device shards; other formats from host shards"));
    if (!check(w.cols() == cols &&
                   (w.dtype == DType::kF32 || w.dtype == DType::kBF16 || w.device == Device::kHost),
               kOp, "shards differ in width, or a device shard is neither F32 nor BF16"))
      return;
    if (!check(w.data != nullptr, kOp, "a shard has no data")) return;
  }
  // Layout of the scratch (and of the pinned staging it is copied from): n row descriptors, then
  // the rows gathered from host shards, each `cols` elements of its dtype (f32 when widened here).
  const auto desc_bytes = static_cast<std::size_t>(n) * sizeof(EmbedRow);
  std::size_t host_bytes = 0;
  for (const auto id : ids) {
    if (!check(id >= 0 && id < per_shard * static_cast<std::int64_t>(shards.size()), kOp,
               "id out of range"))
      return;
    const auto& w = shards[static_cast<std::size_t>(id / per_shard)];
    if (w.device == Device::kHost) host_bytes += staged_row_bytes(w.dtype, cols);
  }
  const auto total = desc_bytes + host_bytes;
  Tensor& in = scratch(embed_in_);
  if (!ensure(in, {static_cast<std::int64_t>(total)}, DType::kU8)) return;
  auto* staging = static_cast<std::uint8_t*>(host_staging(total, kOp));
  if (staging == nullptr) return;
  auto* device_base = static_cast<std::uint8_t*>(in.raw());
  auto* desc = reinterpret_cast<EmbedRow*>(staging);
  std::size_t offset = desc_bytes;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto id = ids[static_cast<std::size_t>(i)];
    const auto& w = shards[static_cast<std::size_t>(id / per_shard)];
    const auto row = id % per_shard;
    const auto esize = dtype_size(w.dtype);
    const std::uint8_t* src = w.data + static_cast<std::size_t>(row * cols) * esize;
    EmbedRow& d = desc[i];
    d.pad = 0;
    if (w.device == Device::kCuda) {
      d.src = src;
      d.bf16 = w.dtype == DType::kBF16 ? 1 : 0;
      continue;
    }
    const bool keep = w.plain();
    if (w.is_packed() || w.block_scaled()) {
      auto st = w.dequantize_row(
          row, {reinterpret_cast<float*>(staging + offset), static_cast<std::size_t>(cols)});
      if (!st.ok()) return fail(st.with_context("cuda: embedding"));
    } else if (keep) {
      std::memcpy(staging + offset, src, static_cast<std::size_t>(cols) * esize);
    } else {
      convert_to_f32(w.dtype, src, reinterpret_cast<float*>(staging + offset),
                     static_cast<std::size_t>(cols));
    }
    d.src = device_base + offset;
    d.bf16 = w.dtype == DType::kBF16 ? 1 : 0;
    offset += staged_row_bytes(w.dtype, cols);
  }
  if (walking()) return;  // the recorded copy reads the staging just written
  auto e = cudaMemcpyAsync(device_base, staging, total, cudaMemcpyHostToDevice, stream());
  if (const auto e2 = staged(); e == cudaSuccess) e = e2;
  if (e != cudaSuccess) {
    fail(internal_error(cuda_message(kOp, e)));
    return;
  }
  embedding_kernel<<<static_cast<unsigned>(n), 256, 0, stream()>>>(
      reinterpret_cast<const EmbedRow*>(device_base), cols, out.data());
  launched(kOp);
}

// The rows go through pinned staging as the embedding's descriptors do: eagerly a ring slot (the
// copy is queued, nothing waits for it), inside a step graph the graph's own buffer, which the
// recorded copy node reads when the graph runs and each replay's walk rewrites.
void CudaBackend::upload_rows(std::span<const float> values, std::int64_t cols, Tensor& out) {
  constexpr const char* kOp = "upload_rows";
  if (failed()) return;
  if (!check(cols > 0 && values.size() % static_cast<std::size_t>(cols) == 0, kOp,
             "the values are not whole rows"))
    return;
  if (!ensure(out, {static_cast<std::int64_t>(values.size()) / cols, cols})) return;
  if (values.empty()) return;
  stage_to_device(values.data(), values.size_bytes(), out.raw(), kOp);
}

bool CudaBackend::stage_to_device(const void* src, std::size_t bytes, void* device,
                                  const char* op) {
  void* staging = host_staging(bytes, op);
  if (staging == nullptr) return false;
  std::memcpy(staging, src, bytes);
  if (walking()) return false;  // the recorded copy reads the staging just written
  auto e = cudaMemcpyAsync(device, staging, bytes, cudaMemcpyHostToDevice, stream());
  if (const auto e2 = staged(); e == cudaSuccess) e = e2;
  if (e != cudaSuccess) {
    fail(internal_error(cuda_message(op, e)));
    return false;
  }
  return true;
}

}  // namespace cuda

// --- factory -------------------------------------------------------------------------------------

Expected<std::unique_ptr<Backend>> make_cuda_backend(int device) {
  return cuda::CudaBackend::create(device);
}

bool cuda_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

}  // namespace fs
