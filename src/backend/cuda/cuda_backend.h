// The CUDA backend (sm_90a): every op of backend.h as fp32 kernels on one device.
//
// Memory model.
// - Activations, caches and scratch are `Tensor`s in the backend's `CudaMemory` (cuda_memory.h): a
//   caching pool over cudaMalloc, so a warm workload (steady-state decode) calls cudaMalloc zero
//   times; `memory()->stats()` counts the calls.
// - One stream, owned by that memory, orders everything: kernels, cuBLAS (its handle is bound to
//   the stream, with a workspace the backend owns), pool copies and fills, and the embedding's
//   host-to-device copies. Ops never synchronise; the host waits only in `synchronize()` and in
//   `Memory::to_host`/`from_host`, whose copies complete before they return.
// - `upload` copies a weight into a cudaMalloc buffer owned by the backend for its whole life
//   (outside the pool): matrices as the requested f32 or bf16 (f32 -> bf16 rounds to nearest even,
//   as fs::f32_to_bf16), vectors as f32. A weight whose device is the host is read by no kernel;
//   only `embedding` accepts host shards (the memory-mapped PLE table), whose touched rows it
//   gathers on the host into a pinned staging buffer (a ring of four, each reused only after an
//   event says its last copy finished) and copies in with one async copy.
//
// Choices.
// - fp32 compute and state everywhere; sums of squares (norms), softmax denominators and
//   grouped_dot accumulate in double as the CPU reference does. Ops the CPU computes with a short
//   fixed sequence (rope, conv, stream ops, block_mean, the MoE combine) use the same operation
//   order without fused multiply-adds, so they match the CPU bit for bit where the math library
//   agrees.
// - linear: up to 8 rows, a GEMV kernel (cuda_gemv.cuh: 8 or 32 lanes per output row, 1-4 rows
//   per thread group, 16-byte loads of W issued before use, f32 or bf16, fp32 accumulation) reads
//   W once for all rows; more rows go to cublasSgemm in pedantic math mode (no TF32). A bf16 W is
//   first widened (exactly) to f32 in pooled tiles of at most 64 MiB.
// - moe_experts (cuda_moe.cu): at one token a fused path of three kernels (gate/up + swiglu per
//   (row tile, pair), down per (column tile, pair), then the weighted sum over the k pairs in
//   top-k order); at 2+ tokens grouped GEMVs over (token, routed expert) pairs and a separate
//   deterministic combine. Expert ids are read on the device, only routed experts' rows are read,
//   no atomics. Packed formats (issue 15) run the pair path over the packed GEMV core
//   (cuda_moe_packed.cu).
// - The gated delta rule: the recurrent form (and _positions, and the chunked op below 16 tokens,
//   a scalar (GDN) decay below 1,024 tokens, or heads over 128) runs token by token, a block per
//   (value head, 32 state columns) with that slice of the [dk, dv] state in registers across all
//   tokens (dk <= 256). From 16 tokens gated_delta_rule_chunked runs the chunked (WY) form
//   (cuda_delta_chunks.cu): a kernel per (chunk of 64, value head) for the in-chunk products and
//   the triangular inverse, all chunks at once, then a kernel per (value head, 16 or 32 state
//   columns) that walks the chunks with its slice of the state in shared memory, its products on
//   the tensor cores as 3xTF32 (fp32 precision; fp32 state). FLASHSERVE_CUDA_OLD_DELTA=1 keeps it
//   token by token (cuda_switches.h).
// - block_sparse_attention (cuda_attention.cu): split-K over the selected keys, a block per
//   (query, KV head, chunk) loading each K/V tile once for the query heads that share it, then a
//   merge of the partials in a fixed order. The split kernel (cuda_attention_tiles.cu) takes
//   32-key tiles by cp.async (two stages when a chunk has several), a key a lane for the scores
//   and one softmax step a tile; FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION=1 runs the split kernel
//   before it (a key at a time), FLASHSERVE_CUDA_OLD_ATTENTION=1 the older kernel (a block per
//   (query, head)).
// - The fused decode ops (backend.h; cuda_fused.cu): the hyper-connection read in 2 kernels (was
//   12), the GatedDeltaNet's four input projections with their gates in one, its conv, silu and
//   q/k norms in one, QSA's q, k, v and indexer projections in one (session 13), the router's
//   softmax/top-k/renormalise in one after its GEMV, the shared expert in two, at 1-4 rows (more
//   rows run the unfused sequence); Qwen's whole MoE block (moe_block, cuda_moe_block.cu) at one
//   token in five kernels instead of seven (the shared gate/up inside the routing's grid, the
//   routed combine inside the shared down). Each computes the unfused CUDA sequence's bits, except
//   the hyper-connection read (its norm folded into its first product, within rounding).
// - argmax_rows (greedy sampling): ties to the lower index; a row of the vocabulary's length is
//   read by a block per slice of 4,096 and the slices merged in order by one warp, a short row by
//   one block; only the int32 ids are read back by the caller.
// - Overlapped launches (cuda_common.h, docs/GPU.md "Step 4"): the decode GEMVs, the fused
//   multi-GEMV, the hyper-connection read, the shared expert's gate/up and the one-token routed
//   experts are launched with programmatic stream serialisation, so each is scheduled while the
//   kernel before it runs and waits for its results inside (FLASHSERVE_CUDA_OVERLAP=0: off).
// - topk / select_blocks (cuda_select.cu): a block per row finds the k-th largest by four 8-bit
//   radix passes over the float bits, keeps what ranks above it (ties to the lower index) and
//   sorts those k (value descending, index ascending); FLASHSERVE_CUDA_OLD_TOPK=1 keeps the k
//   arg-max passes; FLASHSERVE_CUDA_OLD_CONTEXT=1 selects all the older QSA kernels.
// - Step graphs (cuda_graph.*): a decode forward is recorded once per key and replayed as one
//   CUDA graph (docs/GPU.md) with FLASHSERVE_CUDA_GRAPHS=1; off by default (measured slower once
//   the decode ops were fused: bench/NOTES.md).
// - Prefill-sized work (many tokens) is correct but not yet fast: the MoE runs a GEMV per
//   (token, expert) pair instead of grouping tokens by expert.
// - `upload` waits for its copy (load time); it may be called from several threads.
//
// The current device is set once, at construction; a process driving this backend from several
// host threads on a device other than 0 must set it in each thread.
#pragma once

// nvcc's front end reports every discarded [[nodiscard]] class value, including the reference an
// assignment returns and declarations returning Expected<T> (warning 2810); the host compiler's
// -Wall checks the real cases.
#pragma nv_diag_suppress 2810

#include <cuda_runtime.h>

#include <array>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_blas.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_grouped_gemm.h"
#include "backend/cuda/cuda_memory.h"

namespace fs::cuda {

// A cudaMalloc buffer freed on destruction.
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;

// Pinned host buffers for host-to-device copies queued on the stream without a wait: a ring of
// slots, each reused once the event recorded after its last copy has fired. Eager ops only: a
// step graph stages through buffers it owns (cuda_graph.h).
class HostStaging {
 public:
  HostStaging() = default;
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;
  // A pinned buffer of at least `bytes` that no queued copy still reads; nullptr on failure.
  void* acquire(std::size_t bytes);
  // Records that the buffer from the last acquire() is read by work queued so far on `stream`.
  cudaError_t submitted(cudaStream_t stream);

 private:
  static constexpr std::size_t kSlots = 4;
  static constexpr std::size_t kMinBytes = std::size_t{64} << 10;
  struct Slot {
    void* data = nullptr;
    std::size_t capacity = 0;
    cudaEvent_t done = nullptr;
  };
  // Makes slot `s` hold at least `bytes` (contents dropped); false on failure.
  bool reserve(Slot& s, std::size_t bytes);
  std::array<Slot, kSlots> slots_{};
  std::size_t next_ = 0;
};

class CudaBackend final : public Backend {
 public:
  static Expected<std::unique_ptr<Backend>> create(int device);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  const std::shared_ptr<Memory>& memory() const override { return memory_; }
  Expected<Weight> upload(const Weight& w, DType matrix_dtype) override;
  std::optional<DeviceMemoryInfo> device_memory() const override;
  void synchronize() override;

  void linear(const Tensor& x, const Weight& w, Tensor& y) override;
  void add_bias(Tensor& y, const Weight& bias) override;

  void rms_norm(const Tensor& x, const Weight& w, std::int64_t group, float eps, bool unit_offset,
                Tensor& y) override;
  void rms_norm_gated(const Tensor& x, const Weight& w, const Tensor& gate, float eps,
                      Activation act, Tensor& y) override;
  void layer_norm(const Tensor& x, const Weight& w, const Weight& b, float eps, Tensor& y) override;
  void l2_norm(Tensor& x, std::int64_t group, float eps) override;

  void activate(Tensor& x, Activation act) override;
  void scale(Tensor& x, float s) override;
  void add(Tensor& x, const Tensor& y) override;
  void mul(Tensor& x, const Tensor& y) override;
  // One kernel: x[i] = x[i] * act(gate[i]) with the two ops' roundings; gate is not written.
  void mul_activated(Tensor& x, Tensor& gate, Activation act) override;
  void mul_cols(Tensor& x, const Weight& v) override;
  void mul_rows(Tensor& x, const Tensor& s) override;
  void swiglu(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void swiglu_packed(const Tensor& gu, Tensor& out) override;
  void signed_sqrt(Tensor& x, float floor) override;
  void normalize_rows(Tensor& x) override;
  void clamp(Tensor& x, float lo, float hi) override;

  void slice_cols(const Tensor& x, std::int64_t begin, std::int64_t width, Tensor& out) override;
  void slice_rows(const Tensor& x, std::int64_t begin, std::int64_t count, Tensor& out) override;
  void split_interleaved(const Tensor& x, std::int64_t heads, std::int64_t dim, Tensor& a,
                         Tensor& b) override;
  void repeat_cols(const Tensor& x, std::int64_t times, Tensor& out) override;
  void append_rows(Tensor& cache, const Tensor& x) override;

  void embedding(std::span<const Weight> shards, std::span<const std::int64_t> ids,
                 Tensor& out) override;
  void upload_rows(std::span<const float> values, std::int64_t cols, Tensor& out) override;

  void stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) override;
  void add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) override;
  void grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) override;

  void rope(Tensor& x, std::int64_t head_dim, std::int64_t rotary_dim, std::int64_t first,
            std::int64_t stride, double theta) override;

  void causal_conv1d(const Tensor& x, const Weight& w, std::int64_t dilation, Tensor& tail,
                     Tensor& y) override;
  void gated_delta_rule_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                                const Tensor& beta, std::int64_t key_heads, Tensor& state,
                                Tensor& out) override;
  void gated_delta_rule_recurrent(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                  Tensor& state, Tensor& out) override;
  void gated_delta_rule_positions(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& g, const Tensor& beta, std::int64_t key_heads,
                                  Tensor& state, Tensor& out, Tensor& states) override;
  void block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                              std::int64_t kv_heads, const Tensor& picked, std::int64_t block,
                              std::int64_t first, float scale, Tensor& out) override;
  void gated_block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    std::int64_t heads, std::int64_t kv_heads, const Tensor& picked,
                                    std::int64_t block, std::int64_t first, float scale,
                                    Tensor& gate, Activation act, Tensor& out) override;

  // DeepSeek V4's compressed attention (cuda_compressed.cu).
  void rope_interleaved(Tensor& x, std::int64_t head_dim, const Weight& inv_freq,
                        std::int64_t first, std::int64_t stride, bool inverse) override;
  void compressor_pool(const Tensor& kv, const Tensor& gate, std::int64_t src_first,
                       const Weight& bias, std::int64_t first_window, std::int64_t windows,
                       bool overlap, Tensor& out) override;
  void weighted_index_scores(const Tensor& q, const Tensor& keys, const Tensor& weights,
                             float scale, Tensor& out) override;
  void sink_attention(const Tensor& q, const Tensor& kv, std::int64_t kv_first, std::int64_t window,
                      const Tensor& comp, std::int64_t ratio, const Tensor* picked,
                      const Weight& sinks, std::int64_t first, float scale, Tensor& out) override;
  void grouped_linear(const Tensor& x, const Weight& w, std::int64_t groups, Tensor& y) override;
  void fp8_e4m3_simulate(Tensor& x, std::int64_t cols, std::int64_t block) override;
  void hadamard_fp4_simulate(Tensor& x, std::int64_t block, std::int64_t fp4_block) override;

  void block_mean(const Tensor& x, std::int64_t first_row, std::int64_t blocks, std::int64_t group,
                  Tensor& out) override;
  void kpool_compress(const Tensor& keys, const Tensor& gate, const Weight& ape, std::int64_t pool,
                      std::int64_t first_row, std::int64_t pools, Tensor& out) override;
  void index_scores(const Tensor& q, const Tensor& keys, std::int64_t heads, float scale,
                    Tensor& out) override;
  void softmax(Tensor& x) override;
  void topk(const Tensor& x, std::int64_t k, Tensor& idx, Tensor& val) override;
  void select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block, std::int64_t top,
                     Tensor& picked) override;
  void moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                   const Tensor& experts, const Tensor& weights, float swiglu_limit,
                   Tensor& y) override;
  // mHC and the DeepSeek/GLM expert selection (cuda_mhc_router.cu).
  void select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                      const Tensor* token_ids, std::int64_t groups, std::int64_t top_groups,
                      std::int64_t k, bool normalize, float scaling, Tensor& experts,
                      Tensor& weights) override;
  void mhc_weights(const Tensor& h, const Tensor& m, const Weight& base, const Weight& scale,
                   std::int64_t streams, float norm_eps, float hc_eps, std::int64_t sinkhorn_iters,
                   Tensor& pre, Tensor* post, Tensor* comb) override;
  void weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) override;
  void mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb) override;
  void argmax_rows(const Tensor& x, Tensor& ids) override;
  void softmax_denominators(const Tensor& x, double temperature, Tensor& totals) override;
  void sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                   Tensor& ids) override;
  void token_probs(const Tensor& x, double temperature, std::span<const std::int32_t> ids,
                   Tensor& probs) override;
  void sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                            std::span<const double> u, Tensor& ids) override;
  void penalise_entries(Tensor& x, std::span<const EntryPenalty> entries) override;

  // The fused decode ops (cuda_fused.cu; route_experts in cuda_routing.cu).
  void hyper_connection_read(const Tensor& h, const Weight& norm, const Weight& mix_down,
                             const Weight& mix_up, const Weight& inject, std::int64_t streams,
                             std::int64_t width, float eps, Tensor& mixed,
                             Tensor* inject_out) override;
  void gated_delta_net_in_proj(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                               const Weight& w_b, const Weight& w_a, const Weight& dt_bias,
                               const Weight& decay_rate, Tensor& qkv, Tensor& z, Tensor& beta,
                               Tensor& g) override;
  void qsa_projections(const Tensor& x, const Weight& q_w, const Weight& k_w, const Weight& v_w,
                       const Weight& index_w, const Weight& q_bias, const Weight& k_bias,
                       const Weight& v_bias, Tensor& qg, Tensor& k, Tensor& v,
                       Tensor& index_qk) override;
  void head_norm_rope(Tensor& a, const Weight& wa, Tensor* b, const Weight& wb,
                      std::int64_t head_dim, float eps, std::int64_t rotary_dim, std::int64_t first,
                      double theta) override;
  void gated_delta_net_conv(const Tensor& qkv, const Weight& conv, Tensor& tail,
                            std::int64_t key_dim, std::int64_t head_dim, Tensor& q, Tensor& k,
                            Tensor& v) override;
  // A GatedDeltaNet decode step in two kernels: the in-projections' multi-GEMV with the conv as
  // the qkv rows' epilogue, then a block a value head for the q/k norms, the recurrence and the
  // gated norm.
  void gated_delta_net_in_proj_conv(const Tensor& x, const Weight& w_qkv, const Weight& w_z,
                                    const Weight& w_b, const Weight& w_a, const Weight& dt_bias,
                                    const Weight& decay_rate, const Weight& conv, Tensor& tail,
                                    Tensor& mixed, Tensor& z, Tensor& beta, Tensor& g) override;
  void gated_delta_net_core(const Tensor& mixed, const Tensor& z, const Tensor& beta,
                            const Tensor& g, std::int64_t key_heads, std::int64_t head_dim,
                            const Weight& norm, float eps, Activation act, Tensor& state,
                            Tensor& normed) override;
  void route_experts(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                     Tensor& experts, Tensor& weights) override;
  void shared_expert(const Tensor& x, const Weight& gate, const Weight& up, const Weight& down,
                     const Weight& expert_gate, Tensor& y) override;
  // At one token five kernels (cuda_moe_block.cu): the router's GEMV, the routing and the shared
  // expert's gate/up in one grid, the routed gate/up and down, the shared down with the routed
  // combine as its accumulated base; otherwise (or FLASHSERVE_CUDA_MOE_BLOCK=0) the sequence.
  void moe_block(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                 const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                 const Weight& shared_up, const Weight& shared_down,
                 const Weight& shared_expert_gate, Tensor& experts, Tensor& weights,
                 Tensor& y) override;
  // The projection and the MoE block with the hyper-connection write in their last kernel
  // (cuda_linear.cu, cuda_moe_block.cu).
  void linear_into_streams(const Tensor& x, const Weight& w, const StreamsWrite& out) override;
  void moe_block_into_streams(const Tensor& x, const Weight& router, std::int64_t top_k,
                              bool normalize, const Weight& gate_up, const Weight& down,
                              const Weight& shared_gate, const Weight& shared_up,
                              const Weight& shared_down, const Weight& shared_expert_gate,
                              Tensor& experts, Tensor& weights, const StreamsWrite& out) override;

  bool set_dry_ops(bool on) override {
    dry_ = on;
    return true;
  }
  bool step_graphs() const override { return graphs_on_; }
  void set_step_graphs(bool on) override { graphs_on_ = on; }
  void begin_step_graph(const StepGraphKey& key) override;
  void launch_step_graph() override;
  void discard_step_graph() override;
  StepGraphStats step_graph_stats() const override { return graphs_.stats(); }

 private:
  explicit CudaBackend(std::shared_ptr<CudaMemory> memory) noexcept;
  // block_sparse_attention's body; with a gate, its kernels that write out (the merge, a one-split
  // tiled kernel) multiply by act(gate) as they write. False where the kernel taken does not (the
  // earlier kernels): the caller then runs mul_activated.
  bool attention_with_gate(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                           std::int64_t kv_heads, const Tensor& picked, std::int64_t block,
                           std::int64_t first, float scale, const Tensor* gate, Activation act,
                           Tensor& out);
  // A block-scaled or packed weight as stored (its bytes and its scales, two buffers; E8M0
  // scales of 128x128 FP8 blocks become f32, exact, so every FP8 kernel reads one scale type).
  Expected<Weight> upload_stored(const Weight& w);
  Expected<Weight> copy_stored(const Weight& w);
  // The IQ2_XXS codebook on the device (allocated and copied on first use; null on failure,
  // recorded).
  const std::uint8_t* iq2_grid();
  // y = x · W^T for a block-scaled FP8 W (cuda_linear.cu): GEMV for few rows, else widened
  // tiles and sgemm.
  void linear_fp8(const Tensor& x, const Weight& w, Tensor& y);
  // A prefill's y = x · w^T on the tensor cores (cuda_grouped_gemm.h): `launch` runs the product
  // (dense_product or dense_product_packed) with K split for narrow outputs (its partial sums in
  // the pooled scratch); the caller has checked that the product takes x and sized y.
  using DenseLaunch = std::function<cudaError_t(DenseSplit split, float* partials)>;
  void prefill_product(std::int64_t S, std::int64_t in, std::int64_t out,
                       const DenseLaunch& launch);
  // The same for a packed W (FP4 E2M1 + E8M0, GGUF blocks; cuda_linear_packed.cu): the packed
  // GEMV for up to 4 rows, else the tiles of cuda_grouped_packed.cu on the tensor cores
  // (FLASHSERVE_CUDA_PREFILL_SGEMM=1: rows dequantised into the pooled scratch and sgemm).
  void linear_packed(const Tensor& x, const Weight& w, Tensor& y);
  // The routed experts of a prefill as grouped products (cuda_grouped_gemm.h): the pairs of
  // `experts` sorted by expert into tiles of `tile_rows`, the caller's two products over the
  // sorted pairs (gate_up writes act [P, I], down part [P, H], both sized by the caller; `work`
  // is the sort's table), then the combine of part into y [S, H] in the CPU's order.
  using SortedProduct = std::function<cudaError_t(const std::int32_t* work)>;
  void grouped_experts(const Tensor& experts, const Tensor& weights, std::int64_t E, int tile_rows,
                       const SortedProduct& gate_up, const SortedProduct& down, const Tensor& part,
                       Tensor& y);
  // The routed experts with packed gate_up/down (cuda_moe_packed.cu): for up to 4 tokens, per
  // (token, expert) pair the packed GEMV core; past that the grouped products on the tensor cores
  // (cuda_grouped_packed.cu); then the combine in the CPU's order.
  void moe_experts_packed(const Tensor& x, const Weight& gate_up, const Weight& down,
                          const Tensor& experts, const Tensor& weights, float swiglu_limit,
                          Tensor& y);
  // The routed experts' first two kernels for 1-4 tokens (cuda_moe.cu, moe_experts' fused path)
  // on shapes it has checked, a slot per (token, expert) pair: act [S*k, I] = each pair's
  // swiglu(gate_up · x_token), part [S*k, H] = its down product (the combine is the caller's).
  // Queues them; false when a launch failed (recorded under `op`). with_down false: the gate/up
  // kernel only (the MoE block's one-token down + combine kernel takes act).
  bool moe_token_parts(const char* op, const Tensor& x, const Weight& gate_up, const Weight& down,
                       const Tensor& experts, float swiglu_limit, Tensor& act, Tensor& part,
                       bool with_down = true);
  // moe_block with its output in y_out, or (y_out null) written into the streams of `into`.
  void moe_block_to(const Tensor& x, const Weight& router, std::int64_t top_k, bool normalize,
                    const Weight& gate_up, const Weight& down, const Weight& shared_gate,
                    const Weight& shared_up, const Weight& shared_down,
                    const Weight& shared_expert_gate, Tensor& experts, Tensor& weights,
                    Tensor* y_out, const StreamsWrite* into);

  cudaStream_t stream() const { return cuda_memory_->stream(); }
  // Records "cuda: <op>: <error>" when the last launch failed; true when it did not.
  bool launched(const char* op);
  // The same for a launch helper's own result (cuda_grouped_gemm.h): an error it returns without
  // a CUDA call (a grid past its limit, a shared-memory limit refused) fails the op too.
  bool launched(const char* op, cudaError_t returned);
  bool cublas_ok(cublasStatus_t s, const char* op);
  // Records a failure unless every tensor lives in device memory / `w` was uploaded.
  bool on_device(const char* op, std::initializer_list<const Tensor*> tensors);
  // A packed weight is refused (naming its format) unless `packed_ok`: only the ops that decode
  // packed formats pass it, so every other op fails clearly instead of misreading the bytes.
  bool on_device(const char* op, const Weight& w, bool packed_ok = false);
  // Ends the open step; launches its graph when `run` and nothing failed.
  void end_step_graph(bool run);
  // Inside a replay's walk (or with dry ops, set_dry_ops): an op does its host work (checks,
  // outputs, step_scalar, staging) and then returns before queueing anything. Device copies are
  // CudaMemory's, which a replay's walk skips and dry ops do not.
  bool walking() const { return mode_ == StepMode::kWalk || dry_; }
  // A per-step scalar argument (StepScalar): its value eagerly; inside a step graph the next slot
  // of the graph's parameter block, written with `v` (the walk takes the slots in the order the
  // recording did).
  StepScalar step_scalar(std::int64_t v);
  // `member` eagerly (scratch kept between ops); inside a step graph a tensor of this step, so
  // the graph's nodes never point at scratch an eager op may regrow between replays.
  Tensor& scratch(Tensor& member);
  // Pinned bytes a host-to-device copy reads: eagerly a staging ring slot (then `staged()` after
  // queueing the copy); inside a step graph the graph's own buffer, in order. nullptr on failure
  // (recorded).
  void* host_staging(std::size_t bytes, const char* op);
  cudaError_t staged();
  // `bytes` of host memory at `src` copied to `device` through host_staging, queued on the
  // stream. False when the caller queues nothing more: a failure (recorded, naming `op`) or a
  // replay's walk (the recorded copy reads the staging just written).
  bool stage_to_device(const void* src, std::size_t bytes, void* device, const char* op);
  // Records a failure naming the op unless `ok`.
  bool check(bool ok, const char* op, const char* what);
  // The slices' maxima and sums of softmax(x / temperature) over each row of x (pooled [rows,
  // slices] tensors; cuda_sampling.cu), queued on the stream: what the sampling ops over whole
  // rows start from. False when the pool failed or a replay walks.
  bool softmax_slices(const Tensor& x, double temperature, Tensor& part_max, Tensor& part_sum);
  Expected<Weight> upload_index_table(const Weight& w);
  // y[:, col0 : col0 + n] (leading dimension ldy) = x[S, in] · w[n, in]^T, all f32.
  bool sgemm(const float* x, std::int64_t S, std::int64_t in, const float* w, std::int64_t n,
             float* y, std::int64_t ldy);
  // `chunks`: the chunked op, which takes delta_rule_chunks where delta_chunks_take says so.
  void delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                  const Tensor& beta, std::int64_t key_heads, Tensor& state, Tensor& out,
                  Tensor* states, const char* op, bool chunks = false);
  static bool delta_chunks_take(std::int64_t S, std::int64_t dk, std::int64_t dv, bool per_channel);
  // The chunk kernels on shapes delta_rule has checked (out sized); queues nothing when walking.
  void delta_rule_chunks(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                         const Tensor& beta, std::int64_t key_heads, Tensor& state, Tensor& out);
  void run_topk(const Tensor& x, std::int64_t k, std::int64_t first, std::int64_t block,
                Tensor& idx, Tensor* val, const char* op);

  std::shared_ptr<Memory> memory_;
  CudaMemory* cuda_memory_;
  const CublasApi* blas_ = nullptr;  // cuda_blas.h: opened by create()
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cublas_workspace_;
  std::mutex weights_mutex_;
  std::vector<DeviceBuffer> weights_;  // uploaded weights, alive as long as the backend
  // IQ2_XXS's codebook (quant::kIq2XxsGrid, 2 KB) in device memory, copied there by the first
  // IQ2_XXS upload (at load, never inside a step graph); the packed kernels read it.
  DeviceBuffer iq2_grid_;
  HostStaging staging_;
  // Step graphs (docs/GPU.md): off unless FLASHSERVE_CUDA_GRAPHS=1 at construction (with the
  // fused decode ops eager steps are as fast and MTP rounds faster: bench/NOTES.md). mode_ says
  // whether the ops are run (eager), recorded (the first step of a key) or walked (a replay);
  // step_ is the graph of the open step.
  enum class StepMode { kEager, kCapture, kWalk };
  bool graphs_on_ = false;
  bool dry_ = false;  // set_dry_ops
  StepMode mode_ = StepMode::kEager;
  StepGraph* step_ = nullptr;
  std::int64_t walk_began_ns_ = 0;
  std::deque<Tensor> step_scratch_;  // scratch() inside a step, released at its end
  StepGraphs graphs_;
  // Pooled scratch, kept between calls so warm ops allocate nothing.
  Tensor widened_;       // bf16 weight tiles widened to f32 for cuBLAS
  Tensor embed_in_;      // embedding row descriptors and host-gathered rows
  Tensor moe_act_;       // [S*k, I]
  Tensor moe_out_;       // [S*k, H]
  Tensor split_k_;       // prefill_product's partial sums [splits * S, out]
  Tensor moe_sort_;      // prefill's pairs sorted by expert and their tiles (cuda_grouped_gemm.h)
  Tensor conv_tmp_;      // causal_conv1d output when y aliases x
  Tensor delta_chunks_;  // the chunk kernels' per-(chunk, head) W, U, QK, Qe, Kd, exp(G_last)
};

}  // namespace fs::cuda
