// The fused decode ops' multi-GEMV over packed weights (cuda_fused_segments.cuh): the GGUF mixes'
// GatedDeltaNet in-projections (with a decode step's conv) and QSA projections in one kernel, as
// cuda_fused.cu runs float and FP8 weights. Before this (session 34) packed weights took each op's
// unfused sequence: four GEMVs, two activations and the conv a GatedDeltaNet layer where FP8 ran
// one kernel. The rows go through the packed GEMV's own forms (cuda_packed_gemv.cuh), so each
// row's sum is packed linear's for the same token count, and the segment's epilogue and conv are
// multi_gemv_kernel's arithmetic: the unfused sequence's bits
// (QuantOps.PackedFusedProjectionsEqualTheSequenceBitForBit).
#include <cstdint>

#include "backend/cuda/cuda_fused_segments.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_packed.cuh"
#include "backend/cuda/cuda_packed_gemv.cuh"

namespace fs::cuda {
namespace {

// The segments' matrices as the packed GEMV's source: row r of the joint row space is segment
// i's row r - end[i - 1].
struct SegmentRows {
  const std::uint8_t* w[kMaxSegments] = {};
  const std::uint8_t* side[kMaxSegments] = {};  // FP4's scale rows; IQ2_XXS's codebook
  std::int64_t end[kMaxSegments] = {};          // the joint rows up to segment i's last
  int count = 0;
  std::int64_t row_bytes = 0, side_row_bytes = 0;

  __device__ __forceinline__ int at(std::int64_t r, std::int64_t& local) const {
    int i = 0;
    while (i + 1 < count && r >= end[i]) ++i;
    local = r - (i == 0 ? 0 : end[i - 1]);
    return i;
  }
  __device__ __forceinline__ const std::uint8_t* row(std::int64_t r) const {
    std::int64_t local = 0;
    const int i = at(r, local);
    return w[i] + local * row_bytes;
  }
  __device__ __forceinline__ const std::uint8_t* side_row(std::int64_t r) const {
    std::int64_t local = 0;
    const int i = at(r, local);
    return side[i] != nullptr ? side[i] + local * side_row_bytes : nullptr;
  }
};

// A row's sum for token s finished as multi_gemv_kernel's lane 0 finishes it: the segment's
// epilogue, then (kConv, one token) the conv where the segment carries one.
template <bool kConv>
struct SegmentSink {
  Segments segs;
  __device__ __forceinline__ void operator()(std::int64_t r, int s, float v) const {
    int i = 0;
    std::int64_t base = 0;
    while (i + 1 < segs.count && r >= base + segs.s[i].rows) base += segs.s[i++].rows;
    const Segment& sg = segs.s[i];
    const std::int64_t local = r - base;
    float* y = sg.y + s * sg.rows + local;
    const float out = finish(sg.ep, v, local, s, sg.ep.accumulate ? *y : 0.0f);
    if constexpr (kConv) {
      *y = sg.conv.tail != nullptr ? sg.conv.apply(sg.rows, local, out) : out;
    } else {
      *y = out;
    }
  }
};

}  // namespace

bool packed_segments_take(const Tensor& x, std::initializer_list<const Weight*> weights) {
  if (weights.size() == 0 || weights.size() > kMaxSegments || x.shape().size() != 2) return false;
  const Weight& first = **weights.begin();
  if (!first.is_packed() || !packed::decodable(first)) return false;
  for (const Weight* w : weights)
    if (!w->is_packed() || *w->packed != *first.packed || w->shape.size() != 2 ||
        w->cols() != x.cols() || w->row_bytes() != first.row_bytes() ||
        w->block_scaled() != first.block_scaled() || w->device != Device::kCuda ||
        w->data == nullptr)
      return false;
  return reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0;
}

void run_packed_multi_gemv(const Tensor& x, std::initializer_list<const Weight*> weights,
                           const Segments& segs, const std::uint8_t* codebook,
                           cudaStream_t stream) {
  if (segs.total == 0) return;
  SegmentRows rows;
  std::int64_t end = 0;
  bool conv = false;
  for (const Weight* w : weights) {
    const auto side = packed::side_data(*w, codebook);
    rows.w[rows.count] = w->data;
    rows.side[rows.count] = side.base;
    rows.side_row_bytes = side.row_bytes;
    end += segs.s[rows.count].rows;
    rows.end[rows.count] = end;
    conv = conv || segs.s[rows.count].conv.tail != nullptr;
    ++rows.count;
  }
  rows.row_bytes = static_cast<std::int64_t>((*weights.begin())->row_bytes());
  const auto in = x.cols();
  packed::with_format(**weights.begin(), [&](auto f) {
    using F = decltype(f);
    if (conv) {
      packed_gemv::launch_rows<F, 1>(x.data(), rows, SegmentSink<true>{segs}, in, segs.total,
                                     stream);
      return;
    }
    with_count<kFusedRows>(x.rows(), [&](auto tokens) {
      packed_gemv::launch_rows<F, decltype(tokens)::value>(x.data(), rows, SegmentSink<false>{segs},
                                                           in, segs.total, stream);
    });
  });
}

}  // namespace fs::cuda
