// CPU prefill speed of a model beside the machine's sgemm rate:
//   prefill_bench MODEL_DIR TEXT_FILE [LENGTHS] [REPEATS] [CHUNK]
// TEXT_FILE is tokenized with the model's tokenizer; the first L ids are prefilled into a cold
// state by `extend` in CHUNK-token forward calls (512, as `serve` and `prefill` do), MTP history
// included, on the CPU backend. LENGTHS is comma-separated (default 1024,4096,16384,32768);
// each is run REPEATS times (default 2) and the best is reported.
//
// The model runs on a CountingBackend (counting_backend.h), which counts its FLOPs and times
// every op, and records the product shapes it asks for; sgemm is then timed at exactly those
// shapes, with the same threads, and the model's achieved GFLOP/s is shown as a fraction of it.
// bench/NOTES.md records the figures with the command.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "counting_backend.h"
#include "decode/decode_state.h"
#include "model/family.h"
#include "model/qwen_next/forward.h"
#include "model/qwen_next/weights.h"
#include "tokenizer/metadata.h"
#include "util/mapped_file.h"

namespace {

using Clock = std::chrono::steady_clock;
using fs::bench::CountingBackend;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<std::int64_t> parse_lengths(const std::string& s) {
  std::vector<std::int64_t> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoll(item));
  return out;
}

// GFLOP/s of sgemm at one shape (row-major x [M, K] times w [N, K]^T, as the CPU backend's
// `linear` calls it), timed for at least `min_s` seconds after one warm-up call.
double sgemm_rate(std::int64_t M, std::int64_t N, std::int64_t K, double min_s) {
  static std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(static_cast<std::size_t>(M * K)), b(static_cast<std::size_t>(N * K)),
      c(static_cast<std::size_t>(M * N));
  for (auto& v : a) v = u(rng);
  for (auto& v : b) v = u(rng);
  auto call = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N),
                static_cast<int>(K), 1.0f, a.data(), static_cast<int>(K), b.data(),
                static_cast<int>(K), 0.0f, c.data(), static_cast<int>(N));
  };
  call();
  std::int64_t calls = 0;
  const auto t0 = Clock::now();
  double t = 0;
  do {
    call();
    ++calls;
    t = seconds_since(t0);
  } while (t < min_s || calls < 3);
  return 2.0 * static_cast<double>(M * N * K) * static_cast<double>(calls) / t / 1e9;
}

struct Run {
  std::int64_t tokens = 0;
  double best_s = 0, median_s = 0;
  double cpu_s = 0;  // process CPU time of the best run
  double flops = 0;
  std::map<std::string, fs::bench::OpStats> ops;  // of the best run
  std::map<std::pair<std::int64_t, std::int64_t>, fs::bench::OpStats> linear;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: prefill_bench MODEL_DIR TEXT_FILE [LENGTHS] [REPEATS] [CHUNK]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const auto lengths = parse_lengths(argc > 3 ? argv[3] : "1024,4096,16384,32768");
  const int repeats = argc > 4 ? std::max(1, std::atoi(argv[4])) : 2;
  const std::int64_t chunk = argc > 5 ? std::max(1, std::atoi(argv[5])) : 512;
  auto fail = [](const fs::Status& s) {
    std::fprintf(stderr, "prefill_bench: %s\n", s.to_string().c_str());
    return 1;
  };

  auto bundle = fs::load_tokenizer_dir(dir);
  if (!bundle.ok()) return fail(bundle.status());
  auto text = fs::read_text_file(argv[2]);
  if (!text.ok()) return fail(text.status());
  auto ids = bundle->tokenizer.encode(*text);
  if (!ids.ok()) return fail(ids.status());
  const auto longest = *std::max_element(lengths.begin(), lengths.end());
  if (static_cast<std::int64_t>(ids->size()) < longest) {
    std::fprintf(stderr, "prefill_bench: %s has %zu tokens, fewer than %lld\n", argv[2],
                 ids->size(), static_cast<long long>(longest));
    return 1;
  }

  // The model as `load_model` builds it for the CPU (f32: matrices computed as stored), but on a
  // counting backend around the CPU one.
  auto desc = fs::describe_model(dir);
  if (!desc.ok()) return fail(desc.status());
  const auto* config = std::get_if<fs::QwenNextConfig>(&desc->config);
  if (config == nullptr) {
    std::fprintf(stderr, "prefill_bench: %s is not a Qwen Next model\n", dir.c_str());
    return 1;
  }
  auto weights = fs::load_qwen_next_weights(*config, dir);
  if (!weights.ok()) return fail(weights.status());
  auto owned = std::make_unique<CountingBackend>(fs::make_cpu_backend());
  CountingBackend& counter = *owned;
  if (auto s = fs::upload_qwen_next_weights(*weights, counter, fs::DType::kF32); !s.ok())
    return fail(s);
  fs::QwenNextModel model(*config, std::move(weights).value(), std::move(owned));

  std::printf("prefill_bench: %s, %s (%zu tokens), chunk %lld, best of %d\n", dir.c_str(), argv[2],
              ids->size(), static_cast<long long>(chunk), repeats);
  std::printf("threads: %u hardware, backend pool %lld, OpenBLAS kernels %s\n",
              std::thread::hardware_concurrency(), static_cast<long long>(fs::cpu_threads()),
              fs::cpu_blas_kernels().c_str());

  std::vector<Run> runs;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t>, double> shapes;
  for (const auto L : lengths) {
    const std::span<const fs::TokenId> tokens(ids->data(), static_cast<std::size_t>(L));
    Run run;
    run.tokens = L;
    std::vector<double> times;
    for (int r = 0; r < repeats; ++r) {
      counter.reset();
      fs::DecodeState state = fs::new_decode_state(model);
      const auto t0 = Clock::now();
      const double c0 = fs::bench::process_cpu_seconds();
      if (auto s = fs::extend(model, state, tokens, chunk); !s.ok()) return fail(s);
      const double t = seconds_since(t0);
      const double cpu = fs::bench::process_cpu_seconds() - c0;
      times.push_back(t);
      if (t == *std::min_element(times.begin(), times.end())) {
        run.ops = counter.ops();
        run.linear = counter.linear_by_weight();
        run.flops = counter.total_flops();
        run.cpu_s = cpu;
      }
      for (const auto& [shape, f] : counter.gemm_shapes()) shapes[shape] += f;
      std::fprintf(stderr, "  %lld tokens: %.2f s\n", static_cast<long long>(L), t);
    }
    std::sort(times.begin(), times.end());
    run.best_s = times.front();
    run.median_s = times[times.size() / 2];
    runs.push_back(std::move(run));
  }

  // sgemm at the model's own product shapes, weighted by the FLOPs done at each: the rate the
  // products would run at if all of prefill were sgemm. OpenBLAS runs it on as many threads as
  // the backend's pool has (the backend itself keeps OpenBLAS at one thread and splits products
  // over its pool), then goes back to one.
  const int threads = static_cast<int>(fs::cpu_threads());
  openblas_set_num_threads(threads);
  double total = 0, at_rate = 0;
  for (const auto& [shape, f] : shapes) {
    const auto [M, N, K] = shape;
    total += f;
    at_rate += f / sgemm_rate(M, N, K, 0.003);
  }
  const double sgemm_shapes = total / at_rate;
  const double sgemm_square = sgemm_rate(1024, 1024, 1024, 0.5);
  openblas_set_num_threads(1);
  std::printf(
      "sgemm (OpenBLAS, %d threads): %.1f GFLOP/s at the model's %zu product shapes "
      "(FLOP-weighted), %.1f GFLOP/s at 1024^3\n\n",
      threads, sgemm_shapes, shapes.size(), sgemm_square);

  std::printf(
      "| tokens | best s | median s | CPU s | tokens/s | MFLOP/token | GFLOP/s | of sgemm |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : runs) {
    const double rate = r.flops / r.best_s / 1e9;
    std::printf("| %lld | %.2f | %.2f | %.2f | %.0f | %.2f | %.1f | %.0f%% |\n",
                static_cast<long long>(r.tokens), r.best_s, r.median_s, r.cpu_s,
                static_cast<double>(r.tokens) / r.best_s,
                r.flops / static_cast<double>(r.tokens) / 1e6, rate, 100 * rate / sgemm_shapes);
  }
  for (const auto& r : runs) {
    std::printf("\nops at %lld tokens (best run; %.2f s, of which %.2f s outside ops)\n",
                static_cast<long long>(r.tokens), r.best_s, [&] {
                  double in_ops = 0;
                  for (const auto& [name, s] : r.ops) in_ops += s.seconds;
                  return r.best_s - in_ops;
                }());
    std::vector<std::pair<std::string, fs::bench::OpStats>> sorted(r.ops.begin(), r.ops.end());
    std::sort(sorted.begin(), sorted.end(),
              [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
    std::printf(
        "| op | calls | s | share | CPU s | MFLOP/token | GFLOP/s "
        "|\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (const auto& [name, s] : sorted) {
      if (s.seconds < 0.005 * r.best_s) continue;
      std::printf("| %s | %lld | %.3f | %.1f%% | %.3f | %.3f | %.1f |\n", name.c_str(),
                  static_cast<long long>(s.calls), s.seconds, 100 * s.seconds / r.best_s,
                  s.cpu_seconds, s.flops / static_cast<double>(r.tokens) / 1e6,
                  s.seconds > 0 ? s.flops / s.seconds / 1e9 : 0.0);
    }
  }
  // The products of the longest run by weight shape.
  const auto& last = runs.back();
  std::printf("\nlinear by weight [out, in] at %lld tokens\n", static_cast<long long>(last.tokens));
  std::printf("| weight | calls | s | CPU s | GFLOP/s |\n|---|---:|---:|---:|---:|\n");
  std::vector<std::pair<std::pair<std::int64_t, std::int64_t>, fs::bench::OpStats>> by(
      last.linear.begin(), last.linear.end());
  std::sort(by.begin(), by.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  for (const auto& [w, s] : by)
    std::printf("| [%lld, %lld] | %lld | %.3f | %.3f | %.1f |\n", static_cast<long long>(w.first),
                static_cast<long long>(w.second), static_cast<long long>(s.calls), s.seconds,
                s.cpu_seconds, s.seconds > 0 ? s.flops / s.seconds / 1e9 : 0.0);
  return 0;
}
