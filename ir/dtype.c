/* dtype names, sizes and the f16/bf16 conversions (round to nearest even,
 * NaN kept quiet, overflow to infinity, subnormals handled exactly); the
 * FP8 conversions (round to nearest even, saturating) and the nibble access
 * of the packed 4-bit types. */
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
int dt_bits(DType dt) { return dt_is_packed(dt) ? 4 : (int)dt_size(dt) * 8; }

DType dt_from_name(const char *name) {
  for (int i = 1; i < DT_COUNT; i++)
    if (strcmp(dt_info[i].name, name) == 0) return (DType)i;
  return DT_INVALID;
}

bool dt_is_float(DType dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16 || dt == DT_F64; }
bool dt_is_int(DType dt) { return dt == DT_I64 || dt == DT_I32 || dt == DT_I8 || dt == DT_U8; }
bool dt_is_packed(DType dt) { return dt == DT_I4 || dt == DT_U4; }
bool dt_is_f8(DType dt) { return dt == DT_F8E4M3 || dt == DT_F8E5M2; }
bool dt_is_storage_only(DType dt) { return dt_is_packed(dt) || dt_is_f8(dt); }

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

/* ---- FP8 ----
 * Both formats are sign, E exponent bits with bias B, M mantissa bits.
 * Encoding works on the magnitude in double, where every step is exact:
 * below the smallest normal 2^(1-B) the value is a multiple of the
 * subnormal step 2^(1-B-M), rounded with nearbyint (ties to even in the
 * default rounding mode); above it the mantissa is rounded the same way
 * and a carry moves into the exponent.  Anything beyond the largest finite
 * value (infinity included) saturates to it. */
typedef struct {
  int e, m, bias;
  double max;
  bool has_inf; /* e5m2: exponent all ones is inf/NaN; e4m3: only S.1111.111 is NaN */
} F8Format;

static const F8Format f8_e4m3 = {4, 3, 7, 448.0, false};
static const F8Format f8_e5m2 = {5, 2, 15, 57344.0, true};

float dt_f8_to_f32(DType dt, uint8_t bits) {
  const F8Format *fm = dt == DT_F8E5M2 ? &f8_e5m2 : &f8_e4m3;
  int sign = bits >> 7, exp = (bits >> fm->m) & ((1 << fm->e) - 1), man = bits & ((1 << fm->m) - 1);
  double v;
  if (fm->has_inf && exp == (1 << fm->e) - 1) v = man ? NAN : INFINITY;
  else if (!fm->has_inf && exp == (1 << fm->e) - 1 && man == (1 << fm->m) - 1) v = NAN;
  else if (exp == 0) v = ldexp((double)man, 1 - fm->bias - fm->m);
  else v = ldexp(1.0 + (double)man / (1 << fm->m), exp - fm->bias);
  return (float)(sign ? -v : v);
}

/* From double, so that dt_store rounds once. */
static uint8_t f8_encode(DType dt, double f) {
  const F8Format *fm = dt == DT_F8E5M2 ? &f8_e5m2 : &f8_e4m3;
  uint8_t sign = signbit(f) ? 0x80 : 0;
  if (isnan(f)) return (uint8_t)(sign | 0x7f); /* a NaN in both formats */
  double a = fabs(f);
  int emin = 1 - fm->bias;
  uint32_t code;
  if (a >= fm->max) {
    a = fm->max;
  }
  if (a < ldexp(1.0, emin)) {
    code = (uint32_t)nearbyint(ldexp(a, fm->m - emin)); /* may round up to the smallest normal */
  } else {
    int ex;
    double fr = frexp(a, &ex); /* a = fr * 2^ex, fr in [0.5, 1) */
    int e = ex - 1;
    uint32_t q = (uint32_t)nearbyint((fr * 2.0 - 1.0) * (1 << fm->m));
    if (q == (1u << fm->m)) q = 0, e++;
    code = ((uint32_t)(e + fm->bias) << fm->m) | q;
  }
  return (uint8_t)(sign | code);
}

uint8_t dt_f32_to_f8(DType dt, float f) { return f8_encode(dt, f); }

/* ---- 4-bit ---- */

static unsigned nibble(const void *base, size_t i) {
  uint8_t b = ((const uint8_t *)base)[i >> 1];
  return (i & 1) ? b >> 4 : b & 15u;
}

static void set_nibble(void *base, size_t i, unsigned v) {
  uint8_t *b = (uint8_t *)base + (i >> 1);
  *b = (i & 1) ? (uint8_t)((*b & 0x0f) | (v << 4)) : (uint8_t)((*b & 0xf0) | (v & 15u));
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
  case DT_I4: {
    unsigned v = nibble(base, i);
    return v >= 8 ? (double)v - 16 : (double)v;
  }
  case DT_U4: return nibble(base, i);
  case DT_F8E4M3: case DT_F8E5M2: return dt_f8_to_f32(dt, ((const uint8_t *)base)[i]);
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
  case DT_I4: set_nibble(base, i, (unsigned)(int)clampd(v, -8, 7) & 15u); break;
  case DT_U4: set_nibble(base, i, (unsigned)clampd(v, 0, 15)); break;
  case DT_F8E4M3: case DT_F8E5M2: ((uint8_t *)base)[i] = f8_encode(dt, v); break;
  default: break;
  }
}
