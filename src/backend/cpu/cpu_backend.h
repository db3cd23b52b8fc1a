// The fp32 CPU reference backend. Products go to OpenBLAS (sgemm, one BLAS thread, split over
// the backend's pool); bf16 weights are converted tile by tile into a scratch buffer just before
// each product, so no f32 copy of a bf16 checkpoint is ever held (a tile is at most 1 MiB per
// thread). The other inner loops are cpu_kernels.h, vectorised per CPU; ops run on the pool
// (cpu_threads.cpp) when the work is large enough.
//
// Its tensors live in host memory, and it computes on the mapped checkpoint in place: `upload`
// returns the view unless a conversion is asked for (an f32 matrix stored as bf16, a bf16 vector
// widened to f32), whose result the backend owns for its whole life.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace fs {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  const std::shared_ptr<Memory>& memory() const override { return host_memory(); }
  Expected<Weight> upload(const Weight& w, DType matrix_dtype) override;

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

  void stream_mean(const Tensor& x, std::int64_t streams, Tensor& out) override;
  void add_scaled_streams(Tensor& h, const Tensor& y, const Tensor& w) override;
  void grouped_dot(const Tensor& a, const Tensor& b, std::int64_t group, Tensor& out) override;
  void mhc_weights(const Tensor& h, const Tensor& m, const Weight& base, const Weight& scale,
                   std::int64_t streams, float norm_eps, float hc_eps, std::int64_t sinkhorn_iters,
                   Tensor& pre, Tensor* post, Tensor* comb) override;
  void weighted_stream_sum(const Tensor& x, const Tensor& w, Tensor& out) override;
  void mhc_expand(Tensor& h, const Tensor& y, const Tensor& post, const Tensor& comb) override;
  void stream_mix(const Tensor& xn, const Tensor& u, const Weight& up, std::int64_t streams,
                  Tensor& out) override;

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
  void block_sparse_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t heads,
                              std::int64_t kv_heads, const Tensor& picked, std::int64_t block,
                              std::int64_t first, float scale, Tensor& out) override;

  // DeepSeek V4's compressed attention (cpu_compressed.cpp).
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
  // The official graph's numerics (cpu_quant_simulation.cpp).
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
  void argmax_rows(const Tensor& x, Tensor& ids) override;
  void softmax_denominators(const Tensor& x, double temperature, Tensor& totals) override;
  void sample_rows(const Tensor& x, double temperature, std::span<const double> u,
                   Tensor& ids) override;
  void token_probs(const Tensor& x, double temperature, std::span<const std::int32_t> ids,
                   Tensor& probs) override;
  void sample_residual_rows(const Tensor& p, const Tensor& q, double temperature,
                            std::span<const double> u, Tensor& ids) override;
  void penalise_entries(Tensor& x, std::span<const EntryPenalty> entries) override;
  void select_blocks(const Tensor& scores, std::int64_t first, std::int64_t block, std::int64_t top,
                     Tensor& picked) override;
  void moe_experts(const Tensor& x, const Weight& gate_up, const Weight& down,
                   const Tensor& experts, const Tensor& weights, float swiglu_limit,
                   Tensor& y) override;
  void select_experts(const Tensor& scores, const Weight& bias, const Weight& table,
                      const Tensor* token_ids, std::int64_t groups, std::int64_t top_groups,
                      std::int64_t k, bool normalize, float scaling, Tensor& experts,
                      Tensor& weights) override;

 private:
  // A vector op's weight must be an f32 host vector (`upload` makes one); false (recorded) if not.
  bool check_vector(const Weight& w, const char* op);
  // An op that reads a matrix's elements (F32, BF16 or F16; no scales, not packed): false
  // (recorded, naming the format) otherwise.
  bool check_elements(const Weight& w, const char* op);
  // Records an invalid-argument failure naming `op` unless ok.
  bool check(bool ok, const char* op, const char* what);

  // Converted weights `upload` handed out; the deques never move an element once stored.
  std::mutex owned_mutex_;
  std::deque<std::vector<std::uint16_t>> owned_bf16_;
  std::deque<std::vector<float>> owned_f32_;
};

// The backend's threads (cpu_threads.cpp): a pool of hardware_concurrency - 1 workers and the
// caller. cpu_parallel_for runs fn(i) for i in [0, n) on them when `work` (a rough count of
// flops) makes it worth waking a worker, otherwise inline (as it does inside a job, or while
// another thread's job holds the pool). cpu_parallel_ranges cuts [0, n) into `per_thread`
// contiguous ranges [begin, end) per thread: a few by default, so that a thread that runs late
// (a busy machine) or slow holds up little; one where each range has a fixed cost (a product
// packs its operands).
std::int64_t cpu_threads();
void cpu_parallel_for(std::int64_t n, double work, const std::function<void(std::int64_t)>& fn);
void cpu_parallel_ranges(std::int64_t n, double work,
                         const std::function<void(std::int64_t, std::int64_t)>& fn,
                         std::int64_t per_thread = 4);

// OpenBLAS for this CPU, once per process (cpu_blas.cpp): kernels of the instruction set the CPU
// has when the library's own detection fell short, and one BLAS thread (products are split over
// the pool above). `make_cpu_backend` calls it; cpu_blas_kernels names the kernels in use.
void cpu_blas_setup();
std::string cpu_blas_kernels();

}  // namespace fs
