// Host stand-in for CUDA's cuda_fp16.h, used only by the CPU emulation of
// generated kernels (tests/gpu/cuda_emu.hpp): the storage type and the two
// conversions smelt's kernels call, rounding to nearest even like the GPU
// (and like ir/dtype.c).
#ifndef SMELT_EMU_CUDA_FP16_H
#define SMELT_EMU_CUDA_FP16_H

#include <math.h>
#include <stdint.h>
#include <string.h>

struct __half {
  uint16_t x;
};

inline float __half2float(__half h) {
  uint32_t sign = (uint32_t)(h.x & 0x8000) << 16, exp = (h.x >> 10) & 0x1f, man = h.x & 0x3ff, u;
  float f;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    f = (float)man * 5.9604644775390625e-8f;
    return sign ? -f : f;
  } else {
    u = sign | ((exp + 112) << 23) | (man << 13);
  }
  memcpy(&f, &u, 4);
  return f;
}

inline __half __float2half_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  __half h;
  if (a >= 0x7f800000u) {
    h.x = sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
  } else if (a >= 0x477ff000u) {
    h.x = sign | 0x7c00;
  } else if (a < 0x38800000u) {
    float v;
    memcpy(&v, &a, 4);
    h.x = sign | (uint16_t)nearbyintf(v * 16777216.0f);
  } else {
    uint32_t e = (a >> 23) - 112, m = a & 0x7fffff, r = (e << 10) | (m >> 13), rest = m & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (r & 1))) r++;
    h.x = sign | (uint16_t)r;
  }
  return h;
}

inline unsigned short __half_as_ushort(__half h) { return h.x; }

#endif
