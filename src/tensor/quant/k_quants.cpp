// The "K" super-blocks: 256 weights in sub-blocks of 16 or 32, each sub-block with a small
// integer scale (and for Q2_K/Q4_K/Q5_K a small integer min) that the super-block's f16 factors
// d and dmin turn into floats:  w = (d * scale) * q - (dmin * min)  (Q6_K: (d * scale) * q).
#include <cstdint>

#include "tensor/quant/blocks.h"

namespace fs::quant::detail {
namespace {

// Q4_K and Q5_K pack 8 six-bit scales and 8 six-bit mins into 12 bytes: bytes 0-3 hold the low
// six bits of scales 0-3, bytes 4-7 those of mins 0-3; scales and mins 4-7 take their low four
// bits from the nibbles of bytes 8-11 and their top two bits from the spare top bits of bytes
// 0-3 (scales) and 4-7 (mins).
void scale_min_6bit(const std::uint8_t* s, int k, int& scale, int& min) {
  if (k < 4) {
    scale = s[k] & 63;
    min = s[k + 4] & 63;
  } else {
    scale = (s[k + 4] & 0x0f) | ((s[k - 4] >> 6) << 4);
    min = (s[k + 4] >> 4) | ((s[k] >> 6) << 4);
  }
}

}  // namespace

// Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min, one byte per 16 weights),
// qs[64] (2-bit quants), d, dmin. Weight n's quant is in byte 32*(n/128) + n%16 + 16*((n/16)%2)
// at bit 2*((n/32)%4).
void dequantize_q2_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  constexpr int kBytes = 84;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t* blk = blocks + b * kBytes;
    const std::uint8_t* scales = blk;
    const std::uint8_t* qs = blk + 16;
    const float d = load_f16(blk + 80);
    const float dmin = load_f16(blk + 82);
    for (int n = 0; n < 256; ++n) {
      const int sub = n / 16;
      const float dl = d * static_cast<float>(scales[sub] & 0x0f);
      const float ml = dmin * static_cast<float>(scales[sub] >> 4);
      const std::uint8_t byte = qs[32 * (n / 128) + 16 * (sub % 2) + n % 16];
      const int q = (byte >> (2 * ((n / 32) % 4))) & 3;
      out[n] = dl * static_cast<float>(q) - ml;
    }
    out += 256;
  }
}

// Q4_K, 144 bytes: d, dmin, the 12 scale/min bytes, qs[128]. Sub-blocks 2p and 2p+1 (32 weights
// each) share qs bytes 32p..32p+31: 2p in the low nibbles, 2p+1 in the high ones.
// Q5_K, 176 bytes: Q4_K's layout with qh[32] between the scales and qs: bit k of qh[l] is the
// fifth bit (16) of weight l of sub-block k. One body reads both; Q4_K has no qh.
template <bool kFifthBit>
void dequantize_q4_q5_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  constexpr int kBytes = kFifthBit ? 176 : 144;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t* blk = blocks + b * kBytes;
    const float d = load_f16(blk);
    const float dmin = load_f16(blk + 2);
    const std::uint8_t* packed = blk + 4;
    const std::uint8_t* qh = blk + 16;
    const std::uint8_t* qs = blk + (kFifthBit ? 48 : 16);
    for (int k = 0; k < 8; ++k) {
      int scale = 0;
      int min = 0;
      scale_min_6bit(packed, k, scale, min);
      const float dk = d * static_cast<float>(scale);
      const float mk = dmin * static_cast<float>(min);
      const std::uint8_t* q = qs + 32 * (k / 2);
      const int shift = 4 * (k % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0x0f;
        if constexpr (kFifthBit) v |= ((qh[l] >> k) & 1) << 4;
        *out++ = dk * static_cast<float>(v) - mk;
      }
    }
  }
}

void dequantize_q4_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  dequantize_q4_q5_k<false>(blocks, n_blocks, out);
}

void dequantize_q5_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  dequantize_q4_q5_k<true>(blocks, n_blocks, out);
}

// Q6_K, 210 bytes: ql[128] (low four bits), qh[64] (top two bits), scales[16] (signed, one per
// 16 weights), d. In half h (128 weights) group g (32 weights), weight l takes its low bits from
// ql[64h + 32*(g%2) + l] (low nibble for g < 2, high for g >= 2) and its top bits from bits
// 2g, 2g+1 of qh[32h + l]; the 6-bit value is offset by -32.
void dequantize_q6_k(const std::uint8_t* blocks, std::int64_t n_blocks, float* out) {
  constexpr int kBytes = 210;
  for (std::int64_t b = 0; b < n_blocks; ++b) {
    const std::uint8_t* blk = blocks + b * kBytes;
    const std::uint8_t* ql = blk;
    const std::uint8_t* qh = blk + 128;
    const auto* scales = reinterpret_cast<const std::int8_t*>(blk + 192);
    const float d = load_f16(blk + 208);
    for (int n = 0; n < 256; ++n) {
      const int h = n / 128;
      const int g = (n / 32) % 4;
      const int l = n % 32;
      const std::uint8_t low_byte = ql[64 * h + 32 * (g % 2) + l];
      const int low = (g < 2) ? (low_byte & 0x0f) : (low_byte >> 4);
      const int high = (qh[32 * h + l] >> (2 * g)) & 3;
      const int q = (low | (high << 4)) - 32;
      out[n] = d * static_cast<float>(scales[n / 16]) * static_cast<float>(q);
    }
    out += 256;
  }
}

}  // namespace fs::quant::detail
