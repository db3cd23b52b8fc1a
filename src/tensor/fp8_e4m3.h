// An e4m3 byte's value, exactly, on the host and in CUDA kernels, built from the byte's fields:
// E4M3 "fn" (OCP OFP8), exponent bias 7, no infinities, 0x7f/0xff NaN, subnormals m * 2^-9.
// Every value is a float exactly. The CPU's f8e4m3_to_f32 (dtype.h) is this, and the FP8 kernels
// use it on GPUs without the one-instruction pair conversion (cvt.rn.f16x2.e4m3x2, sm_89 and
// later), which gives the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#include "util/host_device.h"

namespace fs {

FS_HOST_DEVICE inline float float_from_bits(std::uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

FS_HOST_DEVICE inline float e4m3_value(unsigned byte) {
  const unsigned magnitude = byte & 0x7fu;
  float v;
  if (magnitude == 0x7fu) {
    v = float_from_bits(0x7fc00000u);  // NaN
  } else if (magnitude < 8u) {
    v = static_cast<float>(magnitude) * 0x1p-9f;  // subnormal (or zero): exact
  } else {
    // Normal: exponent field e (1..15) -> float exponent field e - 7 + 127, the three mantissa
    // bits at the top of float's 23.
    v = float_from_bits(((magnitude >> 3) + 120u) << 23 | (magnitude & 7u) << 20);
  }
  return (byte & 0x80u) != 0 ? -v : v;
}

}  // namespace fs
