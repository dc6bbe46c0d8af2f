/* dtype names, sizes and the f16/bf16 conversions (round to nearest even,
 * NaN kept quiet, overflow to infinity, subnormals handled exactly). */
#include "dtype.h"

#include <math.h>
#include <string.h>

static const struct {
  const char *name;
  size_t size;
} dt_info[DT_COUNT] = {
    [DT_INVALID] = {"invalid", 0},
#define X(id, name, size) [DT_##id] = {name, size},
    DTYPE_LIST(X)
#undef X
};

const char *dt_name(DType dt) { return dt > 0 && dt < DT_COUNT ? dt_info[dt].name : "invalid"; }
size_t dt_size(DType dt) { return dt > 0 && dt < DT_COUNT ? dt_info[dt].size : 0; }

DType dt_from_name(const char *name) {
  for (int i = 1; i < DT_COUNT; i++)
    if (strcmp(dt_info[i].name, name) == 0) return (DType)i;
  return DT_INVALID;
}

bool dt_is_float(DType dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16 || dt == DT_F64; }
bool dt_is_int(DType dt) { return dt == DT_I64 || dt == DT_I32 || dt == DT_I8 || dt == DT_U8; }

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float dt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24 */
    float v = (float)man * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t dt_f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520: inf */
  if (a < 0x38800000u) {
    /* result is subnormal in f16: scale to units of 2^-24, round to even */
    float v = bits_f32(a) * 16777216.0f;
    float r = nearbyintf(v);
    return sign | (uint16_t)r;
  }
  uint32_t exp = (a >> 23) - 112, man = a & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return sign | (uint16_t)h;
}

float dt_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t dt_f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

double dt_load(DType dt, const void *base, size_t i) {
  switch (dt) {
  case DT_F32: return ((const float *)base)[i];
  case DT_F16: return dt_f16_to_f32(((const uint16_t *)base)[i]);
  case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)base)[i]);
  case DT_F64: return ((const double *)base)[i];
  case DT_I64: return (double)((const int64_t *)base)[i];
  case DT_I32: return ((const int32_t *)base)[i];
  case DT_I8: return ((const int8_t *)base)[i];
  case DT_U8: return ((const uint8_t *)base)[i];
  case DT_BOOL: return ((const uint8_t *)base)[i] != 0;
  default: return 0;
  }
}

/* Float to integer conversion truncates toward zero like C and numpy's astype;
 * out-of-range values saturate instead of being undefined behaviour. */
static double clampd(double v, double lo, double hi) {
  if (isnan(v)) return 0;
  return v < lo ? lo : v > hi ? hi : v;
}

void dt_store(DType dt, void *base, size_t i, double v) {
  switch (dt) {
  case DT_F32: ((float *)base)[i] = (float)v; break;
  case DT_F16: ((uint16_t *)base)[i] = dt_f32_to_f16((float)v); break;
  case DT_BF16: ((uint16_t *)base)[i] = dt_f32_to_bf16((float)v); break;
  case DT_F64: ((double *)base)[i] = v; break;
  case DT_I64: ((int64_t *)base)[i] = (int64_t)clampd(v, -9.2233720368547748e18, 9.2233720368547748e18 - 1024); break;
  case DT_I32: ((int32_t *)base)[i] = (int32_t)clampd(v, -2147483648.0, 2147483647.0); break;
  case DT_I8: ((int8_t *)base)[i] = (int8_t)clampd(v, -128, 127); break;
  case DT_U8: ((uint8_t *)base)[i] = (uint8_t)clampd(v, 0, 255); break;
  case DT_BOOL: ((uint8_t *)base)[i] = v != 0; break;
  default: break;
  }
}
