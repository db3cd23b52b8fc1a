// The backend op suite, in the manner of llama.cpp's tests/test-backend-ops.cpp.
//
// 1. Parity (`BackendOps.MatchesCpu`): every op, at the fixtures' small shapes and at the
//    released model's shapes, runs on the CPU backend (the reference) and on the backend under
//    test from the same host inputs (copied into its memory with Tensor::to, weights through
//    `upload`); the outputs come back to the host and are compared with a normalised error,
//      err = max |got - ref| / max(1, max |ref|),
//    against a tolerance stated per op (index outputs must match exactly). Adding an op adds one
//    entry to `all_cases()`. The "Cuda" instantiation runs when a GPU is present (ctest label
//    `gpu`) and is skipped otherwise; the "Cpu" instantiation puts the CPU under test against
//    itself, which checks the harness and that the CPU is deterministic.
// 2. The CPU against direct computations (`CpuOps.*`): what makes the CPU a reference.
// 3. Failure recording (`BackendStatus.*`) and the device-aware Tensor (`TensorTest.*`).
#include <gtest/gtest.h>

#include <stdlib.h>  // setenv, unsetenv
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "tensor/quant/block_scaled.h"
#include "tensor/quant/minifloat.h"

namespace fs {
namespace {

// ---------------------------------------------------------------------------------------------
// Host inputs.

// Uniform values in [-scale, scale) from a counter-based hash: fast enough to fill a vocabulary
// matrix, and the same on every machine.
std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float uniform_at(std::uint64_t seed, std::uint64_t i, float scale) {
  const auto bits = splitmix64(seed * 0x100000001b3ull + i) >> 40;  // 24 bits
  return (static_cast<float>(bits) / 8388608.0f - 1.0f) * scale;
}

// fn(begin, end) over [0, n) split across the host's cores.
void parallel_chunks(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  const auto threads = static_cast<std::int64_t>(
      n < (1 << 20) ? 1 : std::max(1u, std::thread::hardware_concurrency()));
  if (threads == 1) return fn(0, n);
  std::vector<std::jthread> pool;
  for (std::int64_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { fn(n * t / threads, n * (t + 1) / threads); });
}

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : seed_(seed), engine_(seed) {}
  std::uint64_t next_seed() { return splitmix64(seed_ + ++calls_); }
  std::mt19937_64& engine() { return engine_; }
  int below(int n) { return std::uniform_int_distribution<int>(0, n - 1)(engine_); }

 private:
  std::uint64_t seed_, calls_ = 0;
  std::mt19937_64 engine_;
};

void fill_uniform(float* p, std::int64_t n, Rng& rng, float scale) {
  const auto seed = rng.next_seed();
  parallel_chunks(n, [&](std::int64_t b, std::int64_t e) {
    for (auto i = b; i < e; ++i) p[i] = uniform_at(seed, static_cast<std::uint64_t>(i), scale);
  });
}

Tensor random_tensor(Shape shape, Rng& rng, float scale = 1.0f) {
  Tensor t(std::move(shape));
  fill_uniform(t.data(), t.numel(), rng, scale);
  return t;
}

Tensor i32_tensor(Shape shape, const std::vector<std::int32_t>& values) {
  Tensor t(host_memory(), std::move(shape), DType::kI32);
  EXPECT_EQ(static_cast<std::int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.data_as<std::int32_t>());
  return t;
}

// A weight in host memory (f32 or bf16). The buffer comes from calloc, so a huge weight of which
// only some slices are filled (the routed experts) costs memory for those slices alone.
class HostWeight {
 public:
  HostWeight() = default;
  HostWeight(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
    bytes_ = static_cast<std::size_t>(shape_numel(shape_)) * dtype_size(dtype_);
    data_.reset(static_cast<std::uint8_t*>(std::calloc(std::max<std::size_t>(bytes_, 1), 1)));
  }
  Weight view() const { return {dtype_, shape_, data_.get(), Device::kHost}; }
  DType dtype() const { return dtype_; }
  std::uint8_t* bytes() { return data_.get(); }
  // Random values in elements [begin, begin + n).
  void fill(Rng& rng, float scale, std::int64_t begin = 0, std::int64_t n = -1) {
    if (n < 0) n = shape_numel(shape_) - begin;
    const auto seed = rng.next_seed();
    parallel_chunks(n, [&](std::int64_t b, std::int64_t e) {
      for (auto i = begin + b; i < begin + e; ++i) {
        const float v = uniform_at(seed, static_cast<std::uint64_t>(i), scale);
        if (dtype_ == DType::kF32) {
          reinterpret_cast<float*>(data_.get())[i] = v;
        } else {
          reinterpret_cast<std::uint16_t*>(data_.get())[i] = f32_to_bf16(v);
        }
      }
    });
  }
  // The values as f32 (for direct computations in tests).
  std::vector<float> to_f32() const {
    std::vector<float> out(static_cast<std::size_t>(shape_numel(shape_)));
    convert_to_f32(dtype_, data_.get(), out.data(), out.size());
    return out;
  }

 private:
  struct Free {
    void operator()(std::uint8_t* p) const { std::free(p); }
  };
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::size_t bytes_ = 0;
  std::unique_ptr<std::uint8_t, Free> data_;
};

// A block-scaled FP8 weight in host memory, the FP8 releases' layout (backend/weight.h): e4m3
// codes [.., out, in] and an f32 scale per 128x128 block [.., ceil(out/128), ceil(in/128)].
// Codes are uniform over every finite code (subnormals and both zeros included), scales uniform
// in [0.5, 1.5) * scale / 448, so weights stay within 1.5 * scale. Matrices of a stacked tensor
// are filled on request (`fill`), the rest stay zero (codes and scales), as HostWeight's.
class HostFp8Weight {
 public:
  HostFp8Weight(Shape shape) : shape_(std::move(shape)) {
    rows_ = shape_[shape_.size() - 2];
    cols_ = shape_.back();
    matrices_ = shape_numel(shape_) / std::max<std::int64_t>(rows_ * cols_, 1);
    gr_ = (rows_ + 127) / 128;
    gc_ = (cols_ + 127) / 128;
    codes_.assign(static_cast<std::size_t>(shape_numel(shape_)), 0);
    scales_.assign(static_cast<std::size_t>(matrices_ * gr_ * gc_), 0.0f);
  }
  void fill(Rng& rng, float scale, std::int64_t matrix) {
    const auto seed = rng.next_seed();
    std::uint8_t* c = codes_.data() + matrix * rows_ * cols_;
    parallel_chunks(rows_ * cols_, [&](std::int64_t b, std::int64_t e) {
      for (auto i = b; i < e; ++i) {
        auto code = static_cast<std::uint8_t>(splitmix64(seed + static_cast<std::uint64_t>(i)));
        if ((code & 0x7f) == 0x7f) code &= 0xfe;  // not NaN
        c[i] = code;
      }
    });
    std::uniform_real_distribution<float> d(0.5f, 1.5f);
    for (std::int64_t i = 0; i < gr_ * gc_; ++i)
      scales_[static_cast<std::size_t>(matrix * gr_ * gc_ + i)] = d(rng.engine()) * scale / 448;
  }
  void fill_all(Rng& rng, float scale) {
    for (std::int64_t m = 0; m < matrices_; ++m) fill(rng, scale, m);
  }
  Weight view() const {
    Weight w{DType::kF8E4M3, shape_, codes_.data(), Device::kHost};
    w.scales.data = reinterpret_cast<const std::uint8_t*>(scales_.data());
    return w;
  }
  // Every weight dequantised whole (quant::dequantize per matrix): the f32 reference.
  std::vector<float> dequantized() const {
    std::vector<float> out;
    out.reserve(codes_.size());
    for (std::int64_t m = 0; m < matrices_; ++m) {
      quant::ScaledMatrix sm;
      sm.rows = rows_;
      sm.cols = cols_;
      sm.weights = std::span(codes_).subspan(static_cast<std::size_t>(m * rows_ * cols_),
                                             static_cast<std::size_t>(rows_ * cols_));
      sm.scales.bytes = {reinterpret_cast<const std::uint8_t*>(scales_.data() + m * gr_ * gc_),
                         static_cast<std::size_t>(gr_ * gc_) * sizeof(float)};
      auto dq = quant::dequantize(sm);
      EXPECT_TRUE(dq.ok()) << dq.status().to_string();
      if (dq.ok()) out.insert(out.end(), dq->begin(), dq->end());
    }
    return out;
  }
  const Shape& shape() const { return shape_; }

 private:
  Shape shape_;
  std::int64_t rows_ = 0, cols_ = 0, matrices_ = 0, gr_ = 0, gc_ = 0;
  std::vector<std::uint8_t> codes_;
  std::vector<float> scales_;
};

HostWeight random_weight(DType dtype, Shape shape, Rng& rng, float scale = 1.0f) {
  HostWeight w(dtype, std::move(shape));
  w.fill(rng, scale);
  return w;
}

// ---------------------------------------------------------------------------------------------
// The parity harness.

// Moves host inputs into a backend: activations by copy into its memory, weights by `upload`
// (matrices kept in the dtype the case gives them, so both backends compute on equal values).
struct Feed {
  Backend& be;
  Tensor in(const Tensor& host) const { return host.to(be.memory()); }
  Weight w(const HostWeight& hw) const {
    auto up = be.upload(hw.view(), hw.dtype());
    EXPECT_TRUE(up.ok()) << be.name() << " upload: " << up.status().to_string();
    return up.ok() ? *up : Weight{};
  }
  Weight w(const HostFp8Weight& hw) const {
    auto up = be.upload(hw.view(), DType::kBF16);  // block-scaled: kept as stored
    EXPECT_TRUE(up.ok()) << be.name() << " upload: " << up.status().to_string();
    EXPECT_TRUE(!up.ok() || up->block_scaled()) << be.name() << " widened an FP8 weight";
    return up.ok() ? *up : Weight{};
  }
};

// A case builds its host inputs once and returns the function that runs the op on a backend
// and returns the output tensors (in that backend's memory).
using OpRun = std::function<std::vector<Tensor>(const Feed&)>;
struct Case {
  std::string name;  // op_shape..., unique; letters, digits and '_'
  double tolerance;  // on max |got - ref| / max(1, max |ref|)
  std::function<OpRun(Rng&)> build;
};

std::string dt(DType d) {
  return d == DType::kBF16 ? "bf16" : "f32";
}
std::string n(std::int64_t v) {
  return std::to_string(v);
}

// Tolerances. Reordered fp32 sums of up to a few thousand terms stay near 1e-6 of the largest
// magnitude; products over 2560-wide rows and the chunked delta rule (a triangular solve per
// chunk) get more room.
constexpr double kExact = 0.0;  // pure data movement
constexpr double kElementwise = 1e-6;
constexpr double kReduction = 1e-5;  // norms, softmax, means, dots over one row
constexpr double kProduct = 1e-4;    // linear, attention, MoE
constexpr double kDeltaRule = 2e-4;

// Values on `levels` steps of 1/levels in [-1, 1) (ties everywhere), with every eighth zero
// negated (-0 and +0 rank as equals), the same bits on every backend.
// A switch a test sets between two runs of an op is unset again however the test ends.
struct UnsetOnExit {
  const char* var;
  ~UnsetOnExit() { unsetenv(var); }
};

Tensor tied_tensor(Shape shape, Rng& rng, int levels) {
  Tensor t = random_tensor(std::move(shape), rng);
  float* p = t.data();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    p[i] = std::floor(p[i] * static_cast<float>(levels)) / static_cast<float>(levels);
    if (p[i] == 0.0f && i % 8 == 0) p[i] = -0.0f;
  }
  return t;
}

// Random distinct visible blocks per query (in random order), -1 past min(top, visible).
Tensor random_picks(std::int64_t S, std::int64_t first, std::int64_t block, std::int64_t top,
                    Rng& rng) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(S * top), -1);
  std::vector<std::int32_t> all;
  for (std::int64_t s = 0; s < S; ++s) {
    const auto visible = (first + s + 1) / block;
    all.resize(static_cast<std::size_t>(visible));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.engine());
    for (std::int64_t j = 0; j < std::min(top, visible); ++j)
      v[static_cast<std::size_t>(s * top + j)] = all[static_cast<std::size_t>(j)];
  }
  return i32_tensor({S, top}, v);
}

// Distinct experts per token, and positive weights summing to 1.
std::pair<Tensor, Tensor> random_routing(std::int64_t S, std::int64_t E, std::int64_t k, Rng& rng) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(S * k));
  std::vector<float> w(ids.size());
  std::vector<std::int32_t> all(static_cast<std::size_t>(E));
  for (std::int64_t s = 0; s < S; ++s) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng.engine());
    float sum = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      ids[static_cast<std::size_t>(s * k + j)] = all[static_cast<std::size_t>(j)];
      sum += (w[static_cast<std::size_t>(s * k + j)] = 0.1f + static_cast<float>(rng.below(100)));
    }
    for (std::int64_t j = 0; j < k; ++j) w[static_cast<std::size_t>(s * k + j)] /= sum;
  }
  return {i32_tensor({S, k}, ids), Tensor({S, k}, w)};
}

// The inputs of a Qwen MoE block (Backend::moe_block): x [S, H], the router [E, H] and the
// shared expert's gate, up, down and scalar gate, f32 or bf16 (`dtype`); or, when fp8, the routed
// and shared matrices block-scaled FP8 beside a router and scalar gate of `dtype` (the FP8
// releases' layout). Only the experts the CPU routes a token to are filled, with a margin of six
// past the top k (a routing an ulp apart on another backend still finds filled experts), as the
// moe_experts cases fill only the routed ones.
struct MoeBlockShape {
  std::int64_t S, H, E, k, I, Is;
  DType dtype;
  bool fp8;
  std::string name() const {
    return "moe_block_S" + n(S) + "_H" + n(H) + "_E" + n(E) + "_k" + n(k) + "_I" + n(I) + "_Is" +
           n(Is) + (fp8 ? "_fp8_gate_" : "_") + dt(dtype);
  }
};
struct MoeBlockInputs {
  MoeBlockShape c;
  Tensor x;
  std::shared_ptr<HostWeight> router, shared_expert_gate;
  std::shared_ptr<HostWeight> gate_up, down, gate, up, shared_down;          // !fp8
  std::shared_ptr<HostFp8Weight> gate_up8, down8, gate8, up8, shared_down8;  // fp8

  // {experts, weights, y} of moe_block on f's backend, or of its sequence (route_experts,
  // moe_experts, shared_expert) when `sequence`.
  // The block's weights on f's backend.
  struct Uploaded {
    Weight r, eg, gu, dn, sg, su, sd;
  };
  Uploaded upload(const Feed& f) const {
    return {f.w(*router),
            f.w(*shared_expert_gate),
            c.fp8 ? f.w(*gate_up8) : f.w(*gate_up),
            c.fp8 ? f.w(*down8) : f.w(*down),
            c.fp8 ? f.w(*gate8) : f.w(*gate),
            c.fp8 ? f.w(*up8) : f.w(*up),
            c.fp8 ? f.w(*shared_down8) : f.w(*shared_down)};
  }
  std::vector<Tensor> run(const Feed& f, bool sequence) const {
    const auto [r, eg, gu, dn, sg, su, sd] = upload(f);
    const Tensor xin = f.in(x);
    Tensor experts, weights, y;
    if (sequence) {
      f.be.route_experts(xin, r, c.k, true, experts, weights);
      f.be.moe_experts(xin, gu, dn, experts, weights, 0, y);
      f.be.shared_expert(xin, sg, su, sd, eg, y);
    } else {
      f.be.moe_block(xin, r, c.k, true, gu, dn, sg, su, sd, eg, experts, weights, y);
    }
    return {experts, weights, y};
  }
  // {experts, weights, h} of the block written into the streams of h (`streams` of them, gates
  // `inject`): moe_block_into_streams, or when `sequence` moe_block then add_scaled_streams.
  Tensor h, inject;
  std::vector<Tensor> run_into_streams(const Feed& f, bool sequence) const {
    const auto [r, eg, gu, dn, sg, su, sd] = upload(f);
    const Tensor xin = f.in(x), gates = f.in(inject);
    Tensor experts, weights, streams = f.in(h);
    if (sequence) {
      Tensor y;
      f.be.moe_block(xin, r, c.k, true, gu, dn, sg, su, sd, eg, experts, weights, y);
      f.be.add_scaled_streams(streams, y, gates);
    } else {
      f.be.moe_block_into_streams(xin, r, c.k, true, gu, dn, sg, su, sd, eg, experts, weights,
                                  {streams, gates});
    }
    return {experts, weights, streams};
  }
};
std::shared_ptr<const MoeBlockInputs> moe_block_inputs(const MoeBlockShape& c, Rng& rng) {
  auto in = std::make_shared<MoeBlockInputs>();
  in->c = c;
  const float hs = 1.0f / std::sqrt(static_cast<float>(c.H));
  const float is = 1.0f / std::sqrt(static_cast<float>(c.I));
  const float iss = 1.0f / std::sqrt(static_cast<float>(c.Is));
  in->x = random_tensor({c.S, c.H}, rng);
  in->h = random_tensor({c.S, 4 * c.H}, rng, 2.0f);
  in->inject = random_tensor({c.S, 4}, rng, 1.0f);
  in->router = std::make_shared<HostWeight>(random_weight(c.dtype, {c.E, c.H}, rng, 3 * hs));
  in->shared_expert_gate =
      std::make_shared<HostWeight>(random_weight(c.dtype, {1, c.H}, rng, 4 * hs));
  std::vector<bool> used(static_cast<std::size_t>(c.E));
  {
    auto cpu = make_cpu_backend();
    const Feed f{*cpu};
    Tensor ids, w;
    cpu->route_experts(f.in(in->x), f.w(*in->router), std::min(c.E, c.k + 6), true, ids, w);
    EXPECT_TRUE(cpu->status().ok()) << cpu->status().to_string();
    for (std::int64_t i = 0; i < ids.numel(); ++i)
      if (const auto e = ids.data_as<std::int32_t>()[i]; e >= 0 && e < c.E)
        used[static_cast<std::size_t>(e)] = true;
  }
  if (c.fp8) {
    in->gate_up8 = std::make_shared<HostFp8Weight>(Shape{c.E, 2 * c.I, c.H});
    in->down8 = std::make_shared<HostFp8Weight>(Shape{c.E, c.H, c.I});
    for (std::int64_t e = 0; e < c.E; ++e) {
      if (!used[static_cast<std::size_t>(e)]) continue;
      in->gate_up8->fill(rng, hs, e);
      in->down8->fill(rng, is, e);
    }
    in->gate8 = std::make_shared<HostFp8Weight>(Shape{c.Is, c.H});
    in->up8 = std::make_shared<HostFp8Weight>(Shape{c.Is, c.H});
    in->shared_down8 = std::make_shared<HostFp8Weight>(Shape{c.H, c.Is});
    in->gate8->fill_all(rng, hs);
    in->up8->fill_all(rng, hs);
    in->shared_down8->fill_all(rng, iss);
  } else {
    in->gate_up = std::make_shared<HostWeight>(c.dtype, Shape{c.E, 2 * c.I, c.H});
    in->down = std::make_shared<HostWeight>(c.dtype, Shape{c.E, c.H, c.I});
    for (std::int64_t e = 0; e < c.E; ++e) {
      if (!used[static_cast<std::size_t>(e)]) continue;
      in->gate_up->fill(rng, hs, e * 2 * c.I * c.H, 2 * c.I * c.H);
      in->down->fill(rng, is, e * c.H * c.I, c.H * c.I);
    }
    in->gate = std::make_shared<HostWeight>(random_weight(c.dtype, {c.Is, c.H}, rng, hs));
    in->up = std::make_shared<HostWeight>(random_weight(c.dtype, {c.Is, c.H}, rng, hs));
    in->shared_down = std::make_shared<HostWeight>(random_weight(c.dtype, {c.H, c.Is}, rng, iss));
  }
  return in;
}

// A GatedDeltaNet decode step's inputs (one token on a warm state): x [1, in], the in-projections
// (`dtype`, or block-scaled FP8 when fp8) over qkv (2 * Hk * dk + Hv * dv rows), z, b and a, the
// conv [C, 4] (`conv_dtype`) with its tail, the state and the gated norm's weight [dv].
struct GdnStepShape {
  std::int64_t in, Hk, Hv, dk, dv;
  DType dtype;
  bool fp8;
  DType conv_dtype;
  std::string name() const {
    return "in" + n(in) + "_Hk" + n(Hk) + "_Hv" + n(Hv) + "_dk" + n(dk) + "_dv" + n(dv) +
           (fp8 ? "_fp8" : "_" + dt(dtype)) + "_conv_" + dt(conv_dtype);
  }
};
struct GdnStepInputs {
  GdnStepShape c;
  Tensor x, tail, state;
  std::shared_ptr<HostWeight> qkv, z, b, a;         // !fp8
  std::shared_ptr<HostFp8Weight> qkv8, z8, b8, a8;  // fp8
  std::shared_ptr<HostWeight> dt_bias, decay, conv, norm;

  std::int64_t key_dim() const { return c.Hk * c.dk; }
  std::int64_t value_dim() const { return c.Hv * c.dv; }
  // {normed, z, beta, g, tail, state}: the two decode-step ops, or (`sequence`) the ops the model
  // runs for a verify (gated_delta_net_in_proj, gated_delta_net_conv, the recurrence,
  // rms_norm_gated), whose bits a decode step must keep.
  std::vector<Tensor> run(const Feed& f, bool sequence) const {
    Weight wq, wz, wb, wa;
    if (c.fp8) {
      wq = f.w(*qkv8), wz = f.w(*z8), wb = f.w(*b8), wa = f.w(*a8);
    } else {
      wq = f.w(*qkv), wz = f.w(*z), wb = f.w(*b), wa = f.w(*a);
    }
    const auto wdt = f.w(*dt_bias), wdecay = f.w(*decay), wconv = f.w(*conv), wnorm = f.w(*norm);
    auto t = f.in(tail), st = f.in(state);
    const auto xin = f.in(x);
    Tensor oz, beta, g, normed;
    const float eps = 1e-6f;
    if (!sequence) {
      Tensor mixed;
      f.be.gated_delta_net_in_proj_conv(xin, wq, wz, wb, wa, wdt, wdecay, wconv, t, mixed, oz, beta,
                                        g);
      f.be.gated_delta_net_core(mixed, oz, beta, g, c.Hk, c.dk, wnorm, eps, Activation::kSilu, st,
                                normed);
      return {normed, oz, beta, g, t, st};
    }
    Tensor oqkv, q, k, v, core;
    f.be.gated_delta_net_in_proj(xin, wq, wz, wb, wa, wdt, wdecay, oqkv, oz, beta, g);
    f.be.gated_delta_net_conv(oqkv, wconv, t, key_dim(), c.dk, q, k, v);
    f.be.gated_delta_rule_recurrent(q, k, v, g, beta, c.Hk, st, core);
    core.reshape({c.Hv, c.dv});
    f.be.rms_norm_gated(core, wnorm, oz, eps, Activation::kSilu, normed);
    normed.reshape({1, value_dim()});
    return {normed, oz, beta, g, t, st};
  }
};

std::shared_ptr<GdnStepInputs> gdn_step_inputs(const GdnStepShape& c, Rng& rng) {
  auto in = std::make_shared<GdnStepInputs>();
  in->c = c;
  const auto C = 2 * c.Hk * c.dk + c.Hv * c.dv;
  const float ws = 1.0f / std::sqrt(static_cast<float>(c.in));
  in->x = random_tensor({1, c.in}, rng);
  if (c.fp8) {
    auto make = [&](std::int64_t rows, float scale) {
      auto w = std::make_shared<HostFp8Weight>(Shape{rows, c.in});
      w->fill_all(rng, scale);
      return w;
    };
    in->qkv8 = make(C, 4 * ws), in->z8 = make(c.Hv * c.dv, 4 * ws);
    in->b8 = make(c.Hv, 8 * ws), in->a8 = make(c.Hv, 8 * ws);
  } else {
    auto make = [&](std::int64_t rows, float scale) {
      return std::make_shared<HostWeight>(random_weight(c.dtype, {rows, c.in}, rng, scale));
    };
    in->qkv = make(C, 4 * ws), in->z = make(c.Hv * c.dv, 4 * ws);
    in->b = make(c.Hv, 8 * ws), in->a = make(c.Hv, 8 * ws);
  }
  in->dt_bias = std::make_shared<HostWeight>(random_weight(DType::kF32, {c.Hv}, rng));
  // decay_rate = -exp(A_log): negative, so g is a log decay.
  auto decay = random_weight(DType::kF32, {c.Hv}, rng);
  for (std::int64_t i = 0; i < c.Hv; ++i) {
    float* p = reinterpret_cast<float*>(decay.bytes()) + i;
    *p = -0.1f - std::fabs(*p);
  }
  in->decay = std::make_shared<HostWeight>(std::move(decay));
  in->conv = std::make_shared<HostWeight>(random_weight(c.conv_dtype, {C, 4}, rng, 0.5f));
  in->norm = std::make_shared<HostWeight>(random_weight(DType::kF32, {c.dv}, rng));
  in->tail = random_tensor({3, C}, rng, 2.0f);
  in->state = random_tensor({c.Hv, c.dk, c.dv}, rng, 0.1f);
  return in;
}

// The released shapes (bf16 and FP8 projections, bf16 conv) and small ones: key heads of 48 and
// 64 channels, two and one column tiles a value head, an f32 conv.
const std::vector<GdnStepShape>& gdn_step_shapes() {
  static const std::vector<GdnStepShape> shapes{
      {2560, 16, 48, 128, 128, DType::kBF16, false, DType::kBF16},
      {2560, 16, 48, 128, 128, DType::kBF16, true, DType::kBF16},
      {256, 2, 4, 64, 64, DType::kF32, false, DType::kF32},
      {256, 2, 6, 48, 32, DType::kBF16, false, DType::kF32},
      {512, 4, 8, 128, 96, DType::kF32, true, DType::kBF16}};
  return shapes;
}

// The Qwen MoE block cases: the released shapes at 1-4 tokens (a decode step and an MTP verify)
// in bf16 and FP8 (moe_block's fused kernels on the GPU), small widths on and off the 16-byte
// chunks (the fused kernels on 8-lane groups in f32; the element paths, so the sequence, in bf16).
const std::vector<MoeBlockShape>& moe_block_shapes() {
  static const std::vector<MoeBlockShape> shapes{{1, 2560, 512, 10, 640, 640, DType::kBF16, false},
                                                 {1, 2560, 512, 10, 640, 640, DType::kBF16, true},
                                                 {2, 2560, 512, 10, 640, 640, DType::kBF16, false},
                                                 {2, 2560, 512, 10, 640, 640, DType::kBF16, true},
                                                 {3, 2560, 512, 10, 640, 640, DType::kBF16, true},
                                                 {4, 2560, 512, 10, 640, 640, DType::kBF16, true},
                                                 {4, 2560, 512, 10, 640, 640, DType::kBF16, false},
                                                 {1, 72, 6, 3, 36, 40, DType::kF32, false},
                                                 {3, 72, 6, 3, 36, 40, DType::kF32, false},
                                                 {1, 70, 6, 3, 37, 37, DType::kBF16, false},
                                                 {1, 256, 8, 2, 192, 192, DType::kF32, true},
                                                 {4, 256, 8, 2, 192, 192, DType::kF32, true}};
  return shapes;
}

// The inputs of linear_into_streams: x [S, in], w [out, in] (`dtype` or block-scaled FP8), h
// [S, streams * out] and the gates [S, streams].
struct LinearStreamsShape {
  std::int64_t S, in, out, streams;
  DType dtype;
  bool fp8;
  std::string name() const {
    return "linear_into_streams_S" + n(S) + "_in" + n(in) + "_out" + n(out) + "_st" + n(streams) +
           (fp8 ? "_fp8" : "_" + dt(dtype));
  }
};
struct LinearStreamsInputs {
  LinearStreamsShape c;
  Tensor x, h, inject;
  Tensor dh, dinject, dx;  // added to h, the gates and x right before the op when `writes_before`
  std::shared_ptr<HostWeight> w;
  std::shared_ptr<HostFp8Weight> w8;
  // {h}: linear_into_streams, or when `sequence` linear then add_scaled_streams. writes_before:
  // kernels that write h, then the gates, then x run right before the op, the nearest its
  // contract lets their writers be (backend.h: h and the gates are read before the wait).
  std::vector<Tensor> run(const Feed& f, bool sequence, bool writes_before = false) const {
    const Weight wt = c.fp8 ? f.w(*w8) : f.w(*w);
    Tensor xin = f.in(x), gates = f.in(inject), streams = f.in(h);
    if (writes_before) {
      f.be.add(streams, f.in(dh));
      f.be.add(gates, f.in(dinject));
      f.be.add(xin, f.in(dx));
    }
    if (sequence) {
      Tensor y;
      f.be.linear(xin, wt, y);
      f.be.add_scaled_streams(streams, y, gates);
    } else {
      f.be.linear_into_streams(xin, wt, {streams, gates});
    }
    return {streams};
  }
};
std::shared_ptr<const LinearStreamsInputs> linear_streams_inputs(const LinearStreamsShape& c,
                                                                 Rng& rng) {
  auto in = std::make_shared<LinearStreamsInputs>();
  in->c = c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.in));
  in->x = random_tensor({c.S, c.in}, rng);
  in->h = random_tensor({c.S, c.streams * c.out}, rng, 2.0f);
  in->inject = random_tensor({c.S, c.streams}, rng, 1.0f);
  in->dh = random_tensor(in->h.shape(), rng, 0.5f);
  in->dinject = random_tensor(in->inject.shape(), rng, 0.25f);
  in->dx = random_tensor(in->x.shape(), rng, 0.5f);
  if (c.fp8) {
    in->w8 = std::make_shared<HostFp8Weight>(Shape{c.out, c.in});
    in->w8->fill_all(rng, scale);
  } else {
    in->w = std::make_shared<HostWeight>(random_weight(c.dtype, {c.out, c.in}, rng, scale));
  }
  return in;
}
const std::vector<LinearStreamsShape>& linear_streams_shapes() {
  static const std::vector<LinearStreamsShape> shapes{
      {1, 6144, 2560, 4, DType::kBF16, true},  {2, 6144, 2560, 4, DType::kBF16, true},
      {3, 6144, 2560, 4, DType::kBF16, true},  {4, 6144, 2560, 4, DType::kBF16, true},
      {1, 6144, 2560, 4, DType::kBF16, false}, {3, 6144, 2560, 4, DType::kBF16, false},
      {1, 96, 40, 4, DType::kF32, false},      {2, 96, 40, 6, DType::kF32, false},
      {1, 70, 33, 4, DType::kBF16, false},     {6, 256, 128, 4, DType::kBF16, true},
      {12, 256, 64, 4, DType::kF32, false}};
  return shapes;
}

// The inputs of QSA's projections (Backend::qsa_projections): x [S, in], q (query and gate
// interleaved: 2 * heads * D rows), k and v (kv_heads * D rows each), the indexer's query heads
// and its key (index_rows), in `dtype` or block-scaled FP8, with f32 biases when `bias`.
struct QsaProjShape {
  std::int64_t S, in, q_rows, kv_rows, index_rows;
  DType dtype;
  bool fp8, bias;
  std::string name() const {
    return "qsa_projections_S" + n(S) + "_in" + n(in) + "_q" + n(q_rows) + "_kv" + n(kv_rows) +
           "_i" + n(index_rows) + (fp8 ? "_fp8" : "_" + dt(dtype)) + (bias ? "_bias" : "");
  }
};
struct QsaProjInputs {
  QsaProjShape c;
  Tensor x;
  std::shared_ptr<HostWeight> q, k, v, index;          // !fp8
  std::shared_ptr<HostFp8Weight> q8, k8, v8, index8;   // fp8
  std::shared_ptr<HostWeight> q_bias, k_bias, v_bias;  // bias

  // {qg, k, v, index_qk} of qsa_projections on f's backend, or of its sequence (Backend's body:
  // linear and add_bias, on that backend) when `sequence`.
  std::vector<Tensor> run(const Feed& f, bool sequence) const {
    const Weight wq = c.fp8 ? f.w(*q8) : f.w(*q), wk = c.fp8 ? f.w(*k8) : f.w(*k);
    const Weight wv = c.fp8 ? f.w(*v8) : f.w(*v), wi = c.fp8 ? f.w(*index8) : f.w(*index);
    const Weight bq = c.bias ? f.w(*q_bias) : Weight{}, bk = c.bias ? f.w(*k_bias) : Weight{};
    const Weight bv = c.bias ? f.w(*v_bias) : Weight{};
    const Tensor xin = f.in(x);
    Tensor oq, ok, ov, oi;
    if (sequence)
      f.be.Backend::qsa_projections(xin, wq, wk, wv, wi, bq, bk, bv, oq, ok, ov, oi);
    else
      f.be.qsa_projections(xin, wq, wk, wv, wi, bq, bk, bv, oq, ok, ov, oi);
    return {oq, ok, ov, oi};
  }
};
std::shared_ptr<const QsaProjInputs> qsa_projection_inputs(const QsaProjShape& c, Rng& rng) {
  auto in = std::make_shared<QsaProjInputs>();
  in->c = c;
  in->x = random_tensor({c.S, c.in}, rng);
  const float ws = 1.0f / std::sqrt(static_cast<float>(c.in));
  auto make = [&](std::int64_t rows, std::shared_ptr<HostWeight>& w,
                  std::shared_ptr<HostFp8Weight>& w8) {
    if (c.fp8) {
      w8 = std::make_shared<HostFp8Weight>(Shape{rows, c.in});
      w8->fill_all(rng, ws);
    } else {
      w = std::make_shared<HostWeight>(random_weight(c.dtype, {rows, c.in}, rng, ws));
    }
  };
  make(c.q_rows, in->q, in->q8);
  make(c.kv_rows, in->k, in->k8);
  make(c.kv_rows, in->v, in->v8);
  make(c.index_rows, in->index, in->index8);
  if (c.bias) {
    in->q_bias = std::make_shared<HostWeight>(random_weight(DType::kF32, {c.q_rows}, rng));
    in->k_bias = std::make_shared<HostWeight>(random_weight(DType::kF32, {c.kv_rows}, rng));
    in->v_bias = std::make_shared<HostWeight>(random_weight(DType::kF32, {c.kv_rows}, rng));
  }
  return in;
}

// The QSA projection cases: the released shapes (hidden 2560; 24 heads of 256 with their gates,
// 2 KV heads, the indexer's 4 heads of 128 and its key) at 1-4 rows in bf16 and FP8 (one
// multi_gemv on the GPU), with biases, small f32 widths, and 20 rows and an off-chunk width (the
// sequence there).
const std::vector<QsaProjShape>& qsa_projection_shapes() {
  static const std::vector<QsaProjShape> shapes{
      {1, 2560, 12288, 512, 640, DType::kBF16, false, false},
      {2, 2560, 12288, 512, 640, DType::kBF16, false, false},
      {4, 2560, 12288, 512, 640, DType::kBF16, false, true},
      {1, 2560, 12288, 512, 640, DType::kF32, true, false},
      {3, 2560, 12288, 512, 640, DType::kF32, true, true},
      {3, 256, 128, 64, 96, DType::kF32, false, true},
      {20, 256, 128, 64, 96, DType::kBF16, false, true},
      {2, 70, 128, 64, 96, DType::kBF16, false, false}};
  return shapes;
}

// The inputs of head_norm_rope: a [S, heads_a * D] and, when heads_b > 0, b [S, heads_b * D],
// their norm weights (one head wide, or a's spanning its row when `row_weight`), at positions
// first.. with `rotary` of each head's D columns rotated.
struct HeadNormRopeShape {
  std::int64_t S, heads_a, heads_b, D, rotary, first;
  bool row_weight;
  std::string name() const {
    return "head_norm_rope_S" + n(S) + "_a" + n(heads_a) + "_b" + n(heads_b) + "_D" + n(D) +
           "_rot" + n(rotary) + "_at" + n(first) + (row_weight ? "_roww" : "");
  }
};
struct HeadNormRopeInputs {
  HeadNormRopeShape c;
  Tensor a, b;
  std::shared_ptr<HostWeight> wa, wb;
  static constexpr float kEps = 1e-6f;
  static constexpr double kTheta = 1e7;

  // {a, b} after head_norm_rope on f's backend, or after its sequence (Backend's body: rms_norm
  // and rope on that backend) when `sequence`.
  std::vector<Tensor> run(const Feed& f, bool sequence) const {
    Tensor ta = f.in(a), tb = c.heads_b > 0 ? f.in(b) : Tensor{};
    const Weight wxa = f.w(*wa), wxb = c.heads_b > 0 ? f.w(*wb) : Weight{};
    Tensor* pb = c.heads_b > 0 ? &tb : nullptr;
    if (sequence)
      f.be.Backend::head_norm_rope(ta, wxa, pb, wxb, c.D, kEps, c.rotary, c.first, kTheta);
    else
      f.be.head_norm_rope(ta, wxa, pb, wxb, c.D, kEps, c.rotary, c.first, kTheta);
    return c.heads_b > 0 ? std::vector<Tensor>{ta, tb} : std::vector<Tensor>{ta};
  }
};
std::shared_ptr<const HeadNormRopeInputs> head_norm_rope_inputs(const HeadNormRopeShape& c,
                                                                Rng& rng) {
  auto in = std::make_shared<HeadNormRopeInputs>();
  in->c = c;
  in->a = random_tensor({c.S, c.heads_a * c.D}, rng, 3.0f);
  in->wa = std::make_shared<HostWeight>(
      random_weight(DType::kF32, {c.row_weight ? c.heads_a * c.D : c.D}, rng, 0.5f));
  if (c.heads_b > 0) {
    in->b = random_tensor({c.S, c.heads_b * c.D}, rng, 3.0f);
    in->wb = std::make_shared<HostWeight>(random_weight(DType::kF32, {c.D}, rng, 0.5f));
  }
  return in;
}

// The released QSA layer's queries and keys (24 and 2 heads of 256, a quarter rotated) and the
// indexer's queries alone (4 of 128) at 1-4 rows deep in a context, full rotation, a head of 36
// rotating 18 with a row-wide weight, and 20 rows.
const std::vector<HeadNormRopeShape>& head_norm_rope_shapes() {
  static const std::vector<HeadNormRopeShape> shapes{
      {1, 24, 2, 256, 64, 65535, false}, {4, 24, 2, 256, 64, 16383, false},
      {3, 4, 0, 128, 64, 1000, false},   {2, 8, 2, 32, 32, 7, false},
      {3, 6, 3, 36, 18, 100, true},      {20, 4, 1, 64, 64, 0, false}};
  return shapes;
}

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, double tol, std::function<OpRun(Rng&)> build) {
    cases.push_back({std::move(name), tol, std::move(build)});
  };
  constexpr auto F32 = DType::kF32;
  constexpr auto BF16 = DType::kBF16;

  // --- dense algebra ---
  // Small (a tile edge: 130 rows is not a multiple of 64), the fixture's lm_head, and the
  // released model's projections and vocabulary-sized lm_head.
  struct LinearShape {
    std::int64_t S, in, out;
    DType dtype;
  };
  // The decode GEMV (1-8 rows) at every kernel variant: a thread group of 32 or 8 lanes (rows of
  // 640 and less), 1, 2 or 4 rows a group (4096 outputs and more), 16-byte chunks or single
  // elements (input widths not a multiple of 8 bf16 / 4 f32), output counts that are not a
  // multiple of the rows a group takes.
  for (const auto& [S, in, out, dtype] : std::vector<LinearShape>{
           {5, 70, 130, F32},
           {5, 70, 130, BF16},
           {3, 256, 4096, BF16},
           {7, 2560, 10240, BF16},
           {1, 2560, 12288, BF16},
           {2, 2560, 10240, BF16},
           {4, 2560, 4097, BF16},
           {4, 2560, 1280, BF16},
           {1, 640, 2560, BF16},
           {2, 640, 2560, BF16},
           {4, 640, 8191, BF16},
           {3, 70, 4099, BF16},
           {2, 2562, 4097, BF16},
           {4, 1000, 37, F32},
           {3, 2560, 5001, F32},
           {1, 36, 5, F32},
           {8, 2560, 4100, BF16},
           {1, 2560, 151936, BF16},
           {3, 2560, 151936, BF16},
           {4, 2560, 151936, BF16},
           {1, 2560, 151936, F32},
           {3, 2560, 151936, F32},
           // Prefill: the tensor-core products (cuda_grouped_gemm.h) over tiles of 64 rows and
           // 128 columns, with partial tiles and a width off the 64-wide K step; a width off
           // 16 bytes (70) keeps the sgemm tiles.
           {70, 2560, 1000, BF16},
           {130, 264, 300, BF16},
           {20, 70, 130, BF16},
           // K cut into splits for narrow outputs (the hyper-connections' 324 x 10240: 16
           // splits), and enough tiles for none (600 x 4100).
           {20, 10240, 324, BF16},
           {600, 256, 4100, BF16}}) {
    add("linear_S" + n(S) + "_in" + n(in) + "_out" + n(out) + "_" + dt(dtype), kProduct,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, in}, rng);
          auto w = std::make_shared<HostWeight>(
              random_weight(dtype, {out, in}, rng, 1.0f / std::sqrt(static_cast<float>(in))));
          return [x, w](const Feed& f) {
            Tensor y;
            f.be.linear(f.in(x), f.w(*w), y);
            return std::vector<Tensor>{y};
          };
        });
  }
  for (const auto& [S, C] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 130}, {4, 2560}}) {
    add("add_bias_S" + n(S) + "_C" + n(C), kElementwise, [=](Rng& rng) -> OpRun {
      auto y = random_tensor({S, C}, rng);
      auto b = std::make_shared<HostWeight>(random_weight(F32, {C}, rng));
      return [y, b](const Feed& f) {
        auto t = f.in(y);
        f.be.add_bias(t, f.w(*b));
        return std::vector<Tensor>{t};
      };
    });
  }

  // --- normalisation ---
  struct NormShape {
    std::string what;
    std::int64_t rows, cols, group, wn;
    bool unit_offset, in_place;
  };
  for (const auto& c : std::vector<NormShape>{{"row", 3, 8, 8, 8, true, false},
                                              {"grouped", 3, 8, 4, 8, true, false},
                                              {"head_shared", 3, 8, 4, 4, false, true},
                                              {"hidden", 4, 2560, 2560, 2560, true, false},
                                              {"hc_grouped", 4, 10240, 2560, 10240, true, false},
                                              {"qhead", 4 * 24, 256, 256, 256, true, true},
                                              {"fixture_head", 5 * 8, 32, 32, 32, true, true}}) {
    add("rms_norm_" + c.what + "_" + n(c.rows) + "x" + n(c.cols) + "_g" + n(c.group), kReduction,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({c.rows, c.cols}, rng, 3.0f);
          auto w = std::make_shared<HostWeight>(random_weight(F32, {c.wn}, rng, 0.5f));
          return [=](const Feed& f) {
            auto t = f.in(x);
            Tensor y;
            f.be.rms_norm(t, f.w(*w), c.group, 1e-6f, c.unit_offset, c.in_place ? t : y);
            return std::vector<Tensor>{c.in_place ? t : y};
          };
        });
  }
  for (const auto& [rows, group, act] :
       std::vector<std::tuple<std::int64_t, std::int64_t, Activation>>{
           {6 * 8, 32, Activation::kSigmoid},
           {4 * 48, 128, Activation::kSigmoid},
           {4 * 48, 128, Activation::kSilu}}) {
    add("rms_norm_gated_" + n(rows) + "x" + n(group) + "_act" + n(static_cast<int>(act)),
        kReduction, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({rows, group}, rng, 2.0f);
          auto gate = random_tensor({rows, group}, rng, 4.0f);
          auto w = std::make_shared<HostWeight>(random_weight(F32, {group}, rng));
          return [=](const Feed& f) {
            Tensor y;
            f.be.rms_norm_gated(f.in(x), f.w(*w), f.in(gate), 1e-6f, act, y);
            return std::vector<Tensor>{y};
          };
        });
  }
  // The DSA indexer's k_norm (GLM 5.3): the fixture's and the released model's key width.
  for (const auto& [rows, group, in_place] :
       std::vector<std::tuple<std::int64_t, std::int64_t, bool>>{{5, 16, false}, {4, 128, true}}) {
    add("layer_norm_" + n(rows) + "x" + n(group), kReduction, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({rows, group}, rng, 3.0f);
      auto w = std::make_shared<HostWeight>(random_weight(F32, {group}, rng));
      auto b = std::make_shared<HostWeight>(random_weight(F32, {group}, rng));
      return [=](const Feed& f) {
        auto t = f.in(x);
        Tensor y;
        f.be.layer_norm(t, f.w(*w), f.w(*b), 1e-6f, in_place ? t : y);
        return std::vector<Tensor>{in_place ? t : y};
      };
    });
  }
  for (const auto& [S, cols, group] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{{5, 4 * 32, 32},
                                                                         {4, 16 * 128, 128}}) {
    add("l2_norm_" + n(S) + "x" + n(cols) + "_g" + n(group), kReduction, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, cols}, rng, 2.0f);
      return [=](const Feed& f) {
        auto t = f.in(x);
        f.be.l2_norm(t, group, 1e-6f);
        return std::vector<Tensor>{t};
      };
    });
  }

  // --- elementwise ---
  for (const auto cols : {std::int64_t{33}, std::int64_t{10240}}) {
    const std::int64_t rows = 4;
    for (const auto act : {Activation::kIdentity, Activation::kSilu, Activation::kSigmoid,
                           Activation::kSoftplus, Activation::kRelu}) {
      // Scale 30 reaches past softplus's threshold of 20.
      add("activate_" + n(static_cast<int>(act)) + "_C" + n(cols), kElementwise,
          [=](Rng& rng) -> OpRun {
            auto x = random_tensor({rows, cols}, rng, 30.0f);
            return [=](const Feed& f) {
              auto t = f.in(x);
              f.be.activate(t, act);
              return std::vector<Tensor>{t};
            };
          });
    }
    add("scale_C" + n(cols), kElementwise, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({rows, cols}, rng);
      return [=](const Feed& f) {
        auto t = f.in(x);
        f.be.scale(t, 0.37f);
        return std::vector<Tensor>{t};
      };
    });
    add("add_mul_C" + n(cols), kElementwise, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({rows, cols}, rng), y = random_tensor({rows, cols}, rng);
      return [=](const Feed& f) {
        auto a = f.in(x), m = f.in(x), yy = f.in(y);
        f.be.add(a, yy);
        f.be.mul(m, yy);
        return std::vector<Tensor>{a, m};
      };
    });
    add("mul_cols_rows_C" + n(cols), kElementwise, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({rows, cols}, rng), s = random_tensor({rows, 1}, rng);
      auto v = std::make_shared<HostWeight>(random_weight(F32, {cols}, rng));
      return [=](const Feed& f) {
        auto a = f.in(x), b = f.in(x);
        f.be.mul_cols(a, f.w(*v));
        f.be.mul_rows(b, f.in(s));
        return std::vector<Tensor>{a, b};
      };
    });
    add("swiglu_C" + n(cols), kElementwise, [=](Rng& rng) -> OpRun {
      auto g = random_tensor({rows, cols}, rng, 8.0f), u = random_tensor({rows, cols}, rng);
      auto gu = random_tensor({rows, 2 * cols}, rng, 8.0f);
      return [=](const Feed& f) {
        Tensor o1, o2;
        f.be.swiglu(f.in(g), f.in(u), o1);
        f.be.swiglu_packed(f.in(gu), o2);
        return std::vector<Tensor>{o1, o2};
      };
    });
    add("signed_sqrt_C" + n(cols), kElementwise, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({rows, cols}, rng, 2.0f);
      std::fill_n(x.data(), 3, 0.0f);  // sign(0) = 0
      x.data()[3] = 1e-9f;             // below the floor
      return [=](const Feed& f) {
        auto t = f.in(x);
        f.be.signed_sqrt(t, 1e-6f);
        return std::vector<Tensor>{t};
      };
    });
  }
  for (const auto& [S, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{{5, 2}, {4, 10}}) {
    add("normalize_rows_" + n(S) + "x" + n(k), kElementwise, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, k}, rng);
      for (auto& v : x.span()) v = std::fabs(v) + 0.01f;
      return [=](const Feed& f) {
        auto t = f.in(x);
        f.be.normalize_rows(t);
        return std::vector<Tensor>{t};
      };
    });
  }

  // --- layout ---
  for (const auto& [S, cols, begin, width] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {3, 16 * 32 + 32, 16 * 32, 32}, {4, 4 * 128 + 128, 0, 4 * 128}}) {
    add("slice_cols_" + n(S) + "x" + n(cols) + "_" + n(begin) + "_" + n(width), kExact,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, cols}, rng);
          return [=](const Feed& f) {
            Tensor o;
            f.be.slice_cols(f.in(x), begin, width, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  for (const auto& [S, cols, begin, count] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {5, 256, 4, 1}, {3, 2560, 0, 3}, {6, 2560, 2, 3}}) {
    add("slice_rows_" + n(S) + "x" + n(cols) + "_" + n(begin) + "_" + n(count), kExact,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, cols}, rng);
          return [=](const Feed& f) {
            Tensor o;
            f.be.slice_rows(f.in(x), begin, count, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  for (const auto& [S, heads, dim] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{{3, 8, 32},
                                                                         {4, 24, 256}}) {
    add("split_interleaved_" + n(S) + "_h" + n(heads) + "_d" + n(dim), kExact,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, 2 * heads * dim}, rng);
          return [=](const Feed& f) {
            Tensor a, b;
            f.be.split_interleaved(f.in(x), heads, dim, a, b);
            return std::vector<Tensor>{a, b};
          };
        });
  }
  // Host rows in (the MTP head's hidden input): six uploads queued back to back, more than a
  // device's staging ring has slots, so a slot is reused while earlier copies may be in flight.
  for (const auto& [S, W] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1024}, {4, 10240}}) {
    add("upload_rows_" + n(S) + "x" + n(W), kExact, [=](Rng& rng) -> OpRun {
      std::vector<std::vector<float>> rows;
      for (int i = 0; i < 6; ++i) rows.push_back(random_tensor({S, W}, rng).to_host_vector());
      return [=](const Feed& f) {
        std::vector<Tensor> out(rows.size());
        for (std::size_t i = 0; i < rows.size(); ++i) f.be.upload_rows(rows[i], W, out[i]);
        return out;
      };
    });
  }
  for (const auto& [S, W] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 256}, {4, 2560}}) {
    add("repeat_cols_" + n(S) + "x" + n(W), kExact, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, W}, rng);
      return [=](const Feed& f) {
        Tensor o;
        f.be.repeat_cols(f.in(x), 4, o);
        return std::vector<Tensor>{o};
      };
    });
  }
  for (const auto& [have, add_rows, cols] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {0, 5, 64}, {7, 1, 64}, {100, 3, 2 * 256}, {0, 1, 2 * 256}}) {
    add("append_rows_" + n(have) + "+" + n(add_rows) + "x" + n(cols), kExact,
        [=](Rng& rng) -> OpRun {
          auto cache = random_tensor({have, cols}, rng), x = random_tensor({add_rows, cols}, rng);
          return [=](const Feed& f) {
            Tensor c = have > 0 ? f.in(cache) : Tensor{};
            f.be.append_rows(c, f.in(x));
            f.be.append_rows(c, f.in(x));  // twice: a warm cache grows in place
            return std::vector<Tensor>{c};
          };
        });
  }

  // --- embeddings ---
  for (const auto& [V, cols, shards, dtype] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, DType>>{
           {4096, 256, 1, BF16}, {4096, 256, 2, F32}, {151936, 2560, 1, BF16}}) {
    add("embedding_V" + n(V) + "_C" + n(cols) + "_shards" + n(shards) + "_" + dt(dtype), kExact,
        [=](Rng& rng) -> OpRun {
          // Only the looked-up rows are filled (the op reads no others).
          const std::vector<std::int64_t> ids = {0, V - 1, V / 2, 17, V / 2 - 1, 17};
          auto tables = std::make_shared<std::vector<HostWeight>>();
          for (std::int64_t i = 0; i < shards; ++i)
            tables->emplace_back(dtype, Shape{V / shards, cols});
          for (const auto id : ids)
            (*tables)[static_cast<std::size_t>(id / (V / shards))].fill(
                rng, 1.0f, id % (V / shards) * cols, cols);
          return [=](const Feed& f) {
            std::vector<Weight> w;
            for (const auto& t : *tables) w.push_back(f.w(t));
            Tensor o;
            f.be.embedding(w, ids, o);
            return std::vector<Tensor>{o};
          };
        });
  }

  // --- hyper-connections ---
  for (const auto& [S, W] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{3, 256}, {4, 2560}}) {
    const std::int64_t streams = 4;
    add("stream_ops_" + n(S) + "x" + n(W), kReduction, [=](Rng& rng) -> OpRun {
      auto h = random_tensor({S, streams * W}, rng), y = random_tensor({S, W}, rng),
           w = random_tensor({S, streams}, rng), b = random_tensor({S, streams * W}, rng);
      return [=](const Feed& f) {
        Tensor mean, dot;
        auto hh = f.in(h);
        f.be.stream_mean(hh, streams, mean);
        f.be.grouped_dot(hh, f.in(b), W, dot);
        f.be.add_scaled_streams(hh, f.in(y), f.in(w));
        return std::vector<Tensor>{mean, dot, hh};
      };
    });
    // The fused stream mix (rank 16, bf16 up weight as checkpoints store it).
    add("stream_mix_" + n(S) + "x" + n(W), kReduction, [=](Rng& rng) -> OpRun {
      auto xn = random_tensor({S, streams * W}, rng), u = random_tensor({S, 16}, rng);
      auto up = std::make_shared<HostWeight>(random_weight(BF16, {streams * W, 16}, rng, 0.25f));
      return [=](const Feed& f) {
        Tensor out;
        f.be.stream_mix(f.in(xn), f.in(u), f.w(*up), streams, out);
        return std::vector<Tensor>{out};
      };
    });
  }

  // --- positional ---
  struct RopeShape {
    std::int64_t rows, heads, head_dim, rotary, first, stride;
    double theta;
  };
  for (const auto& c : std::vector<RopeShape>{{5, 8, 32, 16, 0, 1, 10000.0},
                                              {3, 1, 32, 16, 0, 4, 10000.0},
                                              {4, 24, 256, 64, 1000, 1, 1e7},
                                              {4, 2, 256, 64, 200000, 1, 1e7},
                                              {6, 1, 128, 32, 4096, 4, 1e7}}) {
    add("rope_" + n(c.rows) + "x" + n(c.heads) + "x" + n(c.head_dim) + "_r" + n(c.rotary) + "_at" +
            n(c.first) + "_step" + n(c.stride),
        kElementwise, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({c.rows, c.heads * c.head_dim}, rng);
          return [=](const Feed& f) {
            auto t = f.in(x);
            f.be.rope(t, c.head_dim, c.rotary, c.first, c.stride, c.theta);
            return std::vector<Tensor>{t};
          };
        });
  }

  // --- sequence mixing ---
  for (const auto& [S, C, K, dil] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {7, 384, 4, 1}, {5, 128, 4, 3}, {1, 10240, 4, 1}, {9, 10240, 4, 1}, {3, 2560, 4, 3}}) {
    add("causal_conv1d_S" + n(S) + "_C" + n(C) + "_K" + n(K) + "_dil" + n(dil), kReduction,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, C}, rng), tail = random_tensor({(K - 1) * dil, C}, rng);
          auto w = std::make_shared<HostWeight>(random_weight(F32, {C, K}, rng));
          return [=](const Feed& f) {
            auto t = f.in(tail);
            Tensor y;
            f.be.causal_conv1d(f.in(x), f.w(*w), dil, t, y);
            return std::vector<Tensor>{y, t};
          };
        });
  }
  struct DeltaShape {
    std::int64_t S, Hk, Hv, dk, dv;
    bool chunked;
    bool positions = false;    // gated_delta_rule_positions: also the state after every token
    bool per_channel = false;  // KDA: the log decay g is [S, Hv*dk], one per key channel
    bool strong = false;       // g in (-5, 0) (GLM's bound) instead of (-0.3, 0]
  };
  for (const auto& c : std::vector<DeltaShape>{{70, 4, 8, 32, 32, true},
                                               {1, 4, 8, 32, 32, false},
                                               {5, 4, 8, 32, 32, false},
                                               {1, 16, 48, 128, 128, false},
                                               {3, 16, 48, 128, 128, true},
                                               {130, 16, 48, 128, 128, true},
                                               {3, 4, 8, 32, 32, false, true},
                                               {1, 16, 48, 128, 128, false, true},
                                               {4, 16, 48, 128, 128, false, true},
                                               // KDA: the fixture's heads, then GLM 5.3's.
                                               {70, 4, 4, 16, 16, true, false, true},
                                               {1, 4, 4, 16, 16, false, false, true},
                                               {4, 4, 4, 16, 16, false, true, true},
                                               {1, 64, 64, 128, 128, false, false, true},
                                               {130, 64, 64, 128, 128, true, false, true},
                                               // The chunk kernels (from 16 tokens; a scalar
                                               // decay from 1,024, so S 1100): lengths
                                               // around a chunk and over several, both decays,
                                               // Qwen's heads, GLM's, 16 and 32 state columns,
                                               {1, 16, 48, 128, 128, true},
                                               {64, 16, 48, 128, 128, true},
                                               {65, 16, 48, 128, 128, true},
                                               {300, 16, 48, 128, 128, true},
                                               {65, 16, 48, 128, 128, true, false, true},
                                               {300, 16, 48, 128, 128, true, false, true, true},
                                               {1, 64, 64, 128, 128, true, false, true},
                                               {64, 64, 64, 128, 128, true, false, true, true},
                                               {300, 64, 64, 128, 128, true, false, true},
                                               {300, 4, 8, 32, 32, true, false, true, true},
                                               {65, 4, 4, 16, 16, true},
                                               {100, 4, 4, 16, 16, true, false, true},
                                               // over one segment of 16 chunks
                                               {1100, 2, 4, 32, 32, true},
                                               {1100, 4, 8, 32, 32, true, false, true, true}}) {
    const char* form = c.positions ? "positions" : c.chunked ? "chunked" : "recurrent";
    add(std::string(c.per_channel ? "kimi_delta_rule_" : "gated_delta_rule_") + form + "_S" +
            n(c.S) + "_Hk" + n(c.Hk) + "_Hv" + n(c.Hv) + "_d" + n(c.dk) +
            (c.strong ? "_strong" : ""),
        kDeltaRule, [=](Rng& rng) -> OpRun {
          auto q = random_tensor({c.S, c.Hk * c.dk}, rng),
               k = random_tensor({c.S, c.Hk * c.dk}, rng);
          auto v = random_tensor({c.S, c.Hv * c.dv}, rng);
          auto g = random_tensor({c.S, c.per_channel ? c.Hv * c.dk : c.Hv}, rng),
               beta = random_tensor({c.S, c.Hv}, rng);
          for (auto& e : g.span())  // log decay <= 0
            e = c.strong ? -5.0f / (1.0f + std::exp(-3.0f * e)) : -std::fabs(e) * 0.3f;
          for (auto& e : beta.span()) e = 1.0f / (1.0f + std::exp(-3.0f * e));
          // l2-normed q and k, q scaled by 1/sqrt(dk), as the model feeds them.
          for (auto* t : {&q, &k})
            for (std::int64_t r = 0; r < t->rows() * c.Hk; ++r) {
              float* p = t->data() + r * c.dk;
              double ss = 0;
              for (std::int64_t i = 0; i < c.dk; ++i) ss += static_cast<double>(p[i]) * p[i];
              const float inv = static_cast<float>(1.0 / std::sqrt(ss + 1e-6)) *
                                (t == &q ? 1.0f / std::sqrt(static_cast<float>(c.dk)) : 1.0f);
              for (std::int64_t i = 0; i < c.dk; ++i) p[i] *= inv;
            }
          auto state = random_tensor({c.Hv, c.dk, c.dv}, rng, 0.1f);
          return [=](const Feed& f) {
            auto st = f.in(state);
            Tensor out, states;
            if (c.positions) {
              f.be.gated_delta_rule_positions(f.in(q), f.in(k), f.in(v), f.in(g), f.in(beta), c.Hk,
                                              st, out, states);
              return std::vector<Tensor>{out, st, states};
            }
            if (c.chunked) {
              f.be.gated_delta_rule_chunked(f.in(q), f.in(k), f.in(v), f.in(g), f.in(beta), c.Hk,
                                            st, out);
            } else {
              f.be.gated_delta_rule_recurrent(f.in(q), f.in(k), f.in(v), f.in(g), f.in(beta), c.Hk,
                                              st, out);
            }
            return std::vector<Tensor>{out, st};
          };
        });
  }
  struct AttentionShape {
    std::int64_t S, T, Hq, Hkv, D, block, top;
  };
  for (const auto& c : std::vector<AttentionShape>{{5, 5, 8, 2, 32, 4, 16},
                                                   {3, 90, 8, 2, 32, 4, 16},
                                                   {1, 37, 8, 2, 32, 4, 16},
                                                   {1, 3001, 24, 2, 256, 4, 512},
                                                   {3, 2500, 24, 2, 256, 4, 512},
                                                   {4, 1200, 24, 2, 256, 4, 512},
                                                   // Decode at 2k-64k keys (the split-K kernel),
                                                   {1, 2051, 24, 2, 256, 4, 512},
                                                   {2, 16384, 24, 2, 256, 4, 512},
                                                   {4, 16387, 24, 2, 256, 4, 512},
                                                   {1, 65536, 24, 2, 256, 4, 512},
                                                   {3, 65538, 24, 2, 256, 4, 1024},
                                                   // fewer visible blocks than top (-1 picks),
                                                   {2, 700, 24, 2, 256, 4, 512},
                                                   // many rows (one split), MHA, odd widths,
                                                   {200, 3000, 8, 2, 64, 4, 128},
                                                   // a prefill's released shapes (one stage,
                                                   // many tiles a block: 264 groups and more),
                                                   {132, 2600, 24, 2, 256, 4, 512},
                                                   {2, 500, 4, 4, 32, 4, 64},
                                                   {3, 300, 6, 2, 36, 4, 32},
                                                   // D % 4 != 0 (the earlier kernel).
                                                   {2, 100, 4, 1, 30, 4, 8},
                                                   // The tiled split kernel's edges: 1k keys (half
                                                   // the picks -1, whole tiles of -1 keys), 4 rows
                                                   // whose tails end in different tiles, a chunk
                                                   // of exactly one tile (2,048 + 0 tail),
                                                   {2, 1024, 24, 2, 256, 4, 512},
                                                   {4, 1027, 24, 2, 256, 4, 512},
                                                   {1, 2048, 24, 2, 256, 4, 512},
                                                   // two-stage pipelines: one head a warp
                                                   // (rep 3), two heads of 128 (rep 8),
                                                   {5, 2000, 12, 4, 256, 4, 256},
                                                   {9, 3000, 16, 2, 128, 4, 256},
                                                   // one tile shorter than a warp, rep 32.
                                                   {1, 9, 32, 1, 64, 4, 2}}) {
    add("block_sparse_attention_S" + n(c.S) + "_T" + n(c.T) + "_Hq" + n(c.Hq) + "_Hkv" + n(c.Hkv) +
            "_D" + n(c.D) + "_top" + n(c.top),
        kProduct, [=](Rng& rng) -> OpRun {
          const auto first = c.T - c.S;
          auto q = random_tensor({c.S, c.Hq * c.D}, rng),
               k = random_tensor({c.T, c.Hkv * c.D}, rng),
               v = random_tensor({c.T, c.Hkv * c.D}, rng);
          auto picked = random_picks(c.S, first, c.block, c.top, rng);
          const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
          return [=](const Feed& f) {
            Tensor o;
            f.be.block_sparse_attention(f.in(q), f.in(k), f.in(v), c.Hq, c.Hkv, f.in(picked),
                                        c.block, first, scale, o);
            return std::vector<Tensor>{o};
          };
        });
  }

  // The gated form (QSA's output gate in the attention's op) against the CPU's sequence: a decode
  // step and a verify at 1k (the merge writes the gated output), a one-split shape (the tiled
  // kernel writes it) and D % 4 != 0 (the earliest kernel, then mul_activated).
  for (const auto& c : std::vector<AttentionShape>{{1, 1024, 24, 2, 256, 4, 512},
                                                   {4, 16387, 24, 2, 256, 4, 512},
                                                   {1, 9, 32, 1, 64, 4, 2},
                                                   {200, 3000, 8, 2, 64, 4, 128},
                                                   {2, 100, 4, 1, 30, 4, 8}}) {
    add("gated_block_sparse_attention_S" + n(c.S) + "_T" + n(c.T) + "_Hq" + n(c.Hq) + "_D" +
            n(c.D) + "_top" + n(c.top),
        kProduct, [=](Rng& rng) -> OpRun {
          const auto first = c.T - c.S;
          auto q = random_tensor({c.S, c.Hq * c.D}, rng),
               k = random_tensor({c.T, c.Hkv * c.D}, rng),
               v = random_tensor({c.T, c.Hkv * c.D}, rng),
               gate = random_tensor({c.S, c.Hq * c.D}, rng, 3.0f);
          auto picked = random_picks(c.S, first, c.block, c.top, rng);
          const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
          return [=](const Feed& f) {
            Tensor o, g = f.in(gate);
            f.be.gated_block_sparse_attention(f.in(q), f.in(k), f.in(v), c.Hq, c.Hkv, f.in(picked),
                                              c.block, first, scale, g, Activation::kSigmoid, o);
            return std::vector<Tensor>{o};
          };
        });
  }

  // --- indexers and routing ---
  for (const auto& [rows, cols, first_row, blocks] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {13, 32, 4, 2}, {4100, 128, 4000, 25}, {8, 128, 0, 2}}) {
    add("block_mean_" + n(rows) + "x" + n(cols) + "_from" + n(first_row) + "_n" + n(blocks),
        kReduction, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({rows, cols}, rng);
          return [=](const Feed& f) {
            Tensor o;
            f.be.block_mean(f.in(x), first_row, blocks, 4, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  // GLM 5.3's k-pool compression: the fixture (kpool 4, dI 16) and the released model (16, 128).
  for (const auto& [rows, dim, pool, first_row, pools] : std::vector<
           std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {13, 16, 4, 4, 2}, {4100, 128, 16, 3840, 16}, {16, 128, 16, 0, 1}}) {
    add("kpool_compress_" + n(rows) + "x" + n(dim) + "_p" + n(pool) + "_from" + n(first_row) +
            "_n" + n(pools),
        kReduction, [=](Rng& rng) -> OpRun {
          auto keys = random_tensor({rows, dim}, rng);
          auto gate = random_tensor({rows, dim}, rng, 4.0f);
          auto ape = std::make_shared<HostWeight>(random_weight(F32, {pool * dim}, rng));
          return [=](const Feed& f) {
            Tensor o;
            f.be.kpool_compress(f.in(keys), f.in(gate), f.w(*ape), pool, first_row, pools, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  for (const auto& [S, B, heads, dim] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {5, 3, 16, 32},
           {3, 750, 4, 128},
           {1, 4096, 4, 128},
           // Decode and verify at 16k blocks, a partial query tile, dim 256 and dims that are not
           // a multiple of 32 (or of 4: the earlier kernel), many rows.
           {1, 16384, 4, 128},
           {4, 16384, 4, 128},
           {6, 1001, 4, 128},
           {2, 300, 2, 256},
           {3, 50, 3, 36},
           {2, 40, 2, 30},
           {64, 2000, 4, 128}}) {
    add("index_scores_S" + n(S) + "_B" + n(B) + "_h" + n(heads) + "_d" + n(dim), kReduction,
        [=](Rng& rng) -> OpRun {
          auto q = random_tensor({S, heads * dim}, rng), keys = random_tensor({B, dim}, rng);
          const float scale = 1.0f / std::sqrt(static_cast<float>(dim));
          return [=](const Feed& f) {
            Tensor o;
            f.be.index_scores(f.in(q), f.in(keys), heads, scale, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  for (const auto& [S, E] : std::vector<std::pair<std::int64_t, std::int64_t>>{{5, 8}, {4, 512}}) {
    add("softmax_" + n(S) + "x" + n(E), kReduction, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, E}, rng, 10.0f);
      return [=](const Feed& f) {
        auto t = f.in(x);
        f.be.softmax(t);
        return std::vector<Tensor>{t};
      };
    });
  }
  // top-k of distinct values (no ties: a tie's order is exact on every backend only when the
  // values are bit-equal, which the tie case below pins down).
  for (const auto& [S, E, k] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {5, 8, 2},
           {4, 512, 10},
           {2, 5, 7},
           // Long rows (random 24-bit values: a few bit-equal ties per row), k up to the radix
           // select's limit and past it (the earlier kernel).
           {1, 16384, 512},
           {4, 65536, 1024},
           {2, 20000, 4096},
           {1, 9000, 4097},
           {100, 3000, 64}}) {
    add("topk_" + n(S) + "x" + n(E) + "_k" + n(k), kExact, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, E}, rng);
      return [=](const Feed& f) {
        Tensor idx, val;
        f.be.topk(f.in(x), k, idx, val);
        return std::vector<Tensor>{idx, val};
      };
    });
  }
  for (const auto& [S, E, k, levels] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>>{
           {2, 30000, 1000, 8}, {1, 65536, 512, 1000}, {3, 4000, 700, 2}}) {
    add("topk_tied_" + n(S) + "x" + n(E) + "_k" + n(k) + "_l" + n(levels), kExact,
        [=](Rng& rng) -> OpRun {
          auto x = tied_tensor({S, E}, rng, levels);
          return [=](const Feed& f) {
            Tensor idx, val;
            f.be.topk(f.in(x), k, idx, val);
            return std::vector<Tensor>{idx, val};
          };
        });
  }
  // The whole-row radix select at vocabulary widths (FLASHSERVE_CUDA_VOCAB_TOPK=0 around the
  // call: what the vocabulary top-k below replaced, and still the path of rows it does not fit).
  for (const auto& [S, V, k, levels] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, int>>{
           {1, 248320, 1024, 0}, {2, 65536, 512, 1000}}) {
    add("topk_radix_" + n(S) + "x" + n(V) + "_k" + n(k) + "_l" + n(levels), kExact,
        [=](Rng& rng) -> OpRun {
          Tensor x = levels > 0 ? tied_tensor({S, V}, rng, levels) : random_tensor({S, V}, rng);
          return [=](const Feed& f) {
            setenv("FLASHSERVE_CUDA_VOCAB_TOPK", "0", 1);
            const UnsetOnExit unset{"FLASHSERVE_CUDA_VOCAB_TOPK"};
            Tensor idx, val;
            f.be.topk(f.in(x), k, idx, val);
            return std::vector<Tensor>{idx, val};
          };
        });
  }
  // The vocabulary top-k (cuda_vocab_topk.cu, FLASHSERVE_CUDA_VOCAB_TOPK=1 around the call)
  // against the CPU's selection: rows of the released vocabulary at 1-4 rows; tied rows; a row
  // whose tail of reserved ids holds one low value; a row whose best entries crowd into its first
  // slices; a row of one value (every entry a candidate: the whole-row fallback); a narrower
  // vocabulary (DeepSeek V4's) and a smaller k.
  enum class Vocab { kRandom, kTied, kReservedTail, kCrowded, kConstant };
  for (const auto& [label, S, V, k, form] :
       std::vector<std::tuple<const char*, std::int64_t, std::int64_t, std::int64_t, Vocab>>{
           {"random", 1, 248320, 1024, Vocab::kRandom},
           {"random", 4, 248320, 1024, Vocab::kRandom},
           {"tied", 2, 248320, 1024, Vocab::kTied},
           {"reserved_tail", 1, 248320, 1024, Vocab::kReservedTail},
           {"crowded", 3, 248320, 1024, Vocab::kCrowded},
           {"constant", 2, 248320, 1024, Vocab::kConstant},
           {"random", 2, 129280, 1024, Vocab::kRandom},
           {"tied", 1, 65536, 40, Vocab::kTied},
           // Smaller k (a request's top_logprobs takes the first of the sampler's 1,024).
           {"random", 2, 248320, 1, Vocab::kRandom},
           {"tied", 1, 248320, 5, Vocab::kTied},
           {"random", 3, 248320, 20, Vocab::kRandom}}) {
    add(std::string("topk_vocab_") + label + "_" + n(S) + "x" + n(V) + "_k" + n(k), kExact,
        [=](Rng& rng) -> OpRun {
          Tensor x =
              form == Vocab::kTied ? tied_tensor({S, V}, rng, 8) : random_tensor({S, V}, rng);
          float* p = x.data();
          for (std::int64_t r = 0; r < S; ++r) {
            float* row = p + r * V;
            if (form == Vocab::kReservedTail)
              for (std::int64_t c = V - 2048; c < V; ++c) row[c] = -30.0f;
            if (form == Vocab::kCrowded)
              for (std::int64_t c = 0; c < 4096; ++c) row[c] += 10.0f;
            if (form == Vocab::kConstant) std::fill(row, row + V, 0.5f);
          }
          return [=](const Feed& f) {
            setenv("FLASHSERVE_CUDA_VOCAB_TOPK", "1", 1);
            const UnsetOnExit unset{"FLASHSERVE_CUDA_VOCAB_TOPK"};
            Tensor idx, val;
            f.be.topk(f.in(x), k, idx, val);
            return std::vector<Tensor>{idx, val};
          };
        });
  }
  add("topk_ties", kExact, [=](Rng&) -> OpRun {
    const Tensor x({2, 6}, {0.5f, 0.9f, 0.5f, 0.9f, 0.1f, 0.9f, 1, 1, 1, 1, 1, 1});
    return [=](const Feed& f) {
      Tensor idx, val;
      f.be.topk(f.in(x), 4, idx, val);
      return std::vector<Tensor>{idx, val};
    };
  });
  // Greedy sampling's pick: distinct values, ties at the maximum (the lower index wins), and a
  // row as wide as the released vocabulary.
  for (const auto& [S, V] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 7}, {4, 1000}, {1, 248320}}) {
    add("argmax_rows_" + n(S) + "x" + n(V), kExact, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, V}, rng);
      return [=](const Feed& f) {
        Tensor ids;
        f.be.argmax_rows(f.in(x), ids);
        return std::vector<Tensor>{ids};
      };
    });
  }
  add("argmax_rows_ties", kExact, [=](Rng&) -> OpRun {
    std::vector<float> v(3 * 5000, 0.25f);
    v[4321] = v[1234] = v[4999] = 2.0f;                   // row 0: three equal maxima
    v[5000 + 17] = -1.0f;                                 // row 1: all equal but one
    for (int c = 0; c < 5000; ++c) v[10000 + c] = -3.0f;  // row 2: all equal
    v[10000 + 4000] = v[10000 + 2500] = -2.0f;
    const Tensor x({3, 5000}, std::move(v));
    return [=](const Feed& f) {
      Tensor ids;
      f.be.argmax_rows(f.in(x), ids);
      return std::vector<Tensor>{ids};
    };
  });
  // Rows long enough for the two-pass form (slices of 4,096 merged in order): equal maxima in
  // different slices, NaN entries (never picked), an all-NaN row (0, as the CPU's).
  add("argmax_rows_ties_wide", kExact, [=](Rng&) -> OpRun {
    constexpr std::int64_t V = 100000;
    const float nan = std::nanf("");
    std::vector<float> v(3 * V, 0.5f);
    v[70000] = v[5000] = v[99999] = 3.0f;  // row 0: 5000
    for (std::int64_t c = 0; c < V; c += 3) v[V + c] = nan;
    v[V + 8191] = v[V + 4097] = 1.0f;                         // row 1: 4097 (not a NaN index)
    for (std::int64_t c = 0; c < V; ++c) v[2 * V + c] = nan;  // row 2: 0
    const Tensor x({3, V}, std::move(v));
    return [=](const Feed& f) {
      Tensor ids;
      f.be.argmax_rows(f.in(x), ids);
      return std::vector<Tensor>{ids};
    };
  });
  for (const auto& [S, B, first, top] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {5, 3, 8, 2},
           {6, 20, 60, 16},
           {3, 750, 2997, 512},
           {2, 300, 1198, 512},
           {4, 1, 0, 16},
           // Decode at 64k and 256k context (16k and 64k blocks), 1-4 rows, top 512-1024;
           {1, 16384, 65535, 512},
           {4, 16384, 65532, 512},
           {2, 65536, 262142, 1024},
           // a score row wider than the visible blocks, and fewer visible than top (-1 padding);
           {3, 16384, 40000, 512},
           {3, 16384, 1000, 512},
           // prefill: many rows.
           {512, 4096, 15872, 512}}) {
    add("select_blocks_S" + n(S) + "_B" + n(B) + "_at" + n(first) + "_top" + n(top), kExact,
        [=](Rng& rng) -> OpRun {
          auto scores = random_tensor({S, B}, rng);
          return [=](const Feed& f) {
            Tensor picked;
            f.be.select_blocks(f.in(scores), first, 4, top, picked);
            return std::vector<Tensor>{picked};
          };
        });
  }
  for (const auto& [S, B, first, top, levels] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int>>{
           {2, 16384, 65534, 512, 16}, {4, 20000, 80000, 1024, 3}, {64, 3000, 11000, 512, 64}}) {
    add("select_blocks_tied_S" + n(S) + "_B" + n(B) + "_at" + n(first) + "_top" + n(top) + "_l" +
            n(levels),
        kExact, [=](Rng& rng) -> OpRun {
          auto scores = tied_tensor({S, B}, rng, levels);
          return [=](const Feed& f) {
            Tensor picked;
            f.be.select_blocks(f.in(scores), first, 4, top, picked);
            return std::vector<Tensor>{picked};
          };
        });
  }
  struct MoeShape {
    std::int64_t S, H, E, I, k;
    DType dtype;
  };
  // 1-4 tokens take the fused decode path (a slot per (token, expert) pair: the 8- and 6-expert
  // cases route tokens to the same experts), more the pair path; widths that are not a multiple
  // of the 16-byte chunk (H 70, I 37 and 36 in bf16) take the element path.
  for (const auto& c : std::vector<MoeShape>{{5, 256, 8, 64, 2, F32},
                                             {5, 256, 8, 64, 2, BF16},
                                             {1, 2560, 512, 1024, 10, BF16},
                                             {3, 2560, 512, 1024, 10, BF16},
                                             {2, 2560, 64, 1024, 10, F32},
                                             {1, 2560, 512, 640, 10, BF16},
                                             {2, 2560, 512, 640, 10, BF16},
                                             {4, 2560, 512, 640, 10, BF16},
                                             {4, 256, 8, 64, 4, BF16},
                                             {3, 70, 6, 37, 3, F32},
                                             {4, 72, 6, 36, 5, BF16},
                                             {2, 72, 6, 36, 5, F32},
                                             // Prefill's grouped products: an expert over two
                                             // tiles of 64 pairs (72 each), widths off the
                                             // 64-wide K step and the 64/128-wide N tiles.
                                             {96, 512, 8, 192, 6, BF16},
                                             {33, 264, 5, 40, 2, BF16}}) {
    add("moe_experts_S" + n(c.S) + "_H" + n(c.H) + "_E" + n(c.E) + "_I" + n(c.I) + "_k" + n(c.k) +
            "_" + dt(c.dtype),
        kProduct, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({c.S, c.H}, rng);
          auto [experts, weights] = random_routing(c.S, c.E, c.k, rng);
          // Only the routed experts' slices are filled (the op reads no others).
          auto gate_up = std::make_shared<HostWeight>(c.dtype, Shape{c.E, 2 * c.I, c.H});
          auto down = std::make_shared<HostWeight>(c.dtype, Shape{c.E, c.H, c.I});
          std::vector<bool> used(static_cast<std::size_t>(c.E));
          for (std::int64_t i = 0; i < experts.numel(); ++i)
            used[static_cast<std::size_t>(experts.data_as<std::int32_t>()[i])] = true;
          for (std::int64_t e = 0; e < c.E; ++e) {
            if (!used[static_cast<std::size_t>(e)]) continue;
            gate_up->fill(rng, 1.0f / std::sqrt(static_cast<float>(c.H)), e * 2 * c.I * c.H,
                          2 * c.I * c.H);
            down->fill(rng, 1.0f / std::sqrt(static_cast<float>(c.I)), e * c.H * c.I, c.H * c.I);
          }
          return [=](const Feed& f) {
            Tensor y;
            f.be.moe_experts(f.in(x), f.w(*gate_up), f.w(*down), f.in(experts), f.in(weights), 0,
                             y);
            return std::vector<Tensor>{y};
          };
        });
  }

  // --- block-scaled FP8 weights (issue 15) ---
  // linear: the GEMV on the e4m3 bytes at 1-8 rows (32- and 8-lane groups, 1/2/4 rows a group,
  // 16-byte chunks or single elements for widths off the chunk, partial 128-blocks in rows and
  // columns; the out-projections' 6144 columns at 2-4 rows, x staged beyond 48 KB),
  // dequantised tiles + sgemm beyond; moe_experts: the fused one-token path, the pair
  // path (2-4 tokens) and prefill-sized token counts, chunked and element paths.
  struct Fp8LinearShape {
    std::int64_t S, in, out;
  };
  for (const auto& [S, in, out] : std::vector<Fp8LinearShape>{{1, 256, 130},
                                                              {3, 256, 300},
                                                              {5, 200, 130},
                                                              {2, 640, 2560},
                                                              {4, 640, 8191},
                                                              {1, 2560, 12288},
                                                              {8, 2560, 4097},
                                                              {2, 2562, 4097},
                                                              {2, 6144, 2560},
                                                              {3, 6144, 2560},
                                                              {4, 6144, 301},
                                                              {20, 512, 300},
                                                              {70, 2560, 1000},
                                                              {130, 272, 257}}) {
    add("linear_S" + n(S) + "_in" + n(in) + "_out" + n(out) + "_fp8", kProduct,
        [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, in}, rng);
          auto w = std::make_shared<HostFp8Weight>(Shape{out, in});
          w->fill_all(rng, 1.0f / std::sqrt(static_cast<float>(in)));
          return [x, w](const Feed& f) {
            Tensor y;
            f.be.linear(f.in(x), f.w(*w), y);
            return std::vector<Tensor>{y};
          };
        });
  }
  struct Fp8MoeShape {
    std::int64_t S, H, E, I, k;
  };
  for (const auto& c : std::vector<Fp8MoeShape>{{1, 2560, 64, 640, 8},
                                                {3, 2560, 64, 640, 8},
                                                {1, 256, 8, 192, 2},
                                                {4, 256, 8, 192, 3},
                                                {20, 256, 8, 64, 2},
                                                {1, 200, 6, 72, 3},
                                                {3, 200, 6, 72, 3},
                                                // The grouped products (prefill): two tiles an
                                                // expert; partial K steps and 128-blocks (H 272,
                                                // I 48); 512 experts of a few pairs each.
                                                {96, 512, 8, 192, 6},
                                                {40, 272, 6, 48, 3},
                                                {64, 256, 512, 128, 10}}) {
    add("moe_experts_S" + n(c.S) + "_H" + n(c.H) + "_E" + n(c.E) + "_I" + n(c.I) + "_k" + n(c.k) +
            "_fp8",
        kProduct, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({c.S, c.H}, rng);
          auto [experts, weights] = random_routing(c.S, c.E, c.k, rng);
          auto gate_up = std::make_shared<HostFp8Weight>(Shape{c.E, 2 * c.I, c.H});
          auto down = std::make_shared<HostFp8Weight>(Shape{c.E, c.H, c.I});
          std::vector<bool> used(static_cast<std::size_t>(c.E));
          for (std::int64_t i = 0; i < experts.numel(); ++i)
            used[static_cast<std::size_t>(experts.data_as<std::int32_t>()[i])] = true;
          for (std::int64_t e = 0; e < c.E; ++e) {
            if (!used[static_cast<std::size_t>(e)]) continue;
            gate_up->fill(rng, 1.0f / std::sqrt(static_cast<float>(c.H)), e);
            down->fill(rng, 1.0f / std::sqrt(static_cast<float>(c.I)), e);
          }
          return [=](const Feed& f) {
            Tensor y;
            f.be.moe_experts(f.in(x), f.w(*gate_up), f.w(*down), f.in(experts), f.in(weights), 0,
                             y);
            return std::vector<Tensor>{y};
          };
        });
  }

  // --- fused decode ops ---
  // Each against the CPU's default body (the unfused sequence). The released shapes at 1-4 rows
  // (the fused kernels), odd widths (off the 16-byte chunks, or f32 chunks of 4), and a prefill
  // size (the unfused path on the device).
  struct HcShape {
    std::int64_t S, W, rank;
    bool inject;
    DType dtype;
  };
  for (const auto& c : std::vector<HcShape>{{1, 2560, 320, true, BF16},
                                            {2, 2560, 320, true, BF16},
                                            {3, 2560, 320, false, BF16},
                                            {4, 2560, 320, true, BF16},
                                            {4, 40, 12, true, F32},
                                            {3, 40, 10, true, BF16},
                                            {2, 36, 8, true, BF16},
                                            {2, 64, 16, true, BF16},
                                            {1, 64, 16, false, F32},
                                            {40, 256, 16, true, BF16}}) {
    add("hyper_connection_read_S" + n(c.S) + "_W" + n(c.W) + "_r" + n(c.rank) +
            (c.inject ? "_inject_" : "_") + dt(c.dtype),
        kProduct, [=](Rng& rng) -> OpRun {
          const std::int64_t streams = 4, in = streams * c.W;
          auto h = random_tensor({c.S, in}, rng, 2.0f);
          auto norm = std::make_shared<HostWeight>(random_weight(F32, {in}, rng, 0.5f));
          auto down = std::make_shared<HostWeight>(
              random_weight(c.dtype, {c.rank, in}, rng, 4.0f / std::sqrt(static_cast<float>(in))));
          auto up = std::make_shared<HostWeight>(random_weight(
              c.dtype, {in, c.rank}, rng, 4.0f / std::sqrt(static_cast<float>(c.rank))));
          auto inj = std::make_shared<HostWeight>(
              random_weight(c.dtype, {streams, in}, rng, 4.0f / std::sqrt(static_cast<float>(in))));
          return [=](const Feed& f) {
            Tensor mixed, inject;
            f.be.hyper_connection_read(f.in(h), f.w(*norm), f.w(*down), f.w(*up), f.w(*inj),
                                       streams, c.W, 1e-6f, mixed, c.inject ? &inject : nullptr);
            return c.inject ? std::vector<Tensor>{mixed, inject} : std::vector<Tensor>{mixed};
          };
        });
  }
  struct InProjShape {
    std::int64_t S, in, key_dim, value_dim, heads;
    DType dtype;
  };
  for (const auto& c : std::vector<InProjShape>{{1, 2560, 2048, 6144, 48, BF16},
                                                {2, 2560, 2048, 6144, 48, BF16},
                                                {4, 2560, 2048, 6144, 48, BF16},
                                                {3, 256, 128, 256, 8, F32},
                                                {2, 70, 64, 128, 8, BF16},
                                                // few long rows: a block per row
                                                {2, 10240, 128, 256, 8, BF16},
                                                {3, 4096, 64, 128, 4, F32},
                                                {20, 256, 128, 256, 8, BF16}}) {
    add("gated_delta_net_in_proj_S" + n(c.S) + "_in" + n(c.in) + "_k" + n(c.key_dim) + "_v" +
            n(c.value_dim) + "_" + dt(c.dtype),
        kProduct, [=](Rng& rng) -> OpRun {
          const float ws = 1.0f / std::sqrt(static_cast<float>(c.in));
          auto x = random_tensor({c.S, c.in}, rng);
          auto qkv = std::make_shared<HostWeight>(
              random_weight(c.dtype, {2 * c.key_dim + c.value_dim, c.in}, rng, ws));
          auto z =
              std::make_shared<HostWeight>(random_weight(c.dtype, {c.value_dim, c.in}, rng, ws));
          auto b =
              std::make_shared<HostWeight>(random_weight(c.dtype, {c.heads, c.in}, rng, 8 * ws));
          auto a =
              std::make_shared<HostWeight>(random_weight(c.dtype, {c.heads, c.in}, rng, 8 * ws));
          auto dt_bias = std::make_shared<HostWeight>(random_weight(F32, {c.heads}, rng));
          auto decay = std::make_shared<HostWeight>(random_weight(F32, {c.heads}, rng));
          return [=](const Feed& f) {
            Tensor oqkv, oz, obeta, og;
            f.be.gated_delta_net_in_proj(f.in(x), f.w(*qkv), f.w(*z), f.w(*b), f.w(*a),
                                         f.w(*dt_bias), f.w(*decay), oqkv, oz, obeta, og);
            return std::vector<Tensor>{oqkv, oz, obeta, og};
          };
        });
  }
  // FP8 projections: the fused multi_gemv on e4m3 bytes (1-4 rows, a block per row for few long
  // rows) and the unfused sequence beyond.
  for (const auto& c : std::vector<InProjShape>{{1, 2560, 2048, 6144, 48, F32},
                                                {3, 2560, 2048, 6144, 48, F32},
                                                {2, 10240, 128, 256, 8, F32},
                                                {20, 256, 128, 256, 8, F32}}) {
    add("gated_delta_net_in_proj_S" + n(c.S) + "_in" + n(c.in) + "_k" + n(c.key_dim) + "_v" +
            n(c.value_dim) + "_fp8",
        kProduct, [=](Rng& rng) -> OpRun {
          const float ws = 1.0f / std::sqrt(static_cast<float>(c.in));
          auto x = random_tensor({c.S, c.in}, rng);
          auto make = [&](std::int64_t rows, float scale) {
            auto w = std::make_shared<HostFp8Weight>(Shape{rows, c.in});
            w->fill_all(rng, scale);
            return w;
          };
          auto qkv = make(2 * c.key_dim + c.value_dim, ws), z = make(c.value_dim, ws);
          auto b = make(c.heads, 8 * ws), a = make(c.heads, 8 * ws);
          auto dt_bias = std::make_shared<HostWeight>(random_weight(F32, {c.heads}, rng));
          auto decay = std::make_shared<HostWeight>(random_weight(F32, {c.heads}, rng));
          return [=](const Feed& f) {
            Tensor oqkv, oz, obeta, og;
            f.be.gated_delta_net_in_proj(f.in(x), f.w(*qkv), f.w(*z), f.w(*b), f.w(*a),
                                         f.w(*dt_bias), f.w(*decay), oqkv, oz, obeta, og);
            return std::vector<Tensor>{oqkv, oz, obeta, og};
          };
        });
  }
  struct ConvShape {
    std::int64_t S, key_dim, value_dim, head_dim;
    DType dtype;
  };
  for (const auto& c : std::vector<ConvShape>{{1, 2048, 6144, 128, BF16},
                                              {2, 2048, 6144, 128, BF16},
                                              {4, 2048, 6144, 128, F32},
                                              {9, 2048, 6144, 128, BF16},
                                              {5, 128, 100, 32, F32},
                                              {3, 96, 40, 48, BF16},
                                              {70, 128, 256, 32, F32}}) {
    add("gated_delta_net_conv_S" + n(c.S) + "_k" + n(c.key_dim) + "_v" + n(c.value_dim) + "_d" +
            n(c.head_dim) + "_" + dt(c.dtype),
        kReduction, [=](Rng& rng) -> OpRun {
          const std::int64_t C = 2 * c.key_dim + c.value_dim, K = 4;
          auto qkv = random_tensor({c.S, C}, rng, 2.0f),
               tail = random_tensor({K - 1, C}, rng, 2.0f);
          auto w = std::make_shared<HostWeight>(random_weight(c.dtype, {C, K}, rng, 0.5f));
          return [=](const Feed& f) {
            auto t = f.in(tail);
            Tensor q, k, v;
            f.be.gated_delta_net_conv(f.in(qkv), f.w(*w), t, c.key_dim, c.head_dim, q, k, v);
            return std::vector<Tensor>{q, k, v, t};
          };
        });
  }
  // The decode step's two GatedDeltaNet ops (the conv in the in-projections' epilogue; the q/k
  // norms, the recurrence and the gated norm in one kernel a value head on the GPU).
  for (const auto& c : gdn_step_shapes()) {
    add("gated_delta_net_step_" + c.name(), kDeltaRule, [=](Rng& rng) -> OpRun {
      const auto in = gdn_step_inputs(c, rng);
      return [=](const Feed& f) { return in->run(f, /*sequence=*/false); };
    });
  }
  struct RouteShape {
    std::int64_t S, H, E, k;
    bool normalize;
    DType dtype;
  };
  for (const auto& c : std::vector<RouteShape>{{1, 2560, 512, 10, true, BF16},
                                               {2, 2560, 512, 10, true, BF16},
                                               {4, 2560, 512, 10, false, BF16},
                                               {3, 72, 8, 2, true, F32},
                                               {2, 256, 1024, 8, true, F32},
                                               {1, 256, 1500, 6, false, F32},
                                               {64, 256, 512, 10, true, BF16}}) {
    add("route_experts_S" + n(c.S) + "_H" + n(c.H) + "_E" + n(c.E) + "_k" + n(c.k) +
            (c.normalize ? "_norm_" : "_") + dt(c.dtype),
        kReduction, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({c.S, c.H}, rng);
          auto router = std::make_shared<HostWeight>(
              random_weight(c.dtype, {c.E, c.H}, rng, 3.0f / std::sqrt(static_cast<float>(c.H))));
          return [=](const Feed& f) {
            Tensor experts, weights;
            f.be.route_experts(f.in(x), f.w(*router), c.k, c.normalize, experts, weights);
            return std::vector<Tensor>{experts, weights};
          };
        });
  }
  struct SharedShape {
    std::int64_t S, H, I;
    DType dtype;
  };
  for (const auto& c : std::vector<SharedShape>{{1, 2560, 640, BF16},
                                                {2, 2560, 640, BF16},
                                                {3, 2560, 640, F32},
                                                {4, 2560, 640, BF16},
                                                {2, 72, 36, F32},
                                                {3, 70, 37, BF16},
                                                {20, 256, 64, BF16}}) {
    add("shared_expert_S" + n(c.S) + "_H" + n(c.H) + "_I" + n(c.I) + "_" + dt(c.dtype), kProduct,
        [=](Rng& rng) -> OpRun {
          const float hs = 1.0f / std::sqrt(static_cast<float>(c.H));
          auto x = random_tensor({c.S, c.H}, rng), y = random_tensor({c.S, c.H}, rng);
          auto gate = std::make_shared<HostWeight>(random_weight(c.dtype, {c.I, c.H}, rng, hs));
          auto up = std::make_shared<HostWeight>(random_weight(c.dtype, {c.I, c.H}, rng, hs));
          auto down = std::make_shared<HostWeight>(
              random_weight(c.dtype, {c.H, c.I}, rng, 1.0f / std::sqrt(static_cast<float>(c.I))));
          auto eg = std::make_shared<HostWeight>(random_weight(c.dtype, {1, c.H}, rng, 4 * hs));
          return [=](const Feed& f) {
            auto t = f.in(y);
            f.be.shared_expert(f.in(x), f.w(*gate), f.w(*up), f.w(*down), f.w(*eg), t);
            return std::vector<Tensor>{t};
          };
        });
  }
  // FP8 gate/up/down beside a bf16 or f32 expert gate (the FP8 releases keep it unquantised):
  // the fused kernels at 1-4 rows (8-lane groups for the 640-wide down), the sequence beyond.
  for (const auto& c : std::vector<SharedShape>{{1, 2560, 640, BF16},
                                                {3, 2560, 640, F32},
                                                {4, 2560, 640, BF16},
                                                {2, 256, 192, BF16},
                                                {20, 256, 64, BF16}}) {
    add("shared_expert_S" + n(c.S) + "_H" + n(c.H) + "_I" + n(c.I) + "_fp8_gate_" + dt(c.dtype),
        kProduct, [=](Rng& rng) -> OpRun {
          const float hs = 1.0f / std::sqrt(static_cast<float>(c.H));
          auto x = random_tensor({c.S, c.H}, rng), y = random_tensor({c.S, c.H}, rng);
          auto gate = std::make_shared<HostFp8Weight>(Shape{c.I, c.H});
          auto up = std::make_shared<HostFp8Weight>(Shape{c.I, c.H});
          auto down = std::make_shared<HostFp8Weight>(Shape{c.H, c.I});
          gate->fill_all(rng, hs);
          up->fill_all(rng, hs);
          down->fill_all(rng, 1.0f / std::sqrt(static_cast<float>(c.I)));
          auto eg = std::make_shared<HostWeight>(random_weight(c.dtype, {1, c.H}, rng, 4 * hs));
          return [=](const Feed& f) {
            auto t = f.in(y);
            f.be.shared_expert(f.in(x), f.w(*gate), f.w(*up), f.w(*down), f.w(*eg), t);
            return std::vector<Tensor>{t};
          };
        });
  }

  // The whole Qwen MoE block (moe_block): the routing, the routed and the shared experts.
  for (const auto& c : moe_block_shapes()) {
    add(c.name(), kProduct, [=](Rng& rng) -> OpRun {
      auto in = moe_block_inputs(c, rng);
      return [in](const Feed& f) { return in->run(f, /*sequence=*/false); };
    });
  }

  // The same block written into four hyper-connection streams (moe_block_into_streams).
  for (const auto& c : moe_block_shapes()) {
    add(c.name() + "_into_streams", kProduct, [=](Rng& rng) -> OpRun {
      auto in = moe_block_inputs(c, rng);
      return [in](const Feed& f) { return in->run_into_streams(f, /*sequence=*/false); };
    });
  }
  // A sublayer's output projection written into the streams (linear_into_streams): the released
  // out-projections (6144 -> 2560, FP8 and bf16) at 1-4 tokens, f32 rows off the chunk width, and
  // more tokens than the fused kernel takes.
  for (const auto& c : linear_streams_shapes()) {
    add(c.name(), kProduct, [=](Rng& rng) -> OpRun {
      auto in = linear_streams_inputs(c, rng);
      return [in](const Feed& f) { return in->run(f, /*sequence=*/false); };
    });
  }

  // The per-head norms and RoPE of QSA's queries and keys (head_norm_rope).
  for (const auto& c : head_norm_rope_shapes()) {
    add(c.name(), kReduction, [=](Rng& rng) -> OpRun {
      auto in = head_norm_rope_inputs(c, rng);
      return [in](const Feed& f) { return in->run(f, /*sequence=*/false); };
    });
  }
  // QSA's four projections over one x (qsa_projections).
  for (const auto& c : qsa_projection_shapes()) {
    add(c.name(), kProduct, [=](Rng& rng) -> OpRun {
      auto in = qsa_projection_inputs(c, rng);
      return [in](const Feed& f) { return in->run(f, /*sequence=*/false); };
    });
  }

  // --- mHC and the DeepSeek/GLM router (model/common/mhc.h, router.h) ---
  struct MhcShape {
    std::int64_t S, H, D;
    bool head;
  };
  for (const auto& c : std::vector<MhcShape>{{3, 2, 64, false},
                                             {5, 4, 64, false},
                                             {1, 4, 4096, false},
                                             {4, 4, 4096, true},
                                             {2, 4, 64, true}}) {
    add("mhc_S" + n(c.S) + "_H" + n(c.H) + "_D" + n(c.D) + (c.head ? "_head" : ""), kReduction,
        [=](Rng& rng) -> OpRun {
          const auto mix = c.head ? c.H : (2 + c.H) * c.H;
          auto h = random_tensor({c.S, c.H * c.D}, rng), y = random_tensor({c.S, c.D}, rng);
          // Raw logits that the row's RMS scalar (~1.7 for uniform h) brings to a few units.
          auto m = random_tensor({c.S, mix}, rng, 1.5f);
          auto base = std::make_shared<HostWeight>(random_weight(F32, {mix}, rng, 1.0f));
          auto scale = std::make_shared<HostWeight>(
              random_weight(F32, {c.head ? std::int64_t{1} : 3}, rng, 1.0f));
          return [=](const Feed& f) {
            Tensor pre, post, comb, collapsed;
            auto hh = f.in(h);
            f.be.mhc_weights(hh, f.in(m), f.w(*base), f.w(*scale), c.H, 1e-6f, 1e-6f, 20, pre,
                             c.head ? nullptr : &post, c.head ? nullptr : &comb);
            f.be.weighted_stream_sum(hh, pre, collapsed);
            if (c.head) return std::vector<Tensor>{pre, collapsed};
            f.be.mhc_expand(hh, f.in(y), post, comb);
            return std::vector<Tensor>{pre, post, comb, collapsed, hh};
          };
        });
  }
  struct SelectShape {
    std::int64_t S, E, k, groups, top_groups;
    bool bias, normalize, hashed;
    float scaling;
  };
  // Qwen-like softmax scores without bias; GLM 5.3 (sigmoid, bias, 8 groups of which 4, scaled
  // 2.5); DeepSeek V4 (sqrt-softplus, bias, 256 top-6, 1.5) and its hash layers; a prefill size.
  for (const auto& c : std::vector<SelectShape>{{3, 64, 4, 1, 1, false, true, false, 1.0f},
                                                {2, 256, 8, 8, 4, true, true, false, 2.5f},
                                                {4, 288, 8, 8, 4, true, false, false, 2.5f},
                                                {1, 256, 6, 1, 1, true, true, false, 1.5f},
                                                {5, 256, 6, 1, 1, false, true, true, 1.5f},
                                                {70, 256, 6, 1, 1, true, true, false, 1.5f}}) {
    add("select_experts_S" + n(c.S) + "_E" + n(c.E) + "_k" + n(c.k) + "_g" + n(c.groups) +
            (c.bias ? "_bias" : "") + (c.hashed ? "_hash" : "") + (c.normalize ? "_norm" : ""),
        kElementwise, [=](Rng& rng) -> OpRun {
          // Scores in (0, 1] as the activated router gives them; ties from 1/64 steps.
          auto scores = tied_tensor({c.S, c.E}, rng, 64);
          for (std::int64_t i = 0; i < scores.numel(); ++i)
            scores.data()[i] = 0.5f + 0.5f * std::fabs(scores.data()[i]);
          auto bias = std::make_shared<HostWeight>(random_weight(F32, {c.E}, rng, 0.1f));
          constexpr std::int64_t vocab = 50;
          auto table = std::make_shared<HostWeight>(DType::kI64, Shape{vocab, c.k});
          auto* t = reinterpret_cast<std::int64_t*>(table->bytes());
          for (std::int64_t i = 0; i < vocab * c.k; ++i) t[i] = rng.below(static_cast<int>(c.E));
          std::vector<std::int32_t> tok(static_cast<std::size_t>(c.S));
          for (auto& v : tok) v = rng.below(static_cast<int>(vocab));
          auto tokens = i32_tensor({c.S, 1}, tok);
          return [=](const Feed& f) {
            Tensor experts, weights;
            const auto ids = f.in(tokens);
            f.be.select_experts(f.in(scores), c.bias ? f.w(*bias) : Weight{},
                                c.hashed ? f.w(*table) : Weight{}, c.hashed ? &ids : nullptr,
                                c.groups, c.top_groups, c.k, c.normalize, c.scaling, experts,
                                weights);
            return std::vector<Tensor>{experts, weights};
          };
        });
  }
  // 24 tokens take the grouped products (cuda_grouped_gemm.h) with the clamp in their epilogue.
  for (const auto& c : std::vector<MoeShape>{
           {1, 256, 8, 64, 2, BF16}, {3, 256, 8, 64, 2, F32}, {24, 256, 8, 64, 2, BF16}}) {
    add("moe_experts_clamped_S" + n(c.S) + "_" + dt(c.dtype), kProduct, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({c.S, c.H}, rng, 4.0f);
      auto [experts, weights] = random_routing(c.S, c.E, c.k, rng);
      // Large enough that many gate and up values pass the limit of 1.
      auto gate_up = std::make_shared<HostWeight>(random_weight(c.dtype, {c.E, 2 * c.I, c.H}, rng));
      auto down = std::make_shared<HostWeight>(
          random_weight(c.dtype, {c.E, c.H, c.I}, rng, 1.0f / std::sqrt(static_cast<float>(c.I))));
      return [=](const Feed& f) {
        Tensor y;
        f.be.moe_experts(f.in(x), f.w(*gate_up), f.w(*down), f.in(experts), f.in(weights), 1.0f, y);
        auto c2 = f.in(x);
        f.be.clamp(c2, -0.5f, 0.25f);
        auto a = f.in(x);
        f.be.activate(a, Activation::kSqrtSoftplus);
        return std::vector<Tensor>{y, c2, a};
      };
    });
  }

  // --- the sampler's softmax denominators (a double carried in int64 bits) ---
  for (const auto& [S, V] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {1, 248320}, {4, 1000}, {3, 129280}, {2, 100003}}) {
    // Wide rows take the sliced kernels on CUDA; the 100,003-wide row's maximum lies in its last,
    // partial slice (every slice's maximum enters the row's).
    add("softmax_denominators_" + n(S) + "x" + n(V), 1e-12, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, V}, rng, 8.0f);
      if (V == 100003)
        for (std::int64_t r = 0; r < S; ++r) x.data()[r * V + V - 2] = 40.0f;
      return [=](const Feed& f) {
        Tensor totals;
        f.be.softmax_denominators(f.in(x), 0.7, totals);
        // The doubles as f32 for the comparison: relative differences of double rounding stay
        // far below the tolerance, a wrong sum does not.
        const Tensor host = totals.to(host_memory());
        Tensor as_f32({S, 1});
        for (std::int64_t r = 0; r < S; ++r)
          as_f32.data()[r] =
              static_cast<float>(std::log(std::bit_cast<double>(host.data_as<std::int64_t>()[r])));
        return std::vector<Tensor>{f.in(as_f32)};
      };
    });
  }
  // --- the sampler's draw from a whole row (sample_rows): the CPU's is the host sampler's; a GPU's
  // sums in slices, so an id differs only for a uniform within double rounding of a boundary
  // (never, for these 64-bit uniforms) ---
  for (const auto& [S, V, T, form] :
       std::vector<std::tuple<std::int64_t, std::int64_t, double, int>>{{1, 248320, 0.8, 0},
                                                                        {4, 248320, 1.0, 0},
                                                                        {3, 129280, 0.6, 1},
                                                                        {2, 100003, 2.0, 2},
                                                                        {5, 1000, 0.7, 0}}) {
    add("sample_rows_" + n(S) + "x" + n(V) + "_f" + n(form), kExact, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, V}, rng, 8.0f);
      float* p = x.data();
      for (std::int64_t r = 0; r < S; ++r) {
        // 1: a peaked row (one id holds nearly all the mass); 2: a third of the ids at -inf.
        if (form == 1) p[r * V + (r * 7919) % V] = 60.0f;
        if (form == 2)
          for (std::int64_t c = r; c < V; c += 3) p[r * V + c] = -INFINITY;
      }
      std::vector<double> u(static_cast<std::size_t>(S));
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      for (auto& v : u) v = uniform(rng.engine());
      if (S > 1) u[1] = 0.0;  // the first id with mass
      return [=](const Feed& f) {
        Tensor ids;
        f.be.sample_rows(f.in(x), T, u, ids);
        return std::vector<Tensor>{ids};
      };
    });
  }
  // --- a rejected draft's correction (sample_residual_rows): the residual of a verify row p
  // against a draft row q; the CPU's is the host sampler's; a GPU's sums in slices. q close to p
  // (a draft head's row), narrower (a draft vocabulary), equal to p (no residual mass: a draw
  // from p), and a third of p's ids at -inf ---
  for (const auto& [S, V, Vq, T, form] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, double, int>>{
           {1, 248320, 248320, 0.8, 0},
           {3, 248320, 131072, 1.0, 0},
           {2, 129280, 129280, 0.6, 1},
           {2, 100003, 100003, 2.0, 2},
           {4, 1000, 1000, 0.7, 0}}) {
    add("sample_residual_rows_" + n(S) + "x" + n(V) + "_q" + n(Vq) + "_f" + n(form), kExact,
        [=](Rng& rng) -> OpRun {
          auto p = random_tensor({S, V}, rng, 8.0f);
          auto noise = random_tensor({S, Vq}, rng, 2.0f);
          Tensor q({S, Vq});
          for (std::int64_t r = 0; r < S; ++r)
            for (std::int64_t c = 0; c < Vq; ++c)
              q.data()[r * Vq + c] =
                  p.data()[r * V + c] + (form == 1 ? 0.0f : noise.data()[r * Vq + c]);
          if (form == 2)
            for (std::int64_t r = 0; r < S; ++r)
              for (std::int64_t c = r; c < V; c += 3) p.data()[r * V + c] = -INFINITY;
          std::vector<double> u(static_cast<std::size_t>(S));
          std::uniform_real_distribution<double> uniform(0.0, 1.0);
          for (auto& v : u) v = uniform(rng.engine());
          if (S > 1) u[1] = 0.0;  // the first id with residual mass
          return [=](const Feed& f) {
            Tensor ids;
            f.be.sample_residual_rows(f.in(p), f.in(q), T, u, ids);
            return std::vector<Tensor>{ids};
          };
        });
  }
  // --- an id's probability under its whole row (token_probs), as a log in f32 like the
  // denominators above: ids with mass, the row's best, and one at -inf (probability 0 on both,
  // compared as -1000) ---
  for (const auto& [S, V, T] : std::vector<std::tuple<std::int64_t, std::int64_t, double>>{
           {4, 248320, 0.8}, {3, 100003, 1.3}, {2, 1000, 0.6}}) {
    add("token_probs_" + n(S) + "x" + n(V), 1e-12, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, V}, rng, 8.0f);
      std::vector<std::int32_t> ids(static_cast<std::size_t>(S));
      for (std::int64_t r = 0; r < S; ++r)
        ids[static_cast<std::size_t>(r)] = static_cast<std::int32_t>((r * 40009 + 17) % V);
      x.data()[0 * V + ids[0]] = 30.0f;  // row 0's id is its best
      if (S > 1) x.data()[1 * V + ids[1]] = -INFINITY;
      return [=](const Feed& f) {
        Tensor probs;
        f.be.token_probs(f.in(x), T, ids, probs);
        const Tensor host = probs.to(host_memory());
        Tensor as_f32({S, 1});
        for (std::int64_t r = 0; r < S; ++r) {
          const double p = std::bit_cast<double>(host.data_as<std::int64_t>()[r]);
          as_f32.data()[r] = p > 0 ? static_cast<float>(std::log(p)) : -1000.0f;  // no mass
        }
        return std::vector<Tensor>{f.in(as_f32)};
      };
    });
  }
  // --- the sampler's penalties subtracted where the rows lie: one float subtraction an entry, so
  // the same bits on every backend ---
  for (const auto& [S, V, draws] : std::vector<std::tuple<std::int64_t, std::int64_t, int>>{
           {1, 248320, 700}, {4, 1000, 300}, {3, 50, 0}}) {
    add("penalise_entries_" + n(S) + "x" + n(V) + "_n" + n(draws), 0.0, [=](Rng& rng) -> OpRun {
      auto x = random_tensor({S, V}, rng, 8.0f);
      // Distinct (row, col) pairs: draws that repeat one are dropped. Repetition penalties of
      // 1 (none), above and below 1, on logits of both signs; amounts of 0 (a prompt's token).
      std::set<std::pair<std::int32_t, std::int32_t>> seen;
      std::vector<EntryPenalty> entries;
      const float repetitions[] = {1.0f, 1.3f, 0.85f, 1.05f};
      for (int i = 0; i < draws; ++i) {
        const auto row = static_cast<std::int32_t>(rng.below(static_cast<int>(S)));
        const auto col = static_cast<std::int32_t>(rng.below(static_cast<int>(V)));
        if (seen.insert({row, col}).second)
          entries.push_back(
              {row, col, repetitions[rng.below(4)], 0.25f * static_cast<float>(rng.below(13))});
      }
      return [=](const Feed& f) {
        Tensor y = f.in(x);
        f.be.penalise_entries(y, entries);
        return std::vector<Tensor>{y};
      };
    });
  }
  return cases;
}

// DeepSeek V4's compressed attention (backend.h "compressed attention"), at the fixture's shapes
// and at Flash's (head 512, rope 64, window 128, CSA ratio 4 with 1024-wide projections, HCA 128,
// 64 indexer heads of 128).
std::vector<Case> compressed_attention_cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, double tol, std::function<OpRun(Rng&)> build) {
    cases.push_back({std::move(name), tol, std::move(build)});
  };
  constexpr auto F32 = DType::kF32;
  constexpr auto BF16 = DType::kBF16;
  struct RopeShape {
    std::int64_t rows, heads, head_dim, rotary, first, stride;
    bool inverse;
  };
  for (const auto& c : std::vector<RopeShape>{{5, 4, 32, 8, 0, 1, false},
                                              {3, 1, 32, 8, 4, 4, false},
                                              {5, 4, 32, 8, 37, 1, true},
                                              {6, 16, 16, 8, 8, 1, false},
                                              {4, 64, 512, 64, 70000, 1, false},
                                              {3, 64, 512, 64, 70000, 1, true},
                                              {2, 1, 512, 64, 4096, 128, false}}) {
    add("rope_interleaved_" + n(c.rows) + "x" + n(c.heads) + "x" + n(c.head_dim) + "_r" +
            n(c.rotary) + "_at" + n(c.first) + "_step" + n(c.stride) + (c.inverse ? "_inv" : ""),
        kElementwise, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({c.rows, c.heads * c.head_dim}, rng);
          auto f = std::make_shared<HostWeight>(random_weight(F32, {c.rotary / 2}, rng, 1.0f));
          return [=](const Feed& fd) {
            auto t = fd.in(x);
            fd.be.rope_interleaved(t, c.head_dim, fd.w(*f), c.first, c.stride, c.inverse);
            return std::vector<Tensor>{t};
          };
        });
  }
  struct PoolShape {
    std::int64_t width, ratio, src_first, rows, first_window, windows;
    bool overlap;
  };
  for (const auto& c : std::vector<PoolShape>{{32, 16, 0, 40, 0, 2, false},
                                              {64, 4, 0, 13, 0, 3, true},
                                              {64, 4, 4, 9, 2, 1, true},
                                              {32, 4, 28, 8, 8, 1, true},
                                              {2048, 4, 0, 40, 0, 10, true},
                                              {1024, 4, 60, 8, 16, 1, true},
                                              {512, 128, 128, 130, 1, 1, false}}) {
    add("compressor_pool_w" + n(c.width) + "_m" + n(c.ratio) + "_from" + n(c.src_first) + "_n" +
            n(c.rows) + "_win" + n(c.first_window) + "+" + n(c.windows) +
            (c.overlap ? "_overlap" : ""),
        kReduction, [=](Rng& rng) -> OpRun {
          auto kv = random_tensor({c.rows, c.width}, rng),
               gate = random_tensor({c.rows, c.width}, rng, 3.0f);
          auto bias =
              std::make_shared<HostWeight>(random_weight(F32, {c.ratio, c.width}, rng, 1.0f));
          return [=](const Feed& f) {
            Tensor o;
            f.be.compressor_pool(f.in(kv), f.in(gate), c.src_first, f.w(*bias), c.first_window,
                                 c.windows, c.overlap, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  for (const auto& [S, N, heads, dim] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>>{
           {5, 7, 16, 16}, {1, 0, 16, 16}, {4, 300, 64, 128}, {1, 2048, 64, 128}}) {
    add("weighted_index_scores_S" + n(S) + "_N" + n(N) + "_h" + n(heads) + "_d" + n(dim),
        kReduction, [=](Rng& rng) -> OpRun {
          auto q = random_tensor({S, heads * dim}, rng), keys = random_tensor({N, dim}, rng),
               w = random_tensor({S, heads}, rng);
          const float scale = 1.0f / std::sqrt(static_cast<float>(heads * dim));
          return [=](const Feed& f) {
            Tensor o;
            f.be.weighted_index_scores(f.in(q), f.in(keys), f.in(w), scale, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  // kind: 0 sliding only, 1 every visible compressed row (HCA), 2 the indexer's picks (CSA).
  struct AttnShape {
    std::int64_t S, first, kv_first, H, D, window, ratio, top;
    int kind;
  };
  for (const auto& c : std::vector<AttnShape>{{64, 0, 0, 4, 32, 8, 0, 0, 0},
                                              {1, 40, 33, 4, 32, 8, 0, 0, 0},
                                              {64, 0, 0, 4, 32, 8, 16, 0, 1},
                                              {3, 50, 43, 4, 32, 8, 16, 0, 1},
                                              {64, 0, 0, 4, 32, 8, 4, 4, 2},
                                              {7, 100, 80, 4, 32, 8, 4, 4, 2},
                                              {4, 300, 100, 64, 512, 128, 4, 16, 2},
                                              {1, 1000, 800, 64, 512, 128, 128, 0, 1},
                                              {130, 0, 0, 64, 512, 128, 0, 0, 0}}) {
    add("sink_attention_S" + n(c.S) + "_at" + n(c.first) + "_kv" + n(c.kv_first) + "_H" + n(c.H) +
            "_D" + n(c.D) + "_W" + n(c.window) + "_m" + n(c.ratio) + "_top" + n(c.top) + "_k" +
            n(c.kind),
        kProduct, [=](Rng& rng) -> OpRun {
          const auto end = c.first + c.S;
          const auto N = c.ratio > 0 ? end / c.ratio : 0;
          auto q = random_tensor({c.S, c.H * c.D}, rng, 0.5f),
               kv = random_tensor({end - c.kv_first, c.D}, rng),
               comp = random_tensor({N, c.D}, rng);
          auto picked = c.kind == 2 ? random_picks(c.S, c.first, c.ratio, c.top, rng) : Tensor{};
          auto sinks = std::make_shared<HostWeight>(random_weight(F32, {c.H}, rng, 2.0f));
          const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
          return [=](const Feed& f) {
            Tensor o, p = c.kind == 2 ? f.in(picked) : Tensor{};
            f.be.sink_attention(f.in(q), f.in(kv), c.kv_first, c.window,
                                N > 0 ? f.in(comp) : Tensor{}, c.kind == 0 ? 0 : c.ratio,
                                c.kind == 2 ? &p : nullptr, f.w(*sinks), c.first, scale, o);
            return std::vector<Tensor>{o};
          };
        });
  }
  for (const auto& [S, G, in, out, dtype] :
       std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, DType>>{
           {5, 2, 64, 16, F32}, {1, 8, 4096, 1024, BF16}, {6, 8, 4096, 1024, BF16}}) {
    add("grouped_linear_S" + n(S) + "_G" + n(G) + "_in" + n(in) + "_out" + n(out) + "_" + dt(dtype),
        kProduct, [=](Rng& rng) -> OpRun {
          auto x = random_tensor({S, G * in}, rng);
          auto w = std::make_shared<HostWeight>(
              random_weight(dtype, {G * out, in}, rng, 1.0f / std::sqrt(static_cast<float>(in))));
          return [=](const Feed& f) {
            Tensor y;
            f.be.grouped_linear(f.in(x), f.w(*w), G, y);
            return std::vector<Tensor>{y};
          };
        });
  }
  // The official graph's numerics (exact on every backend: a max, butterflies in one order,
  // power-of-two scaling and the shared rounding). Rows of very different magnitudes, an all-zero
  // block and near-zero blocks (the FP8 floor), ties (values on E4M3's and E2M1's midpoints).
  auto varied = [](Shape shape, Rng& rng) {
    Tensor t = random_tensor(std::move(shape), rng);
    for (std::int64_t r = 0; r < t.rows(); ++r) {
      const float magnitude = std::ldexp(1.0f, static_cast<int>(rng.below(40)) - 24);
      float* p = t.row(r);
      for (std::int64_t c = 0; c < t.cols(); ++c) p[c] *= magnitude;
      if (r == 1)
        for (std::int64_t c = 0; c < std::min<std::int64_t>(t.cols(), 70); ++c) p[c] = 0;
      if (r == 2)  // midpoints of the 448-scaled grid: 17, 19, 1.0625, -2.5 ...
        for (std::int64_t c = 0; c < t.cols(); ++c)
          p[c] = c == 0 ? 448.0f : static_cast<float>(rng.below(64) * 2 + 1) / 16.0f;
    }
    return t;
  };
  struct Fp8Shape {
    std::int64_t rows, width, cols, block;
  };
  // The fixture's KV rows (24 non-RoPE dims of 32: one short block), Flash's (448 of 512), a
  // span that ends in a short block, and a span of the whole row.
  for (const auto& c : std::vector<Fp8Shape>{{6, 32, 24, 64},
                                             {7, 512, 448, 64},
                                             {300, 512, 448, 64},
                                             {5, 100, 90, 64},
                                             {4, 64, 64, 16}}) {
    add("fp8_e4m3_simulate_" + n(c.rows) + "x" + n(c.width) + "_cols" + n(c.cols) + "_b" +
            n(c.block),
        kExact, [=](Rng& rng) -> OpRun {
          auto x = varied({c.rows, c.width}, rng);
          return [=](const Feed& f) {
            auto t = f.in(x);
            f.be.fp8_e4m3_simulate(t, c.cols, c.block);
            return std::vector<Tensor>{t};
          };
        });
  }
  struct HadamardShape {
    std::int64_t rows, width, block, fp4_block;
  };
  // The fixture's indexer queries (16 heads of 16) and compressed rows, Flash's (64 heads of 128,
  // FP4 blocks of 32), the rotation alone, and groups of a wider head.
  for (const auto& c : std::vector<HadamardShape>{{5, 256, 16, 32},
                                                  {6, 16, 16, 32},
                                                  {4, 64 * 128, 128, 32},
                                                  {200, 128, 128, 32},
                                                  {3, 128, 128, 0},
                                                  {2, 512, 128, 48}}) {
    add("hadamard_fp4_simulate_" + n(c.rows) + "x" + n(c.width) + "_h" + n(c.block) + "_fp4_" +
            n(c.fp4_block),
        kExact, [=](Rng& rng) -> OpRun {
          auto x = varied({c.rows, c.width}, rng);
          return [=](const Feed& f) {
            auto t = f.in(x);
            f.be.hadamard_fp4_simulate(t, c.block, c.fp4_block);
            return std::vector<Tensor>{t};
          };
        });
  }
  return cases;
}

const std::vector<Case>& all_cases() {
  static const std::vector<Case> cases = [] {
    auto all = make_cases();
    for (auto& c : compressed_attention_cases()) all.push_back(std::move(c));
    return all;
  }();
  return cases;
}

struct ParityParam {
  std::string backend;
  std::size_t index;
};

void PrintTo(const ParityParam& p, std::ostream* os) {
  *os << p.backend << " " << all_cases()[p.index].name;
}

std::vector<ParityParam> parity_params(const std::string& backend) {
  std::vector<ParityParam> out;
  for (std::size_t i = 0; i < all_cases().size(); ++i) out.push_back({backend, i});
  return out;
}

std::string param_name(const ::testing::TestParamInfo<ParityParam>& info) {
  std::string s = all_cases()[info.param.index].name;
  for (auto& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// The backend under test; nullptr (and a skip message) when it cannot run here.
std::unique_ptr<Backend> backend_under_test(const std::string& name, std::string* why) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "cuda") {
    if (!cuda_available()) {
      *why = "no CUDA device: this build has no CUDA backend or the machine has no GPU";
      return nullptr;
    }
    auto be = make_cuda_backend();
    if (!be.ok()) {
      *why = "no CUDA device: " + be.status().to_string();
      return nullptr;
    }
    return std::move(*be);
  }
  *why = "unknown backend " + name;
  return nullptr;
}

// Host copies of outputs, any dtype.
struct HostOut {
  DType dtype;
  Shape shape;
  std::vector<float> f;
  std::vector<std::int32_t> i;
};
HostOut to_host(const Tensor& t) {
  HostOut h{t.dtype(), t.shape(), {}, {}};
  if (t.dtype() == DType::kI32) {
    const Tensor c = t.to(host_memory());
    h.i.assign(c.data_as<std::int32_t>(), c.data_as<std::int32_t>() + c.numel());
  } else {
    h.f = t.to_host_vector();
  }
  return h;
}

class BackendOps : public ::testing::TestWithParam<ParityParam> {};

TEST_P(BackendOps, MatchesCpu) {
  std::string why;
  auto be = backend_under_test(GetParam().backend, &why);
  if (!be) GTEST_SKIP() << why;
  const Case& c = all_cases()[GetParam().index];
  Rng rng(0x5eed0000u + GetParam().index);
  const OpRun run = c.build(rng);

  auto cpu = make_cpu_backend();
  std::vector<HostOut> ref, got;
  for (const auto& t : run(Feed{*cpu})) ref.push_back(to_host(t));
  ASSERT_TRUE(cpu->status().ok()) << "cpu: " << cpu->status().to_string();
  {
    const auto outs = run(Feed{*be});
    be->synchronize();
    ASSERT_TRUE(be->status().ok()) << be->name() << ": " << be->status().to_string();
    for (const auto& t : outs) {
      EXPECT_EQ(t.device(), be->memory()->device()) << "an output left the backend's memory";
      got.push_back(to_host(t));
    }
  }
  ASSERT_EQ(ref.size(), got.size());
  for (std::size_t o = 0; o < ref.size(); ++o) {
    SCOPED_TRACE("output " + std::to_string(o) + " of " + c.name);
    ASSERT_EQ(got[o].dtype, ref[o].dtype);
    ASSERT_EQ(got[o].shape, ref[o].shape);
    if (ref[o].dtype == DType::kI32) {
      for (std::size_t i = 0; i < ref[o].i.size(); ++i)
        ASSERT_EQ(got[o].i[i], ref[o].i[i]) << "index " << i;
      continue;
    }
    double max_ref = 0, max_err = 0, se = 0, sr = 0;
    std::size_t worst = 0;
    for (std::size_t i = 0; i < ref[o].f.size(); ++i) {
      const double r = ref[o].f[i], g = got[o].f[i];
      ASSERT_FALSE(std::isnan(g) && !std::isnan(r)) << "NaN at " << i;
      max_ref = std::max(max_ref, std::fabs(r));
      const double e = std::fabs(g - r);
      if (e > max_err || std::isnan(e)) max_err = e, worst = i;
      se += e * e;
      sr += r * r;
    }
    const double err = max_err / std::max(1.0, max_ref);
    const double nmse = sr > 0 ? se / sr : se;
    EXPECT_LE(err, c.tolerance) << "normalised max error " << err << " at " << worst << " (ref "
                                << (ref[o].f.empty() ? 0.0f : ref[o].f[worst]) << ", got "
                                << (got[o].f.empty() ? 0.0f : got[o].f[worst]) << "), NMSE "
                                << nmse;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackendOps, ::testing::ValuesIn(parity_params("cpu")), param_name);
INSTANTIATE_TEST_SUITE_P(Cuda, BackendOps, ::testing::ValuesIn(parity_params("cuda")), param_name);

// Dry ops (the bench's overlapped op-group pass) queue nothing: outputs get their shapes and
// keep what the memory held, and the backend computes again once they are off.
TEST(CudaDryOps, QueueNothingAndKeepTheOutputs) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  Rng rng(0xd7u);
  const Feed f{*be};
  const auto x = random_tensor({1, 64}, rng, 1.0f);
  const auto w = random_weight(DType::kBF16, {32, 64}, rng, 0.2f);
  const Weight wd = f.w(w);
  const Tensor xd = f.in(x);
  Tensor y = f.in(Tensor(Shape{1, 32}));
  ASSERT_TRUE(be->set_dry_ops(true));
  be->linear(xd, wd, y);
  be->synchronize();
  ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  EXPECT_EQ(y.shape(), (Shape{1, 32}));
  for (const float v : y.to_host_vector()) EXPECT_EQ(v, 0.0f);
  be->set_dry_ops(false);
  be->linear(xd, wd, y);
  const auto got = y.to_host_vector();
  EXPECT_TRUE(std::any_of(got.begin(), got.end(), [](float v) { return v != 0.0f; }));
  EXPECT_FALSE(make_cpu_backend()->set_dry_ops(true));
}

// An MTP verify's 2-4 tokens through the FP8 GEMV sum each token's row as the one-token call does
// (the same lanes per row at every token count; session 15's out-projection path stages x beyond
// 48 KB and takes two rows a warp): bit for bit, at the released out-projection (6144 -> 2560) and
// GDN qkv (2560 -> 10240) shapes.
TEST(CudaLinearFp8, EachTokenOfAVerifySumsAsItsDecodeStep) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  for (const auto& [in, out] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{6144, 2560}, {2560, 10240}}) {
    Rng rng(0xf8a1u + static_cast<unsigned>(in));
    const Feed f{*be};
    HostFp8Weight w(Shape{out, in});
    w.fill_all(rng, 1.0f / std::sqrt(static_cast<float>(in)));
    const Weight wd = f.w(w);
    for (const std::int64_t S : {2, 3, 4}) {
      SCOPED_TRACE("in " + std::to_string(in) + " S " + std::to_string(S));
      const auto x = random_tensor({S, in}, rng);
      Tensor all;
      be->linear(f.in(x), wd, all);
      const auto got = all.to_host_vector();
      for (std::int64_t t = 0; t < S; ++t) {
        Tensor row(host_memory(), {1, in}, DType::kF32);
        std::memcpy(row.raw(), x.data() + t * in, static_cast<std::size_t>(in) * sizeof(float));
        Tensor one;
        be->linear(f.in(row), wd, one);
        const auto want = one.to_host_vector();
        ASSERT_EQ(want.size(), static_cast<std::size_t>(out));
        EXPECT_EQ(std::memcmp(want.data(), got.data() + t * out, want.size() * sizeof(float)), 0)
            << "token " << t;
      }
    }
    ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  }
}

// An MTP verify's 2-4 tokens go through the routed experts as 2-4 decode steps would: each
// token's row of y is the one-token call's on that row, bit for bit (the verify then accepts
// exactly what autoregressive decoding picks, up to the other ops' sums).
TEST(CudaMoePairs, EachTokenOfAVerifySumsAsItsDecodeStep) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  for (const auto& [S, H, E, I, k, dtype] : std::vector<
           std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, DType>>{
           {4, 2560, 64, 640, 10, DType::kBF16}, {3, 256, 8, 64, 4, DType::kF32}}) {
    SCOPED_TRACE("S " + std::to_string(S) + " H " + std::to_string(H));
    Rng rng(0x9a125u + static_cast<unsigned>(S));
    const Feed f{*be};
    const auto x = random_tensor({S, H}, rng);
    auto [experts, weights] = random_routing(S, E, k, rng);
    HostWeight gate_up(dtype, Shape{E, 2 * I, H}), down(dtype, Shape{E, H, I});
    gate_up.fill(rng, 1.0f / std::sqrt(static_cast<float>(H)), 0, E * 2 * I * H);
    down.fill(rng, 1.0f / std::sqrt(static_cast<float>(I)), 0, E * H * I);
    const Weight gu = f.w(gate_up), dn = f.w(down);
    Tensor all;
    be->moe_experts(f.in(x), gu, dn, f.in(experts), f.in(weights), 0, all);
    const auto got = all.to_host_vector();
    for (std::int64_t t = 0; t < S; ++t) {
      const auto row = [&](const Tensor& m, std::int64_t cols, DType d) {
        Tensor r(host_memory(), {1, cols}, d);
        std::memcpy(r.raw(), static_cast<const char*>(m.raw()) + t * cols * dtype_size(d),
                    static_cast<std::size_t>(cols) * dtype_size(d));
        return f.in(r);
      };
      Tensor one;
      be->moe_experts(row(x, H, DType::kF32), gu, dn, row(experts, k, DType::kI32),
                      row(weights, k, DType::kF32), 0, one);
      const auto want = one.to_host_vector();
      ASSERT_EQ(want.size(), static_cast<std::size_t>(H));
      EXPECT_EQ(std::memcmp(want.data(), got.data() + t * H, want.size() * sizeof(float)), 0)
          << "token " << t;
    }
    ASSERT_TRUE(be->status().ok()) << be->status().to_string();
  }
}

// A fused CUDA op against its sequence of ops on the same backend, shape by shape: `make(c, rng)`
// gives the inputs, whose run(feed, sequence) returns the outputs of the fused op (false) or of
// its sequence (true); every output must be equal in bits.
template <typename Shapes, typename MakeInputs>
void expect_fused_equals_sequence(Backend& be, const Shapes& shapes, std::uint64_t seed,
                                  MakeInputs make) {
  for (const auto& c : shapes) {
    SCOPED_TRACE(c.name());
    Rng rng(++seed);
    const auto in = make(c, rng);
    const Feed f{be};
    const auto fused = in->run(f, /*sequence=*/false);
    const auto sequence = in->run(f, /*sequence=*/true);
    be.synchronize();
    ASSERT_TRUE(be.status().ok()) << be.status().to_string();
    ASSERT_EQ(fused.size(), sequence.size());
    for (std::size_t o = 0; o < fused.size(); ++o) {
      SCOPED_TRACE("output " + std::to_string(o));
      const Tensor a = fused[o].to(host_memory()), b = sequence[o].to(host_memory());
      ASSERT_EQ(a.dtype(), b.dtype());
      ASSERT_EQ(a.shape(), b.shape());
      EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0);
    }
  }
}

// The CUDA qsa_projections (one multi_gemv, cuda_fused.cu) computes the bits of its sequence
// (linear, add_bias) on the same backend: at 1-4 rows its rows sum with the lanes linear takes and
// the bias is added after the sum, as add_bias adds it; beyond, it is the sequence.
TEST(CudaQsaProjections, EqualsItsSequenceBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  if (std::getenv("FLASHSERVE_CUDA_QSA_UNFUSED") != nullptr)
    GTEST_SKIP() << "FLASHSERVE_CUDA_QSA_UNFUSED is set: nothing fused to compare";
  expect_fused_equals_sequence(*be, qsa_projection_shapes(), 0x95a0u, qsa_projection_inputs);
}

// The CUDA head_norm_rope (one kernel, cuda_elementwise.cu) computes the bits of its sequence
// (rms_norm, rope) on the same backend.
TEST(CudaHeadNormRope, EqualsItsSequenceBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  if (std::getenv("FLASHSERVE_CUDA_QSA_UNFUSED") != nullptr)
    GTEST_SKIP() << "FLASHSERVE_CUDA_QSA_UNFUSED is set: nothing fused to compare";
  expect_fused_equals_sequence(*be, head_norm_rope_shapes(), 0x40e3u, head_norm_rope_inputs);
}

// block_sparse_attention's tiled split kernel (cuda_attention_tiles.cu) against the split kernel
// before it (FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION=1) on the released decode shapes: 24 query / 2
// KV heads of 256, top 512 blocks of 4, 1-4 query rows at 1k, 16k and 64k keys, the same inputs.
// The two sum in different orders, so within fp32 rounding, not bit for bit; the op suite's
// Cuda/ cases check both against the CPU.
TEST(CudaAttention, TiledSplitKernelMatchesTheKernelBefore) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  const UnsetOnExit restore{"FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION"};
  if (std::getenv("FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION") != nullptr ||
      std::getenv("FLASHSERVE_CUDA_OLD_ATTENTION") != nullptr ||
      std::getenv("FLASHSERVE_CUDA_OLD_CONTEXT") != nullptr)
    GTEST_SKIP() << "an old-kernel switch is set";
  constexpr std::int64_t Hq = 24, Hkv = 2, D = 256, block = 4, top = 512;
  Rng rng(0x7173a11u);
  const Feed f{*be};
  for (const std::int64_t T : {1024, 16384, 65536}) {
    const auto k = random_tensor({T, Hkv * D}, rng), v = random_tensor({T, Hkv * D}, rng);
    const Tensor kd = f.in(k), vd = f.in(v);
    for (const std::int64_t S : {1, 2, 3, 4}) {
      SCOPED_TRACE("T " + std::to_string(T) + " S " + std::to_string(S));
      const auto first = T - S;
      // Queries scaled up so the softmax is peaked (one key can dominate a tile).
      const auto q = random_tensor({S, Hq * D}, rng, 4.0f);
      const auto picked = random_picks(S, first, block, top, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(D));
      Tensor tiled, before;
      be->block_sparse_attention(f.in(q), kd, vd, Hq, Hkv, f.in(picked), block, first, scale,
                                 tiled);
      setenv("FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION", "1", 1);
      be->block_sparse_attention(f.in(q), kd, vd, Hq, Hkv, f.in(picked), block, first, scale,
                                 before);
      unsetenv("FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION");
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const auto a = tiled.to_host_vector(), b = before.to_host_vector();
      ASSERT_EQ(a.size(), b.size());
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
      EXPECT_LT(worst, 2e-5);
    }
  }
}

// A hyper-connection read of S tokens, 4 streams of width W, rank `rank`, with or without its
// injection gates.
struct HcCase {
  std::int64_t S, W, rank;
  bool inject;
  DType dtype;
};
// A hyper-connection read's weights over 4 streams of width W (rank `rank`, matrices in `dtype`),
// uploaded to f's backend, and its call on h (`inject` null: no injection gates).
struct HcReadWeights {
  static constexpr std::int64_t kStreams = 4;
  std::int64_t W = 0;
  Weight norm, down, up, inj;
  HcReadWeights(const Feed& f, std::int64_t width, std::int64_t rank, DType dtype, Rng& rng)
      : W(width) {
    const std::int64_t in = kStreams * W;
    norm = f.w(random_weight(DType::kF32, {in}, rng, 0.5f));
    down = f.w(random_weight(dtype, {rank, in}, rng, 4.0f / std::sqrt(static_cast<float>(in))));
    up = f.w(random_weight(dtype, {in, rank}, rng, 4.0f / std::sqrt(static_cast<float>(rank))));
    inj = f.w(random_weight(dtype, {kStreams, in}, rng, 4.0f / std::sqrt(static_cast<float>(in))));
  }
  void read(Backend& be, const Tensor& h, Tensor& mixed, Tensor* inject) const {
    be.hyper_connection_read(h, norm, down, up, inj, kStreams, W, 1e-6f, mixed, inject);
  }
};

// The hyper-connection read's stream mix reads h and the norm weight before its wait (session 17).
// The values are the same, so the bits must be those of the kernel that reads them after the wait
// (FLASHSERVE_CUDA_HC_PREWAIT=0). h is rewritten by a kernel right before every read, so a stream
// mix that read h before hc_down's wait for that kernel had released it would see the old h.
TEST(CudaHyperConnection, ReadsBeforeTheWaitsGiveTheBitsOfTheKernelsBefore) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  const UnsetOnExit restore{"FLASHSERVE_CUDA_HC_PREWAIT"};
  if (std::getenv("FLASHSERVE_CUDA_HC_PREWAIT") != nullptr)
    GTEST_SKIP() << "FLASHSERVE_CUDA_HC_PREWAIT is set";
  Rng rng(0x4c7e0u);
  const Feed f{*be};
  for (const auto& c : std::vector<HcCase>{{1, 2560, 320, true, DType::kBF16},
                                           {2, 2560, 320, true, DType::kBF16},
                                           {3, 2560, 320, false, DType::kBF16},
                                           {4, 2560, 320, true, DType::kBF16},
                                           {2, 40, 12, true, DType::kF32},
                                           {1, 64, 16, false, DType::kBF16}}) {
    SCOPED_TRACE("S " + std::to_string(c.S) + " W " + std::to_string(c.W));
    const std::int64_t in = HcReadWeights::kStreams * c.W;
    Tensor h = f.in(random_tensor({c.S, in}, rng, 2.0f));
    const Tensor delta = f.in(random_tensor({c.S, in}, rng, 0.5f));
    const HcReadWeights hc(f, c.W, c.rank, c.dtype, rng);
    for (int step = 0; step < 4; ++step) {
      be->add(h, delta);  // the kernel right before the read writes h
      Tensor mixed, inject, mixed0, inject0;
      hc.read(*be, h, mixed, c.inject ? &inject : nullptr);
      setenv("FLASHSERVE_CUDA_HC_PREWAIT", "0", 1);
      hc.read(*be, h, mixed0, c.inject ? &inject0 : nullptr);
      unsetenv("FLASHSERVE_CUDA_HC_PREWAIT");
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const auto a = mixed.to_host_vector(), b = mixed0.to_host_vector();
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "step " << step;
      if (c.inject) {
        const auto ia = inject.to_host_vector(), ib = inject0.to_host_vector();
        EXPECT_EQ(std::memcmp(ia.data(), ib.data(), ia.size() * sizeof(float)), 0)
            << "step " << step;
      }
    }
  }
}

// An MTP verify reads 2-4 tokens' streams in one call; each token's mixed input and injection
// must be the bits its one-token read gives (the decode step's), or a verify could accept what
// decoding would not. Every form of the first kernel is checked: split by stream (the default at
// one token since session 36, so the one-token reads take it and the 2-4-token reads do not) with
// 3 rows a block and with one, and unsplit (FLASHSERVE_CUDA_HC_SPLIT=0) with rows a block
// (session 20), one row a block with session 19's launch (FLASHSERVE_CUDA_HC_DOWN_ROWS=1), and
// the form before that (with FLASHSERVE_CUDA_OLD_HC_DOWN=1).
TEST(CudaHyperConnection, EachTokenOfSeveralReadsItsOneTokenBits) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  const UnsetOnExit restore{"FLASHSERVE_CUDA_OLD_HC_DOWN"},
      restore_rows{"FLASHSERVE_CUDA_HC_DOWN_ROWS"}, restore_split{"FLASHSERVE_CUDA_HC_SPLIT"};
  Rng rng(0x4c7e1u);
  const Feed f{*be};
  constexpr std::int64_t streams = HcReadWeights::kStreams, W = 2560, in = streams * W;
  const HcReadWeights hc(f, W, 320, DType::kBF16, rng);
  for (const int form : {0, 1, 2, 3, 4}) {
    unsetenv("FLASHSERVE_CUDA_HC_DOWN_ROWS");
    unsetenv("FLASHSERVE_CUDA_OLD_HC_DOWN");
    unsetenv("FLASHSERVE_CUDA_HC_SPLIT");
    if (form >= 2) setenv("FLASHSERVE_CUDA_HC_SPLIT", "0", 1);
    if (form == 1 || form >= 3) setenv("FLASHSERVE_CUDA_HC_DOWN_ROWS", "1", 1);
    if (form == 4) setenv("FLASHSERVE_CUDA_OLD_HC_DOWN", "1", 1);
    for (const std::int64_t S : {2, 3, 4}) {
      SCOPED_TRACE("S " + std::to_string(S) + " form " + std::to_string(form));
      const auto all = random_tensor({S, in}, rng, 2.0f);
      Tensor mixed, inject;
      hc.read(*be, f.in(all), mixed, &inject);
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const auto m = mixed.to_host_vector(), j = inject.to_host_vector();
      ASSERT_EQ(m.size(), static_cast<std::size_t>(S * W));
      ASSERT_EQ(j.size(), static_cast<std::size_t>(S * streams));
      const auto rows = all.to_host_vector();
      for (std::int64_t s = 0; s < S; ++s) {
        const std::vector<float> row(rows.begin() + s * in, rows.begin() + (s + 1) * in);
        Tensor one_mixed, one_inject;
        hc.read(*be, f.in(Tensor({1, in}, row)), one_mixed, &one_inject);
        ASSERT_TRUE(be->status().ok()) << be->status().to_string();
        const auto om = one_mixed.to_host_vector(), oj = one_inject.to_host_vector();
        EXPECT_EQ(std::memcmp(om.data(), m.data() + s * W, W * sizeof(float)), 0) << "token " << s;
        EXPECT_EQ(std::memcmp(oj.data(), j.data() + s * streams, streams * sizeof(float)), 0)
            << "token " << s;
      }
    }
  }
}

// The first kernel takes 1-4 rows of (mix_down, inject) a block (FLASHSERVE_CUDA_HC_DOWN_ROWS,
// session 20: fewer blocks each reading h and the norm weight through L2), whole rows or, split
// by stream (session 36, FLASHSERVE_CUDA_HC_SPLIT), a quarter of each with the rest of the sum in
// the stream mix. A row's sums are the same chunks in the same order in every form, so every form
// must give the unsplit one-row form's bits, on shapes whose blocks straddle mix_down and inject
// and whose last block is short. The split is taken at one token with rank 32-320; at 2-4 tokens
// and at rank 12-16 (fewer chunks than the stream mix's 8 lanes) the read stays unsplit.
TEST(CudaHyperConnection, EveryFormOfTheFirstKernelGivesTheSameBits) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  const UnsetOnExit restore{"FLASHSERVE_CUDA_HC_DOWN_ROWS"},
      restore_split{"FLASHSERVE_CUDA_HC_SPLIT"};
  Rng rng(0x4c7e2u);
  const Feed f{*be};
  for (const auto& c : std::vector<HcCase>{{1, 2560, 320, true, DType::kBF16},
                                           {2, 2560, 320, true, DType::kBF16},
                                           {3, 2560, 320, false, DType::kBF16},
                                           {4, 2560, 320, true, DType::kBF16},
                                           {1, 64, 16, true, DType::kBF16},
                                           {4, 64, 16, false, DType::kBF16},
                                           {1, 64, 64, true, DType::kBF16},
                                           {3, 40, 12, true, DType::kF32},
                                           {1, 40, 32, true, DType::kF32},
                                           {1, 40, 32, false, DType::kF32}}) {
    const Tensor h = f.in(random_tensor({c.S, HcReadWeights::kStreams * c.W}, rng, 2.0f));
    const HcReadWeights hc(f, c.W, c.rank, c.dtype, rng);
    std::vector<float> want_mixed, want_inject;
    for (const char* form : {"0/1", "0/2", "0/3", "0/4", "1/1", "1/2", "1/3", "1/4"}) {
      const std::string split(form, 1), rows(form + 2);
      SCOPED_TRACE("S " + std::to_string(c.S) + " W " + std::to_string(c.W) + " rank " +
                   std::to_string(c.rank) + " split/rows " + form);
      setenv("FLASHSERVE_CUDA_HC_SPLIT", split.c_str(), 1);
      setenv("FLASHSERVE_CUDA_HC_DOWN_ROWS", rows.c_str(), 1);
      Tensor mixed, inject;
      hc.read(*be, h, mixed, c.inject ? &inject : nullptr);
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const auto m = mixed.to_host_vector();
      const auto j = c.inject ? inject.to_host_vector() : std::vector<float>{};
      if (want_mixed.empty()) {
        want_mixed = m;
        want_inject = j;
        continue;
      }
      ASSERT_EQ(m.size(), want_mixed.size());
      EXPECT_EQ(std::memcmp(m.data(), want_mixed.data(), m.size() * sizeof(float)), 0);
      ASSERT_EQ(j.size(), want_inject.size());
      EXPECT_EQ(std::memcmp(j.data(), want_inject.data(), j.size() * sizeof(float)), 0);
    }
  }
}

// mul_activated is activate(gate) then mul(x, gate) in one kernel: the same bits, and gate may stay
// as it was.
TEST(CudaMulActivated, EqualsActivateThenMulBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  Rng rng(0x5191u);
  const Feed f{*be};
  for (const auto act : {Activation::kSigmoid, Activation::kSilu, Activation::kSoftplus}) {
    for (const std::int64_t n : {1, 6144, 6145, 24 * 256 * 4}) {
      const auto x = random_tensor({1, n}, rng, 3.0f), g = random_tensor({1, n}, rng, 4.0f);
      Tensor xf = f.in(x), gf = f.in(g), xs = f.in(x), gs = f.in(g);
      be->mul_activated(xf, gf, act);
      be->activate(gs, act);
      be->mul(xs, gs);
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const auto a = xf.to_host_vector(), b = xs.to_host_vector();
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << n;
    }
  }
}

// The plain launches made overlapped in session 17 (grouped_dot, causal_conv1d and its tail
// update), each right after a kernel that writes its input: a kernel that read before its wait
// would see the input before that write, and differ from the CPU.
TEST(CudaOverlappedLaunches, GroupedDotAndCausalConvReadTheirInputsAfterTheirWaits) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  Rng rng(0x5192u);
  auto cpu = backend_under_test("cpu", &why);
  ASSERT_TRUE(cpu) << why;
  const std::int64_t S = 3, C = 1024, K = 4;
  const auto a = random_tensor({S, C}, rng), b = random_tensor({S, C}, rng),
             d = random_tensor({S, C}, rng);
  const auto tail = random_tensor({K - 1, C}, rng);
  const auto w = random_weight(DType::kF32, {C, K}, rng, 0.5f);
  auto run = [&](Backend& be2) {
    const Feed g{be2};
    Tensor ad = g.in(a), bd = g.in(b), td = g.in(tail), dots, conv;
    be2.add(ad, g.in(d));
    be2.grouped_dot(ad, bd, 64, dots);
    be2.add(bd, g.in(d));
    be2.causal_conv1d(bd, g.w(w), 1, td, conv);
    be2.add(ad, conv);  // conv read after the tail update queued behind it
    return std::vector<std::vector<float>>{dots.to_host_vector(), conv.to_host_vector(),
                                           td.to_host_vector(), ad.to_host_vector()};
  };
  const auto on_gpu = run(*be), on_cpu = run(*cpu);
  for (std::size_t i = 0; i < on_gpu.size(); ++i) {
    ASSERT_EQ(on_gpu[i].size(), on_cpu[i].size());
    double worst = 0;
    for (std::size_t j = 0; j < on_gpu[i].size(); ++j)
      worst = std::max(worst, static_cast<double>(std::fabs(on_gpu[i][j] - on_cpu[i][j])));
    EXPECT_LT(worst, 1e-4) << "output " << i;
  }
}

// The CUDA moe_block is exact by construction (cuda_moe_block.cu): its five kernels compute what
// route_experts, moe_experts and shared_expert compute on the same backend, bit for bit, at one
// token (the fused kernels) and beyond (the sequence). Bitwise, not within a tolerance.
TEST(CudaMoeBlock, EqualsItsSequenceBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  expect_fused_equals_sequence(*be, moe_block_shapes(), 0x30eb10c0u, moe_block_inputs);
}

// One token of FP8 experts takes the routed down, the shared down and the combine in one kernel
// (session 22; FLASHSERVE_CUDA_MOE_DOWN_COMBINE=0 runs the two kernels before it): the same bits
// for y and for the streams, on the released shapes and on shapes whose last block of columns is
// short, whose rows end inside a 128-column block and whose lanes hold one chunk or none.
TEST(CudaMoeBlock, OneKernelDownAndCombineEqualTheTwoKernelsBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  const UnsetOnExit restore{"FLASHSERVE_CUDA_MOE_DOWN_COMBINE"};
  std::uint64_t seed = 0x30eb30c0u;
  for (const auto& c : std::vector<MoeBlockShape>{{1, 2560, 512, 10, 640, 640, DType::kBF16, true},
                                                  {1, 304, 16, 4, 336, 336, DType::kF32, true},
                                                  {1, 256, 8, 2, 192, 192, DType::kF32, true},
                                                  {1, 96, 8, 7, 48, 48, DType::kBF16, true}}) {
    SCOPED_TRACE(c.name());
    Rng rng(++seed);
    const auto in = moe_block_inputs(c, rng);
    const Feed f{*be};
    std::vector<std::vector<float>> want;
    for (const char* one_kernel : {"0", "1"}) {
      setenv("FLASHSERVE_CUDA_MOE_DOWN_COMBINE", one_kernel, 1);
      const auto y = in->run(f, /*sequence=*/false);
      const auto h = in->run_into_streams(f, /*sequence=*/false);
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const std::vector<std::vector<float>> got{y[1].to_host_vector(), y[2].to_host_vector(),
                                                h[2].to_host_vector()};
      if (want.empty()) {
        want = got;
        continue;
      }
      for (std::size_t o = 0; o < got.size(); ++o) {
        ASSERT_EQ(got[o].size(), want[o].size()) << "output " << o;
        EXPECT_EQ(std::memcmp(got[o].data(), want[o].data(), got[o].size() * sizeof(float)), 0)
            << "output " << o;
      }
    }
  }
}

// An MTP verify runs the MoE block over 2-4 tokens (one call since session 20); each token's
// routing and output must be the bits of that token's own one-token block (the decode step's),
// or a verify could accept what decoding would not.
TEST(CudaMoeBlock, EachTokenOfSeveralGetsItsOneTokenBits) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  std::uint64_t seed = 0x30eb20c0u;
  for (const bool fp8 : {true, false}) {
    const MoeBlockShape c{4, 2560, 512, 10, 640, 640, DType::kBF16, fp8};
    SCOPED_TRACE(c.name());
    Rng rng(++seed);
    const auto all = moe_block_inputs(c, rng);
    const Feed f{*be};
    const auto many = all->run(f, /*sequence=*/false);
    const auto many_h = all->run_into_streams(f, /*sequence=*/false);
    std::vector<Tensor> outs;  // experts (int32), weights, y: 4-byte values
    for (const auto& t : many) outs.push_back(t.to(host_memory()));
    const auto streams = many_h[2].to_host_vector();
    const auto span_of = [](const Tensor& t) {
      return std::vector<float>(t.span().begin(), t.span().end());
    };
    const auto x = span_of(all->x), h = span_of(all->h), gates = span_of(all->inject);
    for (std::int64_t s = 0; s < c.S; ++s) {
      SCOPED_TRACE("token " + std::to_string(s));
      MoeBlockInputs one = *all;
      one.c.S = 1;
      const auto row = [&](const std::vector<float>& v, std::int64_t width) {
        return Tensor({1, width},
                      std::vector<float>(v.begin() + s * width, v.begin() + (s + 1) * width));
      };
      one.x = row(x, c.H);
      one.h = row(h, 4 * c.H);
      one.inject = row(gates, 4);
      const auto single = one.run(f, /*sequence=*/false);
      const auto single_h = one.run_into_streams(f, /*sequence=*/false);
      ASSERT_TRUE(be->status().ok()) << be->status().to_string();
      const std::int64_t widths[] = {c.k, c.k, c.H};
      for (std::size_t o = 0; o < single.size(); ++o) {
        const Tensor got = single[o].to(host_memory());
        ASSERT_EQ(got.numel(), widths[o]);
        EXPECT_EQ(
            std::memcmp(got.raw(), static_cast<const char*>(outs[o].raw()) + s * widths[o] * 4,
                        got.bytes()),
            0)
            << "output " << o;
      }
      const auto got_h = single_h[2].to_host_vector();
      ASSERT_EQ(got_h.size(), static_cast<std::size_t>(4 * c.H));
      EXPECT_EQ(std::memcmp(got_h.data(), streams.data() + s * 4 * c.H, got_h.size() * 4), 0)
          << "streams";
    }
  }
}

// The decode router's picks as two redux.sync a pick with the picks kept in lanes (session 20)
// must be the shuffle reductions' picks and weights bit for bit
// (FLASHSERVE_CUDA_OLD_ROUTE_PICKS=1), ties included: routers with repeated rows give equal
// logits, which both must order by the lower expert id.
TEST(CudaRouting, FastPicksEqualThePicksBeforeBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  const UnsetOnExit restore{"FLASHSERVE_CUDA_OLD_ROUTE_PICKS"};
  struct Case {
    std::int64_t S, H, E, k;
    bool normalize;
  };
  Rng rng(0x7a0e5u);
  const Feed f{*be};
  for (const auto& c : std::vector<Case>{{1, 256, 512, 10, true},
                                         {4, 256, 512, 10, true},
                                         {3, 128, 256, 8, false},
                                         {2, 64, 8, 8, true},
                                         {1, 64, 40, 32, true},
                                         {2, 64, 200, 1, false}}) {
    SCOPED_TRACE("S " + std::to_string(c.S) + " E " + std::to_string(c.E) + " k " +
                 std::to_string(c.k));
    auto router = random_weight(DType::kF32, {c.E, c.H}, rng, 1.0f);
    // Every third row repeats the row before it: equal logits, equal p.
    auto* rows = reinterpret_cast<float*>(router.bytes());
    for (std::int64_t e = 2; e < c.E; e += 3)
      std::copy(rows + (e - 1) * c.H, rows + e * c.H, rows + e * c.H);
    const Weight r = f.w(router);
    const Tensor x = f.in(random_tensor({c.S, c.H}, rng, 1.0f));
    Tensor ids_fast, w_fast, ids_old, w_old;
    unsetenv("FLASHSERVE_CUDA_OLD_ROUTE_PICKS");
    be->route_experts(x, r, c.k, c.normalize, ids_fast, w_fast);
    setenv("FLASHSERVE_CUDA_OLD_ROUTE_PICKS", "1", 1);
    be->route_experts(x, r, c.k, c.normalize, ids_old, w_old);
    ASSERT_TRUE(be->status().ok()) << be->status().to_string();
    const Tensor a = ids_fast.to(host_memory()), b = ids_old.to(host_memory());
    ASSERT_EQ(a.bytes(), b.bytes());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0) << "ids";
    const auto wa = w_fast.to_host_vector(), wb = w_old.to_host_vector();
    ASSERT_EQ(wa.size(), wb.size());
    EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0) << "weights";
  }
}

// The hyper-connection write in the producer's kernel (linear_into_streams and
// moe_block_into_streams, cuda_epilogue.cuh StreamsOut) computes the bits of the op then
// add_scaled_streams: the same row values, then add_scaled_streams' arithmetic. The projections
// run right after kernels that write h, the gates and x (LinearStreamsInputs' writes_before): a
// kernel that read h or the gates before their writers finished, or x before its wait, would
// differ from the sequence.
// Each output of a fused op has its sequence's bits (after the backend finished both).
void expect_same_bits(Backend& be, const std::vector<Tensor>& fused,
                      const std::vector<Tensor>& sequence) {
  be.synchronize();
  ASSERT_TRUE(be.status().ok()) << be.status().to_string();
  ASSERT_EQ(fused.size(), sequence.size());
  for (std::size_t o = 0; o < fused.size(); ++o) {
    const Tensor a = fused[o].to(host_memory()), b = sequence[o].to(host_memory());
    ASSERT_EQ(a.shape(), b.shape()) << "output " << o;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.bytes()), 0) << "output " << o;
  }
}

// The gated attention (QSA's output gate applied where the attention writes its output: the
// merge, or the tiled kernel of one split) gives the bits of block_sparse_attention then
// mul_activated on the same backend, on every kernel the op may take: the tiled kernel with the
// merge (1-4 rows at 1k and 16k) and without it (a chunk of one tile; a prefill's many rows), the
// split kernel before it with its merge (FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION=1) and the earliest
// kernel, which takes no gate (FLASHSERVE_CUDA_OLD_ATTENTION=1: the op runs mul_activated).
TEST(CudaAttention, TheGatedOpEqualsAttentionThenMulActivatedBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  for (const char* v : {"FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION", "FLASHSERVE_CUDA_OLD_ATTENTION",
                        "FLASHSERVE_CUDA_OLD_CONTEXT"})
    if (std::getenv(v) != nullptr) GTEST_SKIP() << "an old-kernel switch is set: " << v;
  Rng rng(0x9a7e0u);
  const Feed f{*be};
  struct Case {
    std::int64_t S, T, Hq, Hkv, D, top;
    const char* old;  // the switch that picks an earlier kernel, or null
  };
  for (const auto& c :
       std::vector<Case>{{1, 1024, 24, 2, 256, 512, nullptr},
                         {4, 1027, 24, 2, 256, 512, nullptr},
                         {2, 16384, 24, 2, 256, 512, nullptr},
                         {1, 9, 32, 1, 64, 2, nullptr},
                         {200, 3000, 8, 2, 64, 128, nullptr},
                         {3, 1024, 24, 2, 256, 512, "FLASHSERVE_CUDA_OLD_SPLIT_ATTENTION"},
                         {2, 700, 24, 2, 256, 512, "FLASHSERVE_CUDA_OLD_ATTENTION"}}) {
    SCOPED_TRACE("S " + std::to_string(c.S) + " T " + std::to_string(c.T) + " top " +
                 std::to_string(c.top) + (c.old != nullptr ? std::string(" ") + c.old : ""));
    constexpr std::int64_t block = 4;
    const auto first = c.T - c.S;
    const auto q = random_tensor({c.S, c.Hq * c.D}, rng, 4.0f);
    const auto k = random_tensor({c.T, c.Hkv * c.D}, rng),
               v = random_tensor({c.T, c.Hkv * c.D}, rng);
    const auto gate = random_tensor({c.S, c.Hq * c.D}, rng, 3.0f);
    const auto picked = random_picks(c.S, first, block, c.top, rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    if (c.old != nullptr) setenv(c.old, "1", 1);
    Tensor fused, sequence, g1 = f.in(gate), g2 = f.in(gate);
    const Tensor qd = f.in(q), kd = f.in(k), vd = f.in(v), pd = f.in(picked);
    be->gated_block_sparse_attention(qd, kd, vd, c.Hq, c.Hkv, pd, block, first, scale, g1,
                                     Activation::kSigmoid, fused);
    be->block_sparse_attention(qd, kd, vd, c.Hq, c.Hkv, pd, block, first, scale, sequence);
    be->mul_activated(sequence, g2, Activation::kSigmoid);
    if (c.old != nullptr) unsetenv(c.old);
    expect_same_bits(*be, {fused}, {sequence});
  }
}

TEST(CudaStreamsWrite, EqualsTheOpThenAddScaledStreamsBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  if (std::getenv("FLASHSERVE_CUDA_FUSED_HC_WRITE") != nullptr)
    GTEST_SKIP() << "FLASHSERVE_CUDA_FUSED_HC_WRITE is set";
  const Feed f{*be};
  const auto compare = [&](const std::vector<Tensor>& fused, const std::vector<Tensor>& sequence) {
    expect_same_bits(*be, fused, sequence);
  };
  std::uint64_t seed = 0x57e4u;
  for (const auto& c : linear_streams_shapes()) {
    SCOPED_TRACE(c.name());
    Rng rng(++seed);
    auto in = linear_streams_inputs(c, rng);
    const auto fused = in->run(f, /*sequence=*/false, /*writes_before=*/true);
    compare(fused, in->run(f, /*sequence=*/true, /*writes_before=*/true));
  }
  for (const auto& c : moe_block_shapes()) {
    SCOPED_TRACE(c.name() + " into streams");
    Rng rng(++seed);
    auto in = moe_block_inputs(c, rng);
    const auto fused = in->run_into_streams(f, /*sequence=*/false);
    compare(fused, in->run_into_streams(f, /*sequence=*/true));
  }
}

// A GatedDeltaNet decode step runs two ops (gated_delta_net_in_proj_conv, gated_delta_net_core),
// an MTP verify the four before them (in_proj, conv, the recurrence keeping its states, the gated
// norm). Each must give the other's bits, or a verify could accept a draft that decoding would not
// have picked: the normed output, z, beta, g, the conv tail and the state, bit for bit.
TEST(CudaGdnStep, TheDecodeStepsTwoOpsEqualTheVerifysSequenceBitForBit) {
  std::string why;
  auto be = backend_under_test("cuda", &why);
  if (!be) GTEST_SKIP() << why;
  if (std::getenv("FLASHSERVE_CUDA_GDN_UNFUSED") != nullptr)
    GTEST_SKIP() << "FLASHSERVE_CUDA_GDN_UNFUSED is set";
  const Feed f{*be};
  std::uint64_t seed = 0x6d05u;
  for (const auto& c : gdn_step_shapes()) {
    SCOPED_TRACE(c.name());
    Rng rng(++seed);
    const auto in = gdn_step_inputs(c, rng);
    expect_same_bits(*be, in->run(f, /*sequence=*/false), in->run(f, /*sequence=*/true));
  }
}

// ---------------------------------------------------------------------------------------------
// The CPU against direct computations.

Weight f32_weight(const Tensor& t) {
  return {DType::kF32, t.shape(), reinterpret_cast<const std::uint8_t*>(t.data()), Device::kHost};
}
Weight f32_vector(const std::vector<float>& v) {
  return {DType::kF32,
          {static_cast<std::int64_t>(v.size())},
          reinterpret_cast<const std::uint8_t*>(v.data()),
          Device::kHost};
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double m = a.size() == b.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

std::vector<std::int32_t> i32_values(const Tensor& t) {
  return {t.data_as<std::int32_t>(), t.data_as<std::int32_t>() + t.numel()};
}

Tensor normal_tensor(Shape shape, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  Tensor t(std::move(shape));
  for (auto& v : t.span()) v = d(rng);
  return t;
}

class CpuOps : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_TRUE(be->status().ok()) << be->status().to_string(); }
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::mt19937 rng{7};
};

// upload_rows: host values become [rows, cols]; values that are not whole rows are refused.
TEST_F(CpuOps, UploadRowsTakesWholeRowsOnly) {
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  Tensor t;
  be->upload_rows(v, 3, t);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_host_vector(), v);
  be->upload_rows(v, 4, t);
  ASSERT_FALSE(be->status().ok());
  EXPECT_NE(be->status().to_string().find("upload_rows"), std::string::npos);
  be->clear_status();
}

TEST_F(CpuOps, LinearF32AndBf16) {
  const auto x = normal_tensor({5, 70}, rng), w = normal_tensor({130, 70}, rng);
  Tensor y;
  be->linear(x, f32_weight(w), y);
  ASSERT_EQ(y.shape(), (Shape{5, 130}));
  for (std::int64_t r = 0; r < 5; ++r)
    for (std::int64_t o = 0; o < 130; ++o) {
      double s = 0;
      for (std::int64_t i = 0; i < 70; ++i) s += static_cast<double>(x.row(r)[i]) * w.row(o)[i];
      EXPECT_NEAR(y.row(r)[o], s, 1e-4);
    }
  // bf16 weights (tiles of 64 rows, 130 is not a multiple) equal f32 weights rounded to bf16.
  std::vector<std::uint16_t> bf(static_cast<std::size_t>(w.numel()));
  Tensor rounded(w.shape());
  for (std::size_t i = 0; i < bf.size(); ++i) {
    bf[i] = f32_to_bf16(w.data()[i]);
    rounded.data()[i] = bf16_to_f32(bf[i]);
  }
  Tensor yb, yr;
  be->linear(x, {DType::kBF16, w.shape(), reinterpret_cast<const std::uint8_t*>(bf.data())}, yb);
  be->linear(x, f32_weight(rounded), yr);
  EXPECT_LE(max_abs_diff(yb.span(), yr.span()), 1e-5);
  // An f32 matrix uploaded as bf16 is exactly that rounding.
  auto up = be->upload(f32_weight(w), DType::kBF16);
  ASSERT_TRUE(up.ok()) << up.status().to_string();
  ASSERT_EQ(up->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(up->data, bf.data(), bf.size() * 2), 0);
  Tensor yu;
  be->linear(x, *up, yu);
  EXPECT_EQ(max_abs_diff(yu.span(), yb.span()), 0.0);
}

TEST_F(CpuOps, UploadKeepsViewsAndConvertsOnlyWhenAsked) {
  const auto m = normal_tensor({4, 8}, rng);
  const std::vector<float> vec = {1.5f, -2.0f, 0.25f};
  std::vector<std::uint16_t> bf_m(32), bf_v(3);
  for (std::size_t i = 0; i < 32; ++i) bf_m[i] = f32_to_bf16(m.data()[i]);
  for (std::size_t i = 0; i < 3; ++i) bf_v[i] = f32_to_bf16(vec[i]);
  const Weight wm = f32_weight(m), wv = f32_vector(vec);
  const Weight bm{DType::kBF16, {4, 8}, reinterpret_cast<const std::uint8_t*>(bf_m.data())};
  const Weight bv{DType::kBF16, {3}, reinterpret_cast<const std::uint8_t*>(bf_v.data())};
  // The view itself: f32 matrix as f32, bf16 matrix as bf16 or f32 (widened per tile), f32 vector.
  for (const auto& [w, as] : std::vector<std::pair<Weight, DType>>{
           {wm, DType::kF32}, {bm, DType::kBF16}, {bm, DType::kF32}, {wv, DType::kBF16}}) {
    auto up = be->upload(w, as);
    ASSERT_TRUE(up.ok()) << up.status().to_string();
    EXPECT_EQ(up->data, w.data);
    EXPECT_EQ(up->dtype, w.dtype);
    EXPECT_EQ(up->shape, w.shape);
  }
  // A bf16 vector is widened into storage the backend owns.
  auto up = be->upload(bv, DType::kBF16);
  ASSERT_TRUE(up.ok());
  EXPECT_NE(up->data, bv.data);
  ASSERT_EQ(up->dtype, DType::kF32);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(up->f32()[i], vec[i]);  // exact in bf16
  // An index table (int32/int64, DeepSeek V4's tid2eid) is kept as stored.
  const auto table = be->upload({DType::kI32, {4, 8}, wm.data}, DType::kF32);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->data, wm.data);
  EXPECT_EQ(table->dtype, DType::kI32);
  // A device weight, another non-float weight and an integer matrix dtype are refused with a
  // reason.
  Weight on_device = wm;
  on_device.device = Device::kCuda;
  EXPECT_FALSE(be->upload(on_device, DType::kF32).ok());
  EXPECT_FALSE(be->upload({DType::kU8, {4, 8}, wm.data}, DType::kF32).ok());
  EXPECT_FALSE(be->upload(wm, DType::kI32).ok());
  // Round to nearest even: 1 + 2^-8 is halfway between two bf16 values and goes to the even 1.
  const std::vector<float> halfway = {1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f, 0.0f, 0.0f};
  const Weight hw{DType::kF32, {2, 2}, reinterpret_cast<const std::uint8_t*>(halfway.data())};
  auto r = be->upload(hw, DType::kBF16);
  ASSERT_TRUE(r.ok());
  const auto* bits = reinterpret_cast<const std::uint16_t*>(r->data);
  EXPECT_EQ(bf16_to_f32(bits[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(bits[1]), 1.0f + 4.0f / 256.0f);
}

TEST_F(CpuOps, RmsNormVariants) {
  const auto x = normal_tensor({3, 8}, rng), gate = normal_tensor({3, 8}, rng);
  const std::vector<float> w = {0.1f, -0.2f, 0.3f, 0.0f, 0.5f, -0.5f, 1.0f, 2.0f};
  Tensor y;
  // (1+w) over the whole row, grouped by 4, and plain w gated by sigmoid per group of 8.
  for (const std::int64_t group : {8, 4}) {
    be->rms_norm(x, f32_vector(w), group, 1e-6f, true, y);
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t g0 = 0; g0 < 8; g0 += group) {
        double ss = 0;
        for (auto c = g0; c < g0 + group; ++c) ss += x.row(r)[c] * x.row(r)[c];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(group) + 1e-6);
        for (auto c = g0; c < g0 + group; ++c)
          EXPECT_NEAR(y.row(r)[c], x.row(r)[c] * inv * (1.0 + w[static_cast<std::size_t>(c)]),
                      1e-5);
      }
  }
  // A per-head weight (one group's worth) is shared by every group.
  const std::vector<float> head_w(w.begin(), w.begin() + 4);
  const std::vector<float> tiled = {0.1f, -0.2f, 0.3f, 0.0f, 0.1f, -0.2f, 0.3f, 0.0f};
  Tensor yh;
  be->rms_norm(x, f32_vector(head_w), 4, 1e-6f, true, yh);
  be->rms_norm(x, f32_vector(tiled), 4, 1e-6f, true, y);
  EXPECT_EQ(max_abs_diff(yh.span(), y.span()), 0.0);
  // In place (x and y the same tensor) equals out of place.
  Tensor xi = x;
  be->rms_norm(xi, f32_vector(tiled), 4, 1e-6f, true, xi);
  EXPECT_EQ(max_abs_diff(xi.span(), y.span()), 0.0);
  be->rms_norm_gated(x, f32_vector(w), gate, 1e-6f, Activation::kSigmoid, y);
  for (std::int64_t r = 0; r < 3; ++r) {
    double ss = 0;
    for (std::int64_t c = 0; c < 8; ++c) ss += x.row(r)[c] * x.row(r)[c];
    const double inv = 1.0 / std::sqrt(ss / 8 + 1e-6);
    for (std::int64_t c = 0; c < 8; ++c)
      EXPECT_NEAR(y.row(r)[c],
                  w[static_cast<std::size_t>(c)] * x.row(r)[c] * inv * sigmoid(gate.row(r)[c]),
                  1e-5);
  }
}

TEST_F(CpuOps, RopeRotatesPairsAndPreservesRelativePositions) {
  const std::int64_t D = 16, R = 8;
  auto q = normal_tensor({1, D}, rng), k = normal_tensor({1, D}, rng);
  auto at = [&](Tensor t, std::int64_t p) {
    be->rope(t, D, R, p, 1, 10000.0);
    return t;
  };
  // Position 0 is the identity; the dims past R pass through.
  EXPECT_EQ(max_abs_diff(at(q, 0).span(), q.span()), 0.0);
  const auto q5 = at(q, 5);
  for (std::int64_t i = R; i < D; ++i) EXPECT_EQ(q5.data()[i], q.data()[i]);
  // Direct rotate-half formula.
  for (std::int64_t i = 0; i < R / 2; ++i) {
    const double f = 5.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / R);
    EXPECT_NEAR(q5.data()[i], q.data()[i] * std::cos(f) - q.data()[i + R / 2] * std::sin(f), 1e-5);
    EXPECT_NEAR(q5.data()[i + R / 2], q.data()[i + R / 2] * std::cos(f) + q.data()[i] * std::sin(f),
                1e-5);
  }
  // q(p) . k(p') depends on p - p' only.
  auto dot = [&](const Tensor& a, const Tensor& b) {
    double s = 0;
    for (std::int64_t i = 0; i < D; ++i) s += a.data()[i] * b.data()[i];
    return s;
  };
  EXPECT_NEAR(dot(at(q, 9), at(k, 4)), dot(at(q, 105), at(k, 100)), 1e-4);
  // Row r sits at first + r * stride: rows 0..2 at 12, 16, 20 equal one row at each position.
  Tensor three({3, D});
  for (std::int64_t r = 0; r < 3; ++r) std::copy_n(q.data(), D, three.row(r));
  be->rope(three, D, R, 12, 4, 10000.0);
  for (std::int64_t r = 0; r < 3; ++r) {
    const auto one = at(q, 12 + 4 * r);
    EXPECT_EQ(max_abs_diff(std::span(three.row(r), D), one.span()), 0.0) << r;
  }
}

TEST_F(CpuOps, CausalConvWithStateEqualsOneCall) {
  const std::int64_t C = 6, K = 4, dil = 3, S = 20, L = (K - 1) * dil;
  const auto x = normal_tensor({S, C}, rng), w = normal_tensor({C, K}, rng);
  Tensor tail({L, C}), y;
  be->causal_conv1d(x, f32_weight(w), dil, tail, y);
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t c = 0; c < C; ++c) {
      double s = 0;
      for (std::int64_t j = 0; j < K; ++j) {
        const auto src = t - (K - 1 - j) * dil;
        if (src >= 0) s += w.row(c)[j] * x.row(src)[c];
      }
      EXPECT_NEAR(y.row(t)[c], s, 1e-5);
    }
  // Fed in pieces of 1, 7, 2 and 10 tokens through the tail: the same outputs and final tail.
  Tensor tail2({L, C}), piece, out;
  std::vector<float> all;
  std::int64_t at = 0;
  for (const std::int64_t n : {1, 7, 2, 10}) {
    be->slice_rows(x, at, n, piece);
    be->causal_conv1d(piece, f32_weight(w), dil, tail2, out);
    all.insert(all.end(), out.span().begin(), out.span().end());
    at += n;
  }
  EXPECT_LE(max_abs_diff(all, y.span()), 1e-6);
  EXPECT_EQ(max_abs_diff(tail2.span(), tail.span()), 0.0);
  EXPECT_EQ(max_abs_diff(tail.span(), std::span(x.row(S - L), x.row(S))), 0.0);
  // A bf16 filter equals its f32 widening exactly.
  std::vector<std::uint16_t> bf(static_cast<std::size_t>(w.numel()));
  Tensor widened(w.shape());
  for (std::size_t i = 0; i < bf.size(); ++i)
    widened.data()[i] = bf16_to_f32(bf[i] = f32_to_bf16(w.data()[i]));
  Tensor t1({L, C}), t2({L, C}), y1, y2;
  be->causal_conv1d(x, {DType::kBF16, w.shape(), reinterpret_cast<const std::uint8_t*>(bf.data())},
                    dil, t1, y1);
  be->causal_conv1d(x, f32_weight(widened), dil, t2, y2);
  EXPECT_EQ(max_abs_diff(y1.span(), y2.span()), 0.0);
}

TEST_F(CpuOps, ChunkedDeltaRuleEqualsRecurrent) {
  const std::int64_t S = 150, Hk = 2, Hv = 4, dk = 8, dv = 6;
  auto q = normal_tensor({S, Hk * dk}, rng), k = normal_tensor({S, Hk * dk}, rng);
  const auto v = normal_tensor({S, Hv * dv}, rng);
  auto g = normal_tensor({S, Hv}, rng), beta = normal_tensor({S, Hv}, rng);
  for (auto& e : g.span()) e = -std::fabs(e) * 0.3f;  // log decay <= 0
  for (auto& e : beta.span()) e = sigmoid(e);
  be->l2_norm(q, dk, 1e-6f);
  be->l2_norm(k, dk, 1e-6f);
  const auto init = normal_tensor({Hv, dk, dv}, rng, 0.1f);
  Tensor s1 = init, s2 = init, o1, o2;
  be->gated_delta_rule_chunked(q, k, v, g, beta, Hk, s1, o1);  // chunks of 64, 64, 22
  be->gated_delta_rule_recurrent(q, k, v, g, beta, Hk, s2, o2);
  EXPECT_LE(max_abs_diff(o1.span(), o2.span()), 1e-4);
  EXPECT_LE(max_abs_diff(s1.span(), s2.span()), 1e-4);
  // The recurrence by hand for the first token of value head 3 (key head 1).
  {
    const auto h = 3, kh = 1;
    const float* S0 = init.data() + h * dk * dv;
    std::vector<double> Sn(S0, S0 + dk * dv);
    const double decay = std::exp(g.row(0)[h]);
    for (auto& e : Sn) e *= decay;
    for (std::int64_t j = 0; j < dv; ++j) {
      double mem = 0;
      for (std::int64_t i = 0; i < dk; ++i)
        mem += Sn[static_cast<std::size_t>(i * dv + j)] * k.row(0)[kh * dk + i];
      const double delta = (v.row(0)[h * dv + j] - mem) * beta.row(0)[h];
      for (std::int64_t i = 0; i < dk; ++i)
        Sn[static_cast<std::size_t>(i * dv + j)] += k.row(0)[kh * dk + i] * delta;
    }
    for (std::int64_t j = 0; j < dv; ++j) {
      double o = 0;
      for (std::int64_t i = 0; i < dk; ++i)
        o += Sn[static_cast<std::size_t>(i * dv + j)] * q.row(0)[kh * dk + i];
      EXPECT_NEAR(o2.row(0)[h * dv + j], o, 1e-5);
    }
  }
  // Chunked in two calls (70 + 80) equals one call.
  Tensor s3 = init, oa, ob;
  auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t n) {
    Tensor r;
    be->slice_rows(t, a, n, r);
    return r;
  };
  be->gated_delta_rule_chunked(rows(q, 0, 70), rows(k, 0, 70), rows(v, 0, 70), rows(g, 0, 70),
                               rows(beta, 0, 70), Hk, s3, oa);
  be->gated_delta_rule_chunked(rows(q, 70, 80), rows(k, 70, 80), rows(v, 70, 80), rows(g, 70, 80),
                               rows(beta, 70, 80), Hk, s3, ob);
  std::vector<float> o3(oa.span().begin(), oa.span().end());
  o3.insert(o3.end(), ob.span().begin(), ob.span().end());
  EXPECT_LE(max_abs_diff(o3, o1.span()), 1e-4);
  EXPECT_LE(max_abs_diff(s3.span(), s1.span()), 1e-4);
}

// Large heads take the chunk form's products on the CPU (small ones the recurrence): it computes
// the same function, in one call or split.
TEST_F(CpuOps, ChunkFormOfLargeHeadsEqualsRecurrent) {
  const std::int64_t S = 150, Hk = 1, Hv = 2, dk = 128, dv = 128;
  auto q = normal_tensor({S, Hk * dk}, rng), k = normal_tensor({S, Hk * dk}, rng);
  const auto v = normal_tensor({S, Hv * dv}, rng);
  auto g = normal_tensor({S, Hv}, rng), beta = normal_tensor({S, Hv}, rng);
  for (auto& e : g.span()) e = -std::fabs(e) * 0.3f;
  for (auto& e : beta.span()) e = sigmoid(e);
  be->l2_norm(q, dk, 1e-6f);
  be->l2_norm(k, dk, 1e-6f);
  be->scale(q, 1.0f / std::sqrt(static_cast<float>(dk)));
  const auto init = normal_tensor({Hv, dk, dv}, rng, 0.1f);
  Tensor s1 = init, s2 = init, o1, o2;
  be->gated_delta_rule_chunked(q, k, v, g, beta, Hk, s1, o1);
  be->gated_delta_rule_recurrent(q, k, v, g, beta, Hk, s2, o2);
  EXPECT_LE(max_abs_diff(o1.span(), o2.span()), 1e-4);
  EXPECT_LE(max_abs_diff(s1.span(), s2.span()), 1e-4);
  Tensor s3 = init, oa, ob, part;
  auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t n) {
    Tensor r;
    be->slice_rows(t, a, n, r);
    return r;
  };
  be->gated_delta_rule_chunked(rows(q, 0, 70), rows(k, 0, 70), rows(v, 0, 70), rows(g, 0, 70),
                               rows(beta, 0, 70), Hk, s3, oa);
  be->gated_delta_rule_chunked(rows(q, 70, 80), rows(k, 70, 80), rows(v, 70, 80), rows(g, 70, 80),
                               rows(beta, 70, 80), Hk, s3, ob);
  std::vector<float> o3(oa.span().begin(), oa.span().end());
  o3.insert(o3.end(), ob.span().begin(), ob.span().end());
  EXPECT_LE(max_abs_diff(o3, o1.span()), 1e-4);
  EXPECT_LE(max_abs_diff(s3.span(), s1.span()), 1e-4);
}

// Kimi Delta Attention's per-channel decay (g [S, Hv*dk]): the recurrence by hand, the chunked
// form (one call and split), and a per-channel decay whose channels are equal is exactly the
// per-head (GDN) form, bit for bit.
TEST_F(CpuOps, PerChannelDecayDeltaRule) {
  const std::int64_t S = 90, Hk = 2, Hv = 2, dk = 8, dv = 6;
  auto q = normal_tensor({S, Hk * dk}, rng), k = normal_tensor({S, Hk * dk}, rng);
  const auto v = normal_tensor({S, Hv * dv}, rng);
  auto g = normal_tensor({S, Hv * dk}, rng), beta = normal_tensor({S, Hv}, rng);
  for (auto& e : g.span()) e = -std::fabs(e) * 0.5f;
  for (auto& e : beta.span()) e = sigmoid(e);
  be->l2_norm(q, dk, 1e-6f);
  be->l2_norm(k, dk, 1e-6f);
  const auto init = normal_tensor({Hv, dk, dv}, rng, 0.1f);
  Tensor s1 = init, s2 = init, o1, o2;
  be->gated_delta_rule_chunked(q, k, v, g, beta, Hk, s1, o1);
  be->gated_delta_rule_recurrent(q, k, v, g, beta, Hk, s2, o2);
  EXPECT_LE(max_abs_diff(o1.span(), o2.span()), 1e-5);
  EXPECT_LE(max_abs_diff(s1.span(), s2.span()), 1e-5);
  // The reference recurrence (M:468-476) in double over the whole sequence, head 1.
  {
    const std::int64_t h = 1;
    const float* S0 = init.data() + h * dk * dv;
    std::vector<double> St(S0, S0 + dk * dv);
    double worst = 0;
    for (std::int64_t t = 0; t < S; ++t) {
      for (std::int64_t i = 0; i < dk; ++i)
        for (std::int64_t j = 0; j < dv; ++j)
          St[static_cast<std::size_t>(i * dv + j)] *= std::exp(g.row(t)[h * dk + i]);
      for (std::int64_t j = 0; j < dv; ++j) {
        double mem = 0;
        for (std::int64_t i = 0; i < dk; ++i)
          mem += St[static_cast<std::size_t>(i * dv + j)] * k.row(t)[h * dk + i];
        const double delta = (v.row(t)[h * dv + j] - mem) * beta.row(t)[h];
        for (std::int64_t i = 0; i < dk; ++i)
          St[static_cast<std::size_t>(i * dv + j)] += k.row(t)[h * dk + i] * delta;
      }
      for (std::int64_t j = 0; j < dv; ++j) {
        double o = 0;
        for (std::int64_t i = 0; i < dk; ++i)
          o += St[static_cast<std::size_t>(i * dv + j)] * q.row(t)[h * dk + i];
        worst = std::max(worst, std::fabs(o2.row(t)[h * dv + j] - o));
      }
    }
    EXPECT_LE(worst, 1e-5);
  }
  // Split calls (37 + 53) carry the state.
  Tensor s3 = init, oa, ob;
  auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t n) {
    Tensor r;
    be->slice_rows(t, a, n, r);
    return r;
  };
  be->gated_delta_rule_chunked(rows(q, 0, 37), rows(k, 0, 37), rows(v, 0, 37), rows(g, 0, 37),
                               rows(beta, 0, 37), Hk, s3, oa);
  be->gated_delta_rule_recurrent(rows(q, 37, 53), rows(k, 37, 53), rows(v, 37, 53), rows(g, 37, 53),
                                 rows(beta, 37, 53), Hk, s3, ob);
  std::vector<float> o3(oa.span().begin(), oa.span().end());
  o3.insert(o3.end(), ob.span().begin(), ob.span().end());
  EXPECT_LE(max_abs_diff(o3, o1.span()), 1e-5);
  EXPECT_LE(max_abs_diff(s3.span(), s1.span()), 1e-5);
  // Equal channels: the per-head form's numbers exactly.
  Tensor gh({S, Hv}), gc({S, Hv * dk});
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t h = 0; h < Hv; ++h) {
      gh.row(t)[h] = g.row(t)[h * dk];
      for (std::int64_t i = 0; i < dk; ++i) gc.row(t)[h * dk + i] = gh.row(t)[h];
    }
  Tensor s4 = init, s5 = init, o4, o5;
  be->gated_delta_rule_recurrent(q, k, v, gh, beta, Hk, s4, o4);
  be->gated_delta_rule_recurrent(q, k, v, gc, beta, Hk, s5, o5);
  EXPECT_EQ(max_abs_diff(o4.span(), o5.span()), 0.0);
  EXPECT_EQ(max_abs_diff(s4.span(), s5.span()), 0.0);
}

// KDA's chunk form (heads above the recurrence's size on the CPU: dk = dv = 128, GLM 5.3's, and
// an odd 72 x 80) against the recurrence: lengths around the chunk of 64, GQA 1 and 2, and a
// strong decay (GLM's bound, g in (-5, 0): the cumulative log decay reaches -300 in a chunk, so
// any exp(-G) would overflow) and a weak one, with some channels not decaying at all. fp32 in
// both: within 2e-5 of the recurrence (outputs of unit size, state 0.1), and finite.
TEST_F(CpuOps, PerChannelChunkFormEqualsRecurrent) {
  auto rows = [&](const Tensor& t, std::int64_t a, std::int64_t n) {
    Tensor r;
    be->slice_rows(t, a, n, r);
    return r;
  };
  auto finite = [](const Tensor& t) {
    return std::all_of(t.span().begin(), t.span().end(), [](float e) { return std::isfinite(e); });
  };
  for (const auto& [dk, dv] : {std::pair<std::int64_t, std::int64_t>{128, 128}, {72, 80}})
    for (const std::int64_t rep : {1, 2})
      for (const bool strong : {true, false})
        for (const std::int64_t S : {1, 63, 64, 65, 200}) {
          if (dk != 128 && (rep != 2 || S < 64)) continue;  // the odd shape: a few cases
          SCOPED_TRACE("dk " + std::to_string(dk) + " rep " + std::to_string(rep) +
                       (strong ? " strong" : " weak") + " S " + std::to_string(S));
          const std::int64_t Hv = 2, Hk = Hv / rep;
          auto q = normal_tensor({S, Hk * dk}, rng), k = normal_tensor({S, Hk * dk}, rng);
          const auto v = normal_tensor({S, Hv * dv}, rng);
          auto g = normal_tensor({S, Hv * dk}, rng), beta = normal_tensor({S, Hv}, rng);
          for (std::int64_t i = 0; i < g.numel(); ++i) {
            float& e = g.data()[i];
            e = strong ? -5.0f * sigmoid(2.0f * e) : -0.02f * std::fabs(e);
            if (i % dk == 3) e = 0.0f;  // a channel that keeps its memory
          }
          for (auto& e : beta.span()) e = sigmoid(e);
          be->l2_norm(q, dk, 1e-6f);
          be->l2_norm(k, dk, 1e-6f);
          be->scale(q, 1.0f / std::sqrt(static_cast<float>(dk)));
          const auto init = normal_tensor({Hv, dk, dv}, rng, 0.1f);
          Tensor s1 = init, s2 = init, o1, o2;
          be->gated_delta_rule_chunked(q, k, v, g, beta, Hk, s1, o1);
          be->gated_delta_rule_recurrent(q, k, v, g, beta, Hk, s2, o2);
          EXPECT_TRUE(finite(o1) && finite(s1));
          EXPECT_LE(max_abs_diff(o1.span(), o2.span()), 2e-5);
          EXPECT_LE(max_abs_diff(s1.span(), s2.span()), 2e-5);
          if (S < 65) continue;
          // Split at 40 (chunks counted from each call's first token): the same function.
          Tensor s3 = init, oa, ob;
          be->gated_delta_rule_chunked(rows(q, 0, 40), rows(k, 0, 40), rows(v, 0, 40),
                                       rows(g, 0, 40), rows(beta, 0, 40), Hk, s3, oa);
          be->gated_delta_rule_chunked(rows(q, 40, S - 40), rows(k, 40, S - 40),
                                       rows(v, 40, S - 40), rows(g, 40, S - 40),
                                       rows(beta, 40, S - 40), Hk, s3, ob);
          std::vector<float> o3(oa.span().begin(), oa.span().end());
          o3.insert(o3.end(), ob.span().begin(), ob.span().end());
          EXPECT_LE(max_abs_diff(o3, o2.span()), 2e-5);
          EXPECT_LE(max_abs_diff(s3.span(), s2.span()), 2e-5);
        }
}

// LayerNorm and the k-pool compression (GLM 5.3's DSA indexer) against direct computations.
TEST_F(CpuOps, LayerNormAndKpoolCompressEqualDirect) {
  const std::int64_t rows = 6, dim = 5, pool = 3;
  const auto x = normal_tensor({rows, dim}, rng, 2.0f);
  std::vector<float> w(dim), b(dim), ape(pool * dim);
  for (auto& e : w) e = std::normal_distribution<float>(1.0f, 0.3f)(rng);
  for (auto& e : b) e = std::normal_distribution<float>(0.0f, 0.3f)(rng);
  for (auto& e : ape) e = std::normal_distribution<float>(0.0f, 1.0f)(rng);
  Tensor y;
  be->layer_norm(x, f32_vector(w), f32_vector(b), 1e-6f, y);
  for (std::int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (std::int64_t c = 0; c < dim; ++c) mean += x.row(r)[c] / static_cast<double>(dim);
    for (std::int64_t c = 0; c < dim; ++c)
      var += (x.row(r)[c] - mean) * (x.row(r)[c] - mean) / static_cast<double>(dim);
    for (std::int64_t c = 0; c < dim; ++c)
      EXPECT_NEAR(y.row(r)[c], (x.row(r)[c] - mean) / std::sqrt(var + 1e-6) * w[c] + b[c], 1e-5);
  }
  // Pools 0 and 1 of the rows from 0 (rows 0-2, 3-5); the gate softmax is per channel.
  const auto gate = normal_tensor({rows, dim}, rng, 2.0f);
  Tensor pooled;
  be->kpool_compress(x, gate, f32_vector(ape), pool, 0, 2, pooled);
  ASSERT_EQ(pooled.shape(), (Shape{2, dim}));
  for (std::int64_t p = 0; p < 2; ++p)
    for (std::int64_t c = 0; c < dim; ++c) {
      double z = 0, acc = 0;
      for (std::int64_t j = 0; j < pool; ++j)
        z += std::exp(gate.row(p * pool + j)[c] + ape[j * dim + c]);
      for (std::int64_t j = 0; j < pool; ++j)
        acc += std::exp(gate.row(p * pool + j)[c] + ape[j * dim + c]) / z * x.row(p * pool + j)[c];
      EXPECT_NEAR(pooled.row(p)[c], acc, 1e-5);
    }
  // From row 3: the second pool alone.
  Tensor second;
  be->kpool_compress(x, gate, f32_vector(ape), pool, 3, 1, second);
  EXPECT_EQ(max_abs_diff(second.span(), std::span<const float>(pooled.row(1), dim)), 0.0);
}

// OpenBLAS 0.3.21 does not know every CPU and then falls back to SSE3 kernels; the backend
// re-selects kernels of the instruction set the CPU has (cpu_blas.cpp).
TEST_F(CpuOps, BlasRunsKernelsOfTheCpusInstructionSet) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) GTEST_SKIP() << "OPENBLAS_CORETYPE is set";
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "no AVX2+FMA on this CPU";
  const std::string kernels = cpu_blas_kernels();
  const std::vector<std::string> vector_cores = {"Haswell", "Zen", "SkylakeX", "Cooperlake",
                                                 "SapphireRapids"};
  EXPECT_NE(std::find(vector_cores.begin(), vector_cores.end(), kernels), vector_cores.end())
      << "OpenBLAS runs its " << kernels << " kernels on a CPU with AVX2+FMA";
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

// Query s (at first + s) reads the picked blocks' keys in the order given, then its tail.
TEST_F(CpuOps, BlockSparseAttentionEqualsNaiveSoftmax) {
  const std::int64_t Hq = 4, Hkv = 2, D = 8, block = 4, T = 14, S = 2, first = 12;
  const auto q = normal_tensor({S, Hq * D}, rng), k = normal_tensor({T, Hkv * D}, rng),
             v = normal_tensor({T, Hkv * D}, rng);
  // Query 0 (position 12) sees blocks 0..2 and tail {12}; query 1 (13) the same and {12, 13}.
  const auto picked = i32_tensor({S, 3}, {2, -1, 0, 1, 2, -1});
  const std::vector<std::vector<std::int32_t>> keys = {{8, 9, 10, 11, 0, 1, 2, 3, 12},
                                                       {4, 5, 6, 7, 8, 9, 10, 11, 12, 13}};
  Tensor out;
  be->block_sparse_attention(q, k, v, Hq, Hkv, picked, block, first, 0.5f, out);
  ASSERT_EQ(out.shape(), q.shape());
  for (std::int64_t s = 0; s < S; ++s) {
    const auto& ks = keys[static_cast<std::size_t>(s)];
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto kvh = h / 2;
      std::vector<double> p;
      for (const auto t : ks) {
        double d = 0;
        for (std::int64_t x = 0; x < D; ++x) d += q.row(s)[h * D + x] * k.row(t)[kvh * D + x];
        p.push_back(std::exp(0.5 * d));
      }
      const double z = std::accumulate(p.begin(), p.end(), 0.0);
      for (std::int64_t x = 0; x < D; ++x) {
        double o = 0;
        for (std::size_t i = 0; i < ks.size(); ++i) o += p[i] / z * v.row(ks[i])[kvh * D + x];
        EXPECT_NEAR(out.row(s)[h * D + x], o, 1e-5);
      }
    }
  }
  // Before the first complete block there is only the tail: position 2 reads keys 0..2.
  Tensor o1;
  Tensor q0;
  be->slice_rows(q, 0, 1, q0);
  be->block_sparse_attention(q0, k, v, Hq, Hkv, i32_tensor({1, 1}, {-1}), block, 2, 0.5f, o1);
  for (std::int64_t x = 0; x < D; ++x) {
    std::vector<double> p;
    for (std::int64_t t = 0; t < 3; ++t) {
      double d = 0;
      for (std::int64_t y = 0; y < D; ++y) d += q.row(0)[y] * k.row(t)[y];
      p.push_back(std::exp(0.5 * d));
    }
    const double z = std::accumulate(p.begin(), p.end(), 0.0);
    double o = 0;
    for (std::int64_t t = 0; t < 3; ++t) o += p[static_cast<std::size_t>(t)] / z * v.row(t)[x];
    EXPECT_NEAR(o1.row(0)[x], o, 1e-5);
  }
}

// The backend's greedy pick is the sampler's: the first (lowest id) of equal maxima; NaN skipped.
TEST_F(CpuOps, ArgmaxRowsIsTheSamplersArgmax) {
  const float nan = std::nanf("");
  const Tensor x({4, 5}, {0.1f,  0.9f,  0.5f,  0.9f,  0.3f,     // tie: 1
                          -1.0f, -1.0f, -1.0f, -1.0f, -1.0f,    // all equal: 0
                          nan,   2.0f,  nan,   7.0f,  7.0f,     // NaN skipped: 3
                          -5.0f, -4.0f, -3.0f, -2.0f, -1.0f});  // last: 4
  Tensor ids;
  be->argmax_rows(x, ids);
  ASSERT_TRUE(be->status().ok());
  ASSERT_EQ(ids.dtype(), DType::kI32);
  ASSERT_EQ(ids.shape(), (Shape{4, 1}));
  EXPECT_EQ(i32_values(ids), (std::vector<std::int32_t>{1, 0, 3, 4}));
  Rng rng(7);
  const auto r = random_tensor({6, 333}, rng);
  be->argmax_rows(r, ids);
  const auto got = i32_values(ids);
  for (std::int64_t row = 0; row < 6; ++row) {
    const float* p = r.row(row);
    EXPECT_EQ(got[static_cast<std::size_t>(row)], std::max_element(p, p + 333) - p);
  }
}

TEST_F(CpuOps, TopkOrderTiesAndPadding) {
  const Tensor x({2, 5}, {0.1f, 0.9f, 0.5f, 0.9f, 0.3f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f});
  Tensor idx, val;
  be->topk(x, 3, idx, val);
  ASSERT_EQ(idx.dtype(), DType::kI32);
  ASSERT_EQ(idx.shape(), (Shape{2, 3}));
  EXPECT_EQ(i32_values(idx), (std::vector<std::int32_t>{1, 3, 2, 4, 3, 2}));  // ties: lower first
  EXPECT_EQ(val.to_host_vector(), (std::vector<float>{0.9f, 0.9f, 0.5f, 5, 4, 3}));
  // k past the row width pads with -1 and 0 (into a reused, dirty output).
  be->topk(Tensor({1, 2}, {3.0f, 7.0f}), 4, idx, val);
  EXPECT_EQ(i32_values(idx), (std::vector<std::int32_t>{1, 0, -1, -1}));
  EXPECT_EQ(val.to_host_vector(), (std::vector<float>{7, 3, 0, 0}));
}

// Long rows with many ties and a rising trend (the QSA scores favour recent blocks), against a
// stable sort: the one-pass selection must give the same picks, ties to the lower index.
TEST_F(CpuOps, TopkAndSelectBlocksEqualAStableSort) {
  std::uniform_int_distribution<int> level(0, 6);
  for (const std::int64_t n : {1, 15, 16, 17, 63, 64, 65, 200, 1000}) {
    Tensor x({3, n});
    for (std::int64_t r = 0; r < 3; ++r)
      for (std::int64_t c = 0; c < n; ++c)
        x.row(r)[c] = static_cast<float>(level(rng)) + (r == 1   ? 0.01f * static_cast<float>(c)
                                                        : r == 2 ? -0.01f * static_cast<float>(c)
                                                                 : 0.0f);
    for (const std::int64_t k : {1, 5, 16, 40}) {
      Tensor idx, val;
      be->topk(x, k, idx, val);
      const auto got = i32_values(idx);
      for (std::int64_t r = 0; r < 3; ++r) {
        std::vector<std::int32_t> order(static_cast<std::size_t>(n));
        std::iota(order.begin(), order.end(), 0);
        const float* p = x.row(r);
        std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[a] > p[b]; });
        for (std::int64_t j = 0; j < k; ++j) {
          const auto want = j < n ? order[static_cast<std::size_t>(j)] : -1;
          EXPECT_EQ(got[static_cast<std::size_t>(r * k + j)], want)
              << "n " << n << " k " << k << " row " << r << " pick " << j;
        }
      }
    }
    // select_blocks on the same rows: the query at position first + s sees (first+s+1)/4.
    Tensor picked;
    be->select_blocks(x, 4 * n - 3, 4, 16, picked);
    const auto got = i32_values(picked);
    for (std::int64_t r = 0; r < 3; ++r) {
      const auto visible = std::min(n, (4 * n - 3 + r + 1) / 4);
      std::vector<std::int32_t> order(static_cast<std::size_t>(visible));
      std::iota(order.begin(), order.end(), 0);
      const float* p = x.row(r);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[a] > p[b]; });
      for (std::int64_t j = 0; j < 16; ++j)
        EXPECT_EQ(got[static_cast<std::size_t>(r * 16 + j)],
                  j < visible ? order[static_cast<std::size_t>(j)] : -1);
    }
  }
}

// The indexer scores against a direct computation, at sizes that leave partial query groups and
// block tiles: out[s, b] = scale * sum_h relu(q[s, h] . keys[b]).
TEST_F(CpuOps, IndexScoresEqualDirect) {
  for (const auto& [S, B, heads, dim] : std::vector<std::tuple<int, int, int, int>>{
           {1, 1, 1, 4}, {7, 130, 3, 20}, {9, 64, 16, 32}, {4, 200, 2, 128}}) {
    const auto q = normal_tensor({S, heads * dim}, rng), keys = normal_tensor({B, dim}, rng);
    Tensor out;
    be->index_scores(q, keys, heads, 0.25f, out);
    ASSERT_EQ(out.shape(), (Shape{S, B}));
    double worst = 0;
    for (int s = 0; s < S; ++s)
      for (int b = 0; b < B; ++b) {
        double total = 0;
        for (int h = 0; h < heads; ++h) {
          double d = 0;
          for (int c = 0; c < dim; ++c)
            d += static_cast<double>(q.row(s)[h * dim + c]) * keys.row(b)[c];
          total += d > 0 ? d : 0;
        }
        worst = std::max(worst, std::fabs(out.row(s)[b] - 0.25 * total));
      }
    EXPECT_LE(worst, 1e-4) << S << "x" << B << " heads " << heads << " dim " << dim;
  }
}

// The fused stream mix equals the sequence it fuses (the base backend's body), for bf16 and f32
// up weights and a width that is not a multiple of the kernel's 64 columns.
// qsa_projections' default body (what the CPU runs) is the sequence the QSA layer ran before it:
// the indexer's product, then q, k, v, each followed by its bias, bit for bit.
TEST_F(CpuOps, QsaProjectionsEqualTheSequence) {
  std::uint64_t seed = 0x95a0u;
  for (const auto& c : qsa_projection_shapes()) {
    if (c.in > 256) continue;  // the small widths; the released ones run in the op suite
    SCOPED_TRACE(c.name());
    Rng r(++seed);
    const auto in = qsa_projection_inputs(c, r);
    const Feed f{*be};
    const auto got = in->run(f, /*sequence=*/false);
    const Weight wq = f.w(*in->q), wk = f.w(*in->k), wv = f.w(*in->v), wi = f.w(*in->index);
    Tensor q, k, v, index;
    be->linear(in->x, wi, index);
    be->linear(in->x, wq, q);
    be->linear(in->x, wk, k);
    be->linear(in->x, wv, v);
    if (c.bias) {
      be->add_bias(q, f.w(*in->q_bias));
      be->add_bias(k, f.w(*in->k_bias));
      be->add_bias(v, f.w(*in->v_bias));
    }
    const std::vector<Tensor> want{q, k, v, index};
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t o = 0; o < got.size(); ++o) {
      SCOPED_TRACE("output " + std::to_string(o));
      ASSERT_EQ(got[o].shape(), want[o].shape());
      EXPECT_EQ(std::memcmp(got[o].raw(), want[o].raw(), want[o].bytes()), 0);
    }
  }
}

// head_norm_rope's default body (what the CPU runs) is the four ops the QSA layer ran before it:
// rms_norm of each (unit offset), then rope of each, bit for bit.
TEST_F(CpuOps, HeadNormRopeEqualsTheSequence) {
  std::uint64_t seed = 0x40e3u;
  for (const auto& c : head_norm_rope_shapes()) {
    SCOPED_TRACE(c.name());
    Rng r(++seed);
    const auto in = head_norm_rope_inputs(c, r);
    const Feed f{*be};
    const auto got = in->run(f, /*sequence=*/false);
    Tensor a = in->a, b = in->b;
    const float eps = HeadNormRopeInputs::kEps;
    const double theta = HeadNormRopeInputs::kTheta;
    be->rms_norm(a, f.w(*in->wa), c.D, eps, true, a);
    if (c.heads_b > 0) be->rms_norm(b, f.w(*in->wb), c.D, eps, true, b);
    be->rope(a, c.D, c.rotary, c.first, 1, theta);
    if (c.heads_b > 0) be->rope(b, c.D, c.rotary, c.first, 1, theta);
    const auto want = c.heads_b > 0 ? std::vector<Tensor>{a, b} : std::vector<Tensor>{a};
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t o = 0; o < got.size(); ++o) {
      SCOPED_TRACE("output " + std::to_string(o));
      ASSERT_EQ(got[o].shape(), want[o].shape());
      EXPECT_EQ(std::memcmp(got[o].raw(), want[o].raw(), want[o].bytes()), 0);
    }
  }
}

TEST_F(CpuOps, StreamMixEqualsTheUnfusedSequence) {
  for (const auto& [S, W, dtype] : std::vector<std::tuple<int, int, DType>>{
           {5, 256, DType::kBF16}, {3, 40, DType::kF32}, {1, 7, DType::kF32}}) {
    const std::int64_t streams = 4, rank = 16;
    const auto xn = normal_tensor({S, streams * W}, rng), u = normal_tensor({S, rank}, rng);
    const auto upf = normal_tensor({streams * W, rank}, rng, 0.25f);
    std::vector<std::uint16_t> bf(static_cast<std::size_t>(upf.numel()));
    Tensor widened(upf.shape());
    for (std::size_t i = 0; i < bf.size(); ++i)
      widened.data()[i] = bf16_to_f32(bf[i] = f32_to_bf16(upf.data()[i]));
    const Weight up =
        dtype == DType::kBF16
            ? Weight{DType::kBF16, upf.shape(), reinterpret_cast<const std::uint8_t*>(bf.data())}
            : f32_weight(upf);
    Tensor fused, m, unfused;
    be->stream_mix(xn, u, up, streams, fused);
    be->linear(u, up, m);
    be->activate(m, Activation::kSigmoid);
    be->mul(m, xn);
    be->stream_mean(m, streams, unfused);
    ASSERT_EQ(fused.shape(), (Shape{S, W}));
    EXPECT_LE(max_abs_diff(fused.span(), unfused.span()), 1e-5) << S << "x" << W;
  }
}

// The fused decode ops' default bodies (what the CPU and any backend without its own run) are the
// op sequences the model ran before they existed: bit for bit.
TEST_F(CpuOps, FusedDecodeOpsEqualTheirSequences) {
  auto bits_equal = [](const Tensor& a, const Tensor& b) {
    return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
  };
  const std::int64_t S = 3, W = 24, streams = 4, in = streams * W, rank = 8;
  const float inv = 1.0f / static_cast<float>(streams);
  {
    const auto h = normal_tensor({S, in}, rng), nw = normal_tensor({in}, rng, 0.3f);
    const auto down = normal_tensor({rank, in}, rng, 0.2f), up = normal_tensor({in, rank}, rng);
    const auto inj = normal_tensor({streams, in}, rng, 0.2f);
    Tensor mixed, inject, xn, u, m, injr;
    be->hyper_connection_read(h, f32_weight(nw), f32_weight(down), f32_weight(up), f32_weight(inj),
                              streams, W, 1e-6f, mixed, &inject);
    be->rms_norm(h, f32_weight(nw), W, 1e-6f, true, xn);
    be->linear(xn, f32_weight(down), u);
    be->scale(u, inv);
    be->activate(u, Activation::kSilu);
    be->stream_mix(xn, u, f32_weight(up), streams, m);
    be->linear(xn, f32_weight(inj), injr);
    be->scale(injr, inv);
    be->activate(injr, Activation::kSigmoid);
    be->scale(injr, 2.0f);
    EXPECT_TRUE(bits_equal(mixed, m));
    EXPECT_TRUE(bits_equal(inject, injr));
  }
  {
    const std::int64_t H = 32, key_dim = 16, value_dim = 24, heads = 3, dk = 8;
    const auto x = normal_tensor({S, H}, rng);
    const auto wqkv = normal_tensor({2 * key_dim + value_dim, H}, rng, 0.2f),
               wz = normal_tensor({value_dim, H}, rng, 0.2f),
               wb = normal_tensor({heads, H}, rng, 0.2f), wa = normal_tensor({heads, H}, rng, 0.2f);
    const auto dtb = normal_tensor({heads}, rng), decay = normal_tensor({heads}, rng);
    Tensor qkv, z, beta, g, qkv2, z2, beta2, g2;
    be->gated_delta_net_in_proj(x, f32_weight(wqkv), f32_weight(wz), f32_weight(wb), f32_weight(wa),
                                f32_weight(dtb), f32_weight(decay), qkv, z, beta, g);
    be->linear(x, f32_weight(wqkv), qkv2);
    be->linear(x, f32_weight(wz), z2);
    be->linear(x, f32_weight(wb), beta2);
    be->linear(x, f32_weight(wa), g2);
    be->activate(beta2, Activation::kSigmoid);
    be->add_bias(g2, f32_weight(dtb));
    be->activate(g2, Activation::kSoftplus);
    be->mul_cols(g2, f32_weight(decay));
    for (const auto& [a, b] : {std::pair{&qkv, &qkv2}, {&z, &z2}, {&beta, &beta2}, {&g, &g2}})
      EXPECT_TRUE(bits_equal(*a, *b));

    const auto conv = normal_tensor({qkv.cols(), 4}, rng, 0.5f);
    Tensor tail = normal_tensor({3, qkv.cols()}, rng), tail2 = tail.to(host_memory());
    Tensor q, k, v, mixed, q2, k2, v2;
    be->gated_delta_net_conv(qkv, f32_weight(conv), tail, key_dim, dk, q, k, v);
    be->causal_conv1d(qkv, f32_weight(conv), 1, tail2, mixed);
    be->activate(mixed, Activation::kSilu);
    be->slice_cols(mixed, 0, key_dim, q2);
    be->slice_cols(mixed, key_dim, key_dim, k2);
    be->slice_cols(mixed, 2 * key_dim, value_dim, v2);
    be->l2_norm(q2, dk, 1e-6f);
    be->l2_norm(k2, dk, 1e-6f);
    be->scale(q2, 1.0f / std::sqrt(static_cast<float>(dk)));
    for (const auto& [a, b] : {std::pair{&q, &q2}, {&k, &k2}, {&v, &v2}, {&tail, &tail2}})
      EXPECT_TRUE(bits_equal(*a, *b));
  }
  {
    // The decode step's two ops against the verify's sequence (CudaGdnStep for the GPU's kernels).
    const GdnStepShape c{40, 2, 4, 8, 6, DType::kF32, false, DType::kF32};
    Rng step_rng(0x6d06u);
    const auto in = gdn_step_inputs(c, step_rng);
    const Feed f{*be};
    const auto fused = in->run(f, false), sequence = in->run(f, true);
    ASSERT_EQ(fused.size(), sequence.size());
    for (std::size_t o = 0; o < fused.size(); ++o)
      EXPECT_TRUE(bits_equal(fused[o], sequence[o])) << "output " << o;
  }
  {
    const std::int64_t H = 32, E = 16, top = 4, I = 12;
    const auto x = normal_tensor({S, H}, rng), router = normal_tensor({E, H}, rng);
    Tensor experts, weights, probs, experts2, weights2;
    be->route_experts(x, f32_weight(router), top, true, experts, weights);
    be->linear(x, f32_weight(router), probs);
    be->softmax(probs);
    be->topk(probs, top, experts2, weights2);
    be->normalize_rows(weights2);
    EXPECT_TRUE(bits_equal(experts, experts2));
    EXPECT_TRUE(bits_equal(weights, weights2));

    const auto gate = normal_tensor({I, H}, rng, 0.3f), up = normal_tensor({I, H}, rng, 0.3f),
               down = normal_tensor({H, I}, rng, 0.3f), eg = normal_tensor({1, H}, rng, 0.3f);
    Tensor y = normal_tensor({S, H}, rng), y2 = y.to(host_memory());
    Tensor g, u, act, shared, scalar;
    be->shared_expert(x, f32_weight(gate), f32_weight(up), f32_weight(down), f32_weight(eg), y);
    be->linear(x, f32_weight(gate), g);
    be->linear(x, f32_weight(up), u);
    be->swiglu(g, u, act);
    be->linear(act, f32_weight(down), shared);
    be->linear(x, f32_weight(eg), scalar);
    be->activate(scalar, Activation::kSigmoid);
    be->mul_rows(shared, scalar);
    be->add(y2, shared);
    EXPECT_TRUE(bits_equal(y, y2));

    // The whole MoE block: the routing, the routed experts over y, the shared expert added.
    const std::int64_t E2 = 6, I2 = 10;
    const auto gate_up = normal_tensor({E2, 2 * I2, H}, rng, 0.3f),
               down2 = normal_tensor({E2, H, I2}, rng, 0.3f), router2 = normal_tensor({E2, H}, rng);
    for (const bool norm : {true, false}) {
      Tensor e1, w1, y1, e2, w2, y3;
      be->moe_block(x, f32_weight(router2), 3, norm, f32_weight(gate_up), f32_weight(down2),
                    f32_weight(gate), f32_weight(up), f32_weight(down), f32_weight(eg), e1, w1, y1);
      be->route_experts(x, f32_weight(router2), 3, norm, e2, w2);
      be->moe_experts(x, f32_weight(gate_up), f32_weight(down2), e2, w2, 0, y3);
      be->shared_expert(x, f32_weight(gate), f32_weight(up), f32_weight(down), f32_weight(eg), y3);
      EXPECT_TRUE(bits_equal(e1, e2)) << norm;
      EXPECT_TRUE(bits_equal(w1, w2)) << norm;
      EXPECT_TRUE(bits_equal(y1, y3)) << norm;
    }
  }
}

// The vectorised expf behind sigmoid, silu and the delta rule's decays, against the correctly
// rounded exp (double, rounded once) on a dense grid over [-103, 88.72]: at most 1 ulp apart.
TEST_F(CpuOps, VectorExpIsWithinOneUlp) {
  const std::int64_t N = 1 << 20;
  std::vector<float> x(static_cast<std::size_t>(N)), y(x.size());
  for (std::int64_t i = 0; i < N; ++i)
    x[static_cast<std::size_t>(i)] =
        -(-103.0f + (88.72f + 103.0f) * static_cast<float>(i) / static_cast<float>(N));
  cpu::exp_diff(0.0f, x.data(), y.data(), N);  // exp(0 - x)
  auto order = [](float f) {
    std::int32_t b;
    std::memcpy(&b, &f, sizeof b);
    return b < 0 ? -static_cast<std::int64_t>(b & 0x7fffffff) : static_cast<std::int64_t>(b);
  };
  std::int64_t worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const auto want = static_cast<float>(std::exp(-static_cast<double>(x[i])));
    worst = std::max(worst, std::abs(order(y[i]) - order(want)));
  }
  EXPECT_LE(worst, 1);
}

TEST_F(CpuOps, NormalizeRowsDividesBySum) {
  Tensor x({2, 3}, {1, 2, 5, 0.5f, 0.25f, 0.25f});
  be->normalize_rows(x);
  EXPECT_EQ(x.to_host_vector(), (std::vector<float>{0.125f, 0.25f, 0.625f, 0.5f, 0.25f, 0.25f}));
}

TEST_F(CpuOps, SelectBlocksKeepsTopVisibleBlocks) {
  // Query at position 13 sees 14 tokens: complete blocks 0..2 (the tail 12, 13 is implied).
  const Tensor scores({1, 4}, {0.5f, 0.1f, 0.7f, 9.0f});  // block 3 is not visible yet
  Tensor picked;
  be->select_blocks(scores, 13, 4, 2, picked);
  ASSERT_EQ(picked.dtype(), DType::kI32);
  EXPECT_EQ(i32_values(picked), (std::vector<std::int32_t>{2, 0}));
  // A budget of every block picks all visible ones, then -1.
  be->select_blocks(scores, 13, 4, 5, picked);
  EXPECT_EQ(i32_values(picked), (std::vector<std::int32_t>{2, 0, 1, -1, -1}));
  // Per row visibility: rows at positions 2, 3, 4 .. 7 see 0, 1, 1, 1, 1, 2 blocks; ties go to
  // the lower index.
  const Tensor tied({6, 2}, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  be->select_blocks(tied, 2, 4, 2, picked);
  EXPECT_EQ(i32_values(picked),
            (std::vector<std::int32_t>{-1, -1, 0, -1, 0, -1, 0, -1, 0, -1, 0, 1}));
  // With every block picked it is dense causal attention: the keys 0..13, once each.
  const auto q = normal_tensor({1, 8}, rng), k = normal_tensor({14, 8}, rng),
             v = normal_tensor({14, 8}, rng);
  be->select_blocks(scores, 13, 4, 8, picked);
  Tensor sparse, dense;
  be->block_sparse_attention(q, k, v, 1, 1, picked, 4, 13, 0.3f, sparse);
  be->block_sparse_attention(q, k, v, 1, 1, i32_tensor({1, 3}, {0, 1, 2}), 4, 13, 0.3f, dense);
  EXPECT_LE(max_abs_diff(sparse.span(), dense.span()), 1e-6);
}

// moe_experts against a direct computation, and bit for bit against the per-expert loop the
// model ran before (gather, gate_up, swiglu_packed, down, weighted scatter-add, experts in
// increasing id).
TEST_F(CpuOps, MoeExpertsEqualsDirectAndThePerExpertLoop) {
  const std::int64_t H = 6, E = 4, I = 3, S = 5, k = 2;
  const auto x = normal_tensor({S, H}, rng);
  const auto gate_up = normal_tensor({E, 2 * I, H}, rng), down = normal_tensor({E, H, I}, rng);
  const auto experts = i32_tensor({S, k}, {2, 0, 1, 2, 3, 1, 0, 2, 2, 3});
  const Tensor weights({S, k}, {0.7f, 0.3f, 0.5f, 0.5f, 0.9f, 0.1f, 0.2f, 0.8f, 0.6f, 0.4f});
  Tensor y = normal_tensor({S, H}, rng);  // overwritten, not accumulated into
  be->moe_experts(x, f32_weight(gate_up), f32_weight(down), experts, weights, 0, y);
  ASSERT_EQ(y.shape(), (Shape{S, H}));
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  const auto* ids = experts.data_as<std::int32_t>();
  for (std::int64_t s = 0; s < S; ++s) {
    std::vector<double> expect(static_cast<std::size_t>(H), 0.0);
    for (std::int64_t j = 0; j < k; ++j) {
      const auto e = ids[s * k + j];
      std::vector<double> act(static_cast<std::size_t>(I));
      for (std::int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (std::int64_t c = 0; c < H; ++c) {
          g += gate_up.data()[(e * 2 * I + i) * H + c] * x.row(s)[c];
          u += gate_up.data()[(e * 2 * I + I + i) * H + c] * x.row(s)[c];
        }
        act[static_cast<std::size_t>(i)] = silu(g) * u;
      }
      for (std::int64_t c = 0; c < H; ++c) {
        double o = 0;
        for (std::int64_t i = 0; i < I; ++i)
          o += down.data()[(e * H + c) * I + i] * act[static_cast<std::size_t>(i)];
        expect[static_cast<std::size_t>(c)] += weights.row(s)[j] * o;
      }
    }
    for (std::int64_t c = 0; c < H; ++c)
      EXPECT_NEAR(y.row(s)[c], expect[static_cast<std::size_t>(c)], 1e-4);
  }
  // The old loop, step for step.
  Tensor old({S, H}), xe, gu, act, he;
  for (std::int64_t e = 0; e < E; ++e) {
    std::vector<std::int64_t> rows;
    std::vector<float> ws;
    for (std::int64_t i = 0; i < S * k; ++i)
      if (ids[i] == e) rows.push_back(i / k), ws.push_back(weights.data()[i]);
    if (rows.empty()) continue;
    xe = Tensor({static_cast<std::int64_t>(rows.size()), H});
    for (std::size_t i = 0; i < rows.size(); ++i)
      std::copy_n(x.row(rows[i]), H, xe.row(static_cast<std::int64_t>(i)));
    const Weight gw{DType::kF32,
                    {2 * I, H},
                    reinterpret_cast<const std::uint8_t*>(gate_up.data() + e * 2 * I * H)};
    const Weight dw{
        DType::kF32, {H, I}, reinterpret_cast<const std::uint8_t*>(down.data() + e * H * I)};
    be->linear(xe, gw, gu);
    be->swiglu_packed(gu, act);
    be->linear(act, dw, he);
    for (std::size_t i = 0; i < rows.size(); ++i)
      for (std::int64_t c = 0; c < H; ++c)
        old.row(rows[i])[c] += ws[i] * he.row(static_cast<std::int64_t>(i))[c];
  }
  EXPECT_EQ(std::memcmp(old.data(), y.data(), old.bytes()), 0);
}

// Block-scaled FP8 (issue 15): linear and moe_experts on the e4m3 bytes and their scales equal,
// bit for bit, the same ops on the matrix dequantised whole to f32 (quant::dequantize) when both
// take the same tiles: the CPU dequantises tiles of rows with the same row dequantiser and
// multiplies them as f32 tiles.
// Shapes with partial 128-blocks in both directions, several row tiles and column parts, and
// first_rows / expert() slices (the scale view moves with them).
TEST_F(CpuOps, Fp8LinearEqualsDequantisedF32) {
  Rng r(11);
  for (const auto& [S, in, out] : std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>>{
           {1, 200, 300}, {5, 256, 130}, {70, 200, 300}, {3, 4096, 700}, {9, 130, 5000}}) {
    SCOPED_TRACE("S " + std::to_string(S) + " in " + std::to_string(in) + " out " +
                 std::to_string(out));
    HostFp8Weight w(Shape{out, in});
    w.fill_all(r, 1.0f / std::sqrt(static_cast<float>(in)));
    const auto dq = w.dequantized();
    // The f32 reference one byte off alignment takes linear's tile path (as FP8 does) rather than
    // the in-place product, so both run sgemm over the same tiles: bit-identical. (In place,
    // sgemm over other column counts rounds differently: checked to 1e-6 below.)
    std::vector<std::uint8_t> unaligned(dq.size() * sizeof(float) + 1);
    std::memcpy(unaligned.data() + 1, dq.data(), dq.size() * sizeof(float));
    const Weight wf{DType::kF32, {out, in}, unaligned.data() + 1};
    const Weight wf_aligned{
        DType::kF32, {out, in}, reinterpret_cast<const std::uint8_t*>(dq.data())};
    const auto x = random_tensor({S, in}, r);
    auto up = be->upload(w.view(), DType::kBF16);
    ASSERT_TRUE(up.ok());
    ASSERT_TRUE(up->block_scaled());
    EXPECT_EQ(up->data, w.view().data) << "the CPU computes on the stored bytes in place";
    Tensor y8, yf;
    be->linear(x, *up, y8);
    be->linear(x, wf, yf);
    ASSERT_EQ(y8.shape(), yf.shape());
    EXPECT_EQ(std::memcmp(y8.data(), yf.data(), y8.bytes()), 0)
        << "max |d| " << max_abs_diff(y8.span(), yf.span());
    Tensor ya;
    be->linear(x, wf_aligned, ya);
    EXPECT_LE(max_abs_diff(y8.span(), ya.span()), 1e-6);
    // first_rows at a row count inside a 128-row block keeps the scale grid's prefix.
    const auto n = std::min<std::int64_t>(out, 200);
    Tensor yn, yfn;
    be->linear(x, up->first_rows(n), yn);
    be->linear(x, wf.first_rows(n), yfn);
    EXPECT_EQ(std::memcmp(yn.data(), yfn.data(), yn.bytes()), 0);
    // and those are the full product's first columns (to rounding: another split over threads)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t o = 0; o < n; ++o) ASSERT_NEAR(yn.row(s)[o], y8.row(s)[o], 1e-5);
  }
  // Every finite code is exercised and the dequantised values are the quant module's.
  HostFp8Weight small(Shape{4, 128});
  small.fill_all(r, 1.0f);
  const auto v = small.view();
  const auto dq = small.dequantized();
  for (std::int64_t i = 0; i < 4 * 128; ++i)
    ASSERT_EQ(dq[static_cast<std::size_t>(i)],
              quant::e4m3_to_f32(v.data[i]) * v.scale_at(i / 128, i % 128));
}

TEST_F(CpuOps, Fp8MoeExpertsEqualDequantisedF32) {
  Rng r(12);
  const std::int64_t H = 200, E = 6, I = 136, S = 7, k = 3;
  HostFp8Weight gate_up(Shape{E, 2 * I, H}), down(Shape{E, H, I});
  gate_up.fill_all(r, 1.0f / std::sqrt(static_cast<float>(H)));
  down.fill_all(r, 1.0f / std::sqrt(static_cast<float>(I)));
  const auto gu = gate_up.dequantized(), dn = down.dequantized();
  const auto x = random_tensor({S, H}, r);
  auto [experts, weights] = random_routing(S, E, k, r);
  Tensor y8, yf;
  be->moe_experts(x, gate_up.view(), down.view(), experts, weights, 0, y8);
  be->moe_experts(x, {DType::kF32, {E, 2 * I, H}, reinterpret_cast<const std::uint8_t*>(gu.data())},
                  {DType::kF32, {E, H, I}, reinterpret_cast<const std::uint8_t*>(dn.data())},
                  experts, weights, 0, yf);
  ASSERT_EQ(y8.shape(), yf.shape());
  EXPECT_EQ(std::memcmp(y8.data(), yf.data(), y8.bytes()), 0)
      << "max |d| " << max_abs_diff(y8.span(), yf.span());
  // expert(e) moves the scales to expert e's grid.
  const auto e3 = gate_up.view().expert(3);
  EXPECT_EQ(e3.scales.data, gate_up.view().scales.data + 3 * 3 * 2 * sizeof(float));
  std::vector<float> row(static_cast<std::size_t>(H));
  ASSERT_TRUE(quant::dequantize_row(e3.scaled_matrix(), 130, row).ok());
  EXPECT_EQ(std::memcmp(row.data(), gu.data() + (3 * 2 * I + 130) * H, row.size() * sizeof(float)),
            0);
}

TEST_F(CpuOps, LayoutOps) {
  const Tensor x({3, 4}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Tensor o, a, b;
  be->slice_rows(x, 1, 2, o);
  EXPECT_EQ(o.to_host_vector(), (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11}));
  be->slice_cols(x, 1, 2, o);
  EXPECT_EQ(o.to_host_vector(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  be->split_interleaved(x, 2, 1, a, b);  // heads [0 | 1], [2 | 3]
  EXPECT_EQ(a.to_host_vector(), (std::vector<float>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(b.to_host_vector(), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  be->repeat_cols(Tensor({1, 2}, {1, 2}), 3, o);
  EXPECT_EQ(o.to_host_vector(), (std::vector<float>{1, 2, 1, 2, 1, 2}));
  // append_rows: an empty cache takes the width; a warm cache grows in place.
  Tensor cache;
  be->append_rows(cache, x);
  EXPECT_EQ(cache.shape(), (Shape{3, 4}));
  be->append_rows(cache, Tensor({1, 4}, {20, 21, 22, 23}));
  const void* warm = cache.raw();
  be->append_rows(cache, Tensor({1, 4}, {30, 31, 32, 33}));
  EXPECT_EQ(cache.raw(), warm);
  EXPECT_EQ(cache.shape(), (Shape{5, 4}));
  EXPECT_EQ(cache.row(3)[1], 21.0f);
  EXPECT_EQ(cache.row(4)[3], 33.0f);
  EXPECT_EQ(cache.row(2)[0], 8.0f);
}

// ---------------------------------------------------------------------------------------------
// Failure recording.

// A memory that refuses allocations past a budget, and counts the system calls.
class LimitedMemory final : public Memory {
 public:
  explicit LimitedMemory(std::size_t budget) : budget_(budget) {}
  Device device() const override { return Device::kHost; }
  void* allocate(std::size_t bytes) override {
    if (used_ + bytes > budget_) return nullptr;
    used_ += bytes;
    ++allocations_;
    return host_memory()->allocate(bytes);
  }
  void release(void* p, std::size_t bytes) override {
    used_ -= bytes;
    host_memory()->release(p, bytes);
  }
  void to_host(void* d, const void* s, std::size_t n) override { host_memory()->to_host(d, s, n); }
  void from_host(void* d, const void* s, std::size_t n) override {
    host_memory()->from_host(d, s, n);
  }
  void copy(void* d, const void* s, std::size_t n) override { host_memory()->copy(d, s, n); }
  void zero(void* p, std::size_t n) override { host_memory()->zero(p, n); }
  MemoryStats stats() const override {
    return {allocations_, static_cast<std::int64_t>(used_), static_cast<std::int64_t>(used_)};
  }

 private:
  std::size_t budget_, used_ = 0;
  std::int64_t allocations_ = 0;
};

// A backend that implements nothing but what every backend must.
class NoOpsBackend final : public Backend {
 public:
  explicit NoOpsBackend(std::shared_ptr<Memory> m = host_memory()) : memory_(std::move(m)) {}
  std::string name() const override { return "noops"; }
  const std::shared_ptr<Memory>& memory() const override { return memory_; }
  Expected<Weight> upload(const Weight& w, DType) override { return w; }

 private:
  std::shared_ptr<Memory> memory_;
};

// DeepSeek V4's interleaved tail RoPE: pair j of the last 2*half columns turns by pos * f[j]; the
// leading columns are untouched, the inverse undoes it, and scores depend on relative position.
TEST_F(CpuOps, RopeInterleavedRotatesTailPairs) {
  const std::int64_t heads = 2, D = 8;
  const std::vector<float> f = {0.5f, 0.125f};
  const auto x = normal_tensor({3, heads * D}, rng);
  Tensor t = x;
  be->rope_interleaved(t, D, f32_vector(f), 5, 2, false);
  for (std::int64_t r = 0; r < 3; ++r) {
    const auto pos = static_cast<float>(5 + 2 * r);
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* a = x.row(r) + h * D;
      const float* b = t.row(r) + h * D;
      for (std::int64_t c = 0; c < 4; ++c) EXPECT_EQ(b[c], a[c]);
      for (std::int64_t j = 0; j < 2; ++j) {
        const double ang = static_cast<double>(pos * f[static_cast<std::size_t>(j)]);
        const double u = a[4 + 2 * j], v = a[5 + 2 * j];
        EXPECT_NEAR(b[4 + 2 * j], u * std::cos(ang) - v * std::sin(ang), 1e-5);
        EXPECT_NEAR(b[5 + 2 * j], v * std::cos(ang) + u * std::sin(ang), 1e-5);
      }
    }
  }
  be->rope_interleaved(t, D, f32_vector(f), 5, 2, true);
  EXPECT_LE(max_abs_diff(t.span(), x.span()), 1e-5);
}

// The compressor's pooling against a direct per-channel softmax: plain windows (HCA) and
// overlapping ones (CSA: the previous window's first halves join the current second halves),
// the position bias by offset in the window, a frontier that starts past position 0.
TEST_F(CpuOps, CompressorPoolEqualsDirectSoftmax) {
  for (const bool overlap : {false, true}) {
    const std::int64_t ratio = 4, width = overlap ? 6 : 3, D = 3, src_first = 4, n = 13;
    const auto kv = normal_tensor({n, width}, rng), gate = normal_tensor({n, width}, rng, 2.0f),
               bias = normal_tensor({ratio, width}, rng);
    const std::int64_t first_window = 2, windows = 2;  // windows 2 and 3: positions 8..15
    Tensor out;
    be->compressor_pool(kv, gate, src_first, f32_weight(bias), first_window, windows, overlap, out);
    ASSERT_EQ(out.shape(), (Shape{windows, D}));
    for (std::int64_t wi = 0; wi < windows; ++wi) {
      const auto w = first_window + wi;
      for (std::int64_t i = 0; i < D; ++i) {
        std::vector<std::pair<double, double>> slots;  // (score, value)
        auto add = [&](std::int64_t window, std::int64_t col) {
          for (auto t = window * ratio; t < (window + 1) * ratio; ++t)
            slots.emplace_back(gate.row(t - src_first)[col + i] + bias.row(t % ratio)[col + i],
                               kv.row(t - src_first)[col + i]);
        };
        if (overlap) add(w - 1, 0);
        add(w, overlap ? D : 0);
        double m = -INFINITY, z = 0, o = 0;
        for (const auto& s : slots) m = std::max(m, s.first);
        for (const auto& s : slots) z += std::exp(s.first - m);
        for (const auto& s : slots) o += std::exp(s.first - m) / z * s.second;
        EXPECT_NEAR(out.row(wi)[i], o, 1e-5) << "overlap " << overlap << " window " << w;
      }
    }
  }
  // CSA's window 0 has no previous window: only its own second halves.
  const auto kv = normal_tensor({4, 4}, rng), gate = normal_tensor({4, 4}, rng);
  const std::vector<float> zero_bias(16, 0.0f);
  const Weight bias{DType::kF32, {4, 4}, reinterpret_cast<const std::uint8_t*>(zero_bias.data())};
  Tensor out;
  be->compressor_pool(kv, gate, 0, bias, 0, 1, true, out);
  for (std::int64_t i = 0; i < 2; ++i) {
    double z = 0, o = 0;
    for (std::int64_t t = 0; t < 4; ++t) z += std::exp(gate.row(t)[2 + i]);
    for (std::int64_t t = 0; t < 4; ++t) o += std::exp(gate.row(t)[2 + i]) / z * kv.row(t)[2 + i];
    EXPECT_NEAR(out.row(0)[i], o, 1e-5);
  }
}

TEST_F(CpuOps, WeightedIndexScoresEqualDirect) {
  const std::int64_t S = 3, N = 5, heads = 4, dim = 6;
  const auto q = normal_tensor({S, heads * dim}, rng), keys = normal_tensor({N, dim}, rng),
             w = normal_tensor({S, heads}, rng);
  Tensor out;
  be->weighted_index_scores(q, keys, w, 0.25f, out);
  ASSERT_EQ(out.shape(), (Shape{S, N}));
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t b = 0; b < N; ++b) {
      double acc = 0;
      for (std::int64_t h = 0; h < heads; ++h) {
        double d = 0;
        for (std::int64_t c = 0; c < dim; ++c) d += q.row(s)[h * dim + c] * keys.row(b)[c];
        acc += w.row(s)[h] * std::max(0.0, d);
      }
      EXPECT_NEAR(out.row(s)[b], 0.25 * acc, 1e-5);
    }
}

// Sink attention against a direct softmax with the sink in the normaliser: the sliding window
// over raw rows that start past position 0, every visible compressed row (HCA), or the picks.
TEST_F(CpuOps, SinkAttentionEqualsDirectSoftmax) {
  const std::int64_t H = 3, D = 4, window = 3, ratio = 4, first = 9, S = 3, kv_first = 6;
  const auto q = normal_tensor({S, H * D}, rng), kv = normal_tensor({first + S - kv_first, D}, rng),
             comp = normal_tensor({3, D}, rng);
  const std::vector<float> sinks = {0.3f, -1.0f, 2.0f};
  const auto picked = i32_tensor({S, 2}, {1, -1, 0, 2, -1, -1});
  for (int kind = 0; kind < 3; ++kind) {
    Tensor out;
    be->sink_attention(q, kv, kv_first, window, comp, kind == 0 ? 0 : ratio,
                       kind == 2 ? &picked : nullptr, f32_vector(sinks), first, 0.5f, out);
    ASSERT_EQ(out.shape(), q.shape());
    for (std::int64_t s = 0; s < S; ++s) {
      const auto p = first + s;
      std::vector<const float*> keys;
      for (auto t = p - window + 1; t <= p; ++t) keys.push_back(kv.row(t - kv_first));
      if (kind == 1)
        for (std::int64_t w = 0; w < (p + 1) / ratio; ++w) keys.push_back(comp.row(w));
      if (kind == 2)
        for (std::int64_t j = 0; j < 2; ++j)
          if (const auto w = picked.data_as<std::int32_t>()[s * 2 + j]; w >= 0)
            keys.push_back(comp.row(w));
      for (std::int64_t h = 0; h < H; ++h) {
        double z = std::exp(static_cast<double>(sinks[static_cast<std::size_t>(h)]));
        std::vector<double> e;
        for (const auto* k : keys) {
          double d = 0;
          for (std::int64_t c = 0; c < D; ++c) d += q.row(s)[h * D + c] * k[c];
          e.push_back(std::exp(0.5 * d));
          z += e.back();
        }
        for (std::int64_t c = 0; c < D; ++c) {
          double o = 0;
          for (std::size_t j = 0; j < keys.size(); ++j) o += e[j] / z * keys[j][c];
          EXPECT_NEAR(out.row(s)[h * D + c], o, 1e-5) << "kind " << kind;
        }
      }
    }
  }
}

TEST_F(CpuOps, GroupedLinearIsBlockDiagonal) {
  const std::int64_t S = 3, G = 2, in = 5, out = 4;
  const auto x = normal_tensor({S, G * in}, rng), w = normal_tensor({G * out, in}, rng);
  Tensor y;
  be->grouped_linear(x, f32_weight(w), G, y);
  ASSERT_EQ(y.shape(), (Shape{S, G * out}));
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t g = 0; g < G; ++g)
      for (std::int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (std::int64_t i = 0; i < in; ++i)
          acc += static_cast<double>(x.row(s)[g * in + i]) * w.row(g * out + o)[i];
        EXPECT_NEAR(y.row(s)[g * out + o], acc, 1e-5);
      }
}

TEST(BackendStatus, MissingOpIsANamedUnsupportedFailure) {
  NoOpsBackend be;
  EXPECT_TRUE(be.status().ok());
  Tensor x({2, 3}), y;
  be.swiglu_packed(x, y);
  ASSERT_FALSE(be.status().ok());
  EXPECT_EQ(be.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(be.status().message().find("'swiglu_packed'"), std::string::npos)
      << be.status().message();
  EXPECT_NE(be.status().message().find("noops"), std::string::npos);
  // The first failure is kept.
  be.moe_experts(x, {}, {}, x, x, 0, y);
  EXPECT_NE(be.status().message().find("'swiglu_packed'"), std::string::npos);
  be.clear_status();
  EXPECT_TRUE(be.status().ok());
  Tensor idx, val;
  be.topk(x, 1, idx, val);
  EXPECT_NE(be.status().message().find("'topk'"), std::string::npos);
}

TEST(BackendStatus, OutOfMemoryIsRecorded) {
  NoOpsBackend be(std::make_shared<LimitedMemory>(1024));
  const Tensor small = be.new_tensor({4, 4});
  EXPECT_TRUE(small.ok());
  EXPECT_EQ(small.device(), Device::kHost);
  EXPECT_TRUE(be.status().ok());
  const Tensor big = be.new_tensor({1024, 1024});
  EXPECT_FALSE(big.ok());
  EXPECT_EQ(be.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(be.status().message().find("out of memory"), std::string::npos);
}

TEST(BackendStatus, CpuOpsAfterAFailureDoNothing) {
  auto be = make_cpu_backend();
  Tensor x({2, 2}, {1, 2, 3, 4}), y;
  // A bf16 norm weight was never uploaded (widened): refused, with the op named.
  const std::uint16_t bf[2] = {f32_to_bf16(1.0f), f32_to_bf16(2.0f)};
  be->rms_norm(x, {DType::kBF16, {2}, reinterpret_cast<const std::uint8_t*>(bf)}, 2, 1e-6f, false,
               y);
  ASSERT_FALSE(be->status().ok());
  EXPECT_NE(be->status().message().find("rms_norm"), std::string::npos);
  const auto first = be->status().message();
  be->scale(x, 10.0f);
  be->add(x, x);
  const std::vector<float> w = {1, 0, 0, 1};
  be->linear(x, {DType::kF32, {2, 2}, reinterpret_cast<const std::uint8_t*>(w.data())}, y);
  EXPECT_EQ(x.to_host_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(y.shape().empty());
  EXPECT_EQ(be->status().message(), first);
  be->clear_status();
  be->scale(x, 10.0f);
  EXPECT_EQ(x.to_host_vector(), (std::vector<float>{10, 20, 30, 40}));
}

// ---------------------------------------------------------------------------------------------
// The device-aware Tensor.

TEST(TensorTest, CopyIsDeepAndMoveTakesTheBuffer) {
  Tensor a({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = a;
  EXPECT_NE(b.raw(), a.raw());
  b.data()[0] = 9;
  EXPECT_EQ(a.data()[0], 1.0f);
  b = a;
  EXPECT_EQ(b.to_host_vector(), a.to_host_vector());
  const void* buf = a.raw();
  Tensor c = std::move(a);
  EXPECT_EQ(c.raw(), buf);
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_TRUE(a.shape().empty());  // NOLINT(bugprone-use-after-move): the moved-from state
  EXPECT_EQ(a.numel(), 0);
  Tensor d;
  d = std::move(c);
  EXPECT_EQ(d.raw(), buf);
  EXPECT_EQ(d.to_host_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(TensorTest, AllocateReusesALargeEnoughBuffer) {
  auto memory = std::make_shared<LimitedMemory>(1 << 20);
  Tensor t(memory, {8, 8});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(memory->stats().system_allocations, 1);
  const void* buf = t.raw();
  ASSERT_TRUE(t.allocate(memory, {4, 4}));
  EXPECT_EQ(t.raw(), buf);
  ASSERT_TRUE(t.allocate(memory, {2, 32}, DType::kI32));  // same bytes, another dtype
  EXPECT_EQ(t.raw(), buf);
  EXPECT_EQ(t.dtype(), DType::kI32);
  EXPECT_EQ(memory->stats().system_allocations, 1);
  ASSERT_TRUE(t.allocate(memory, {16, 16}));  // larger: a new buffer
  EXPECT_EQ(memory->stats().system_allocations, 2);
  EXPECT_EQ(memory->stats().bytes_in_use, 16 * 16 * 4);  // the old one was released
  // Exhaustion: false, the shape set with no bytes behind it (not ok()).
  EXPECT_FALSE(t.allocate(memory, {1 << 20}));
  EXPECT_FALSE(t.ok());
  EXPECT_EQ(t.raw(), nullptr);
  EXPECT_EQ(memory->stats().bytes_in_use, 0);
  // reset zero-fills.
  ASSERT_TRUE(t.allocate(memory, {2, 2}));
  std::fill_n(t.data(), 4, 7.0f);
  ASSERT_TRUE(t.reset({2, 2}));
  EXPECT_EQ(t.to_host_vector(), (std::vector<float>(4, 0.0f)));
}

// A tensor whose allocation failed says so (`ok()` is how Backend::new_tensor and callers that
// construct tensors directly detect it).
TEST(TensorTest, FailedAllocationIsNotOk) {
  auto memory = std::make_shared<LimitedMemory>(1024);
  EXPECT_FALSE(Tensor(memory, {1 << 20}).ok());
  EXPECT_TRUE(Tensor(memory, {4, 4}).ok());
}

TEST(TensorTest, GrowRowsKeepsContents) {
  auto memory = std::make_shared<LimitedMemory>(1 << 20);
  Tensor t(memory, {2, 3});
  t.copy_from_host(std::vector<float>{1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(t.grow_rows(3));
  EXPECT_EQ(t.shape(), (Shape{3, 3}));
  const auto grown = t.to_host_vector();
  EXPECT_EQ(std::vector<float>(grown.begin(), grown.begin() + 6),
            (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // Geometric capacity: growing a row at a time reallocates rarely.
  const auto before = memory->stats().system_allocations;
  for (std::int64_t r = 4; r <= 40; ++r) ASSERT_TRUE(t.grow_rows(r));
  EXPECT_LE(memory->stats().system_allocations - before, 1);
  EXPECT_EQ(t.row(1)[2], 6.0f);
  t.shrink_rows(1);
  EXPECT_EQ(t.shape(), (Shape{1, 3}));
  EXPECT_EQ(t.to_host_vector(), (std::vector<float>{1, 2, 3}));
}

TEST(TensorTest, HostCopiesAndInt32Tensors) {
  Tensor t(host_memory(), {2, 2});
  EXPECT_EQ(t.to_host_vector(), (std::vector<float>(4, 0.0f)));  // zero-filled
  t.copy_from_host(std::vector<float>{1.5f, -2, 3, 4});
  EXPECT_EQ(t.to_host_vector(), (std::vector<float>{1.5f, -2, 3, 4}));
  EXPECT_EQ(t.span()[1], -2.0f);
  const auto i = i32_tensor({2, 3}, {-1, 0, 7, 1 << 30, -5, 3});
  EXPECT_EQ(i.dtype(), DType::kI32);
  EXPECT_EQ(i.bytes(), 24u);
  auto other = std::make_shared<LimitedMemory>(1 << 20);
  const Tensor moved = i.to(other);
  EXPECT_EQ(moved.memory(), other);
  EXPECT_EQ(moved.dtype(), DType::kI32);
  const Tensor back = moved.to(host_memory());
  EXPECT_EQ(i32_values(back), (std::vector<std::int32_t>{-1, 0, 7, 1 << 30, -5, 3}));
  Tensor copy = moved;  // copies within its own memory
  EXPECT_EQ(copy.memory(), other);
  EXPECT_EQ(i32_values(copy.to(host_memory())), i32_values(i));
}

}  // namespace
}  // namespace fs
