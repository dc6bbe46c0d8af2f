/* Element types.  f16 and bf16 are storage types: arithmetic on them is done
 * in f32 (or wider) and rounded back to nearest-even on store.
 *
 * The quantised weight types are storage only (no arithmetic is defined on
 * them; `dequantize` and `cast` read them, SPEC §3):
 *   i4, u4   4-bit integers packed two per byte along the row-major order:
 *            element i is the low nibble of byte i/2 when i is even, the
 *            high nibble when it is odd (GPTQ's and numpy's packbits-free
 *            convention); i4 is two's complement [-8, 7], u4 [0, 15];
 *   f8e4m3   OCP FP8 E4M3 ("fn": bias 7, no infinities, S.1111.111 is NaN,
 *            largest 448), as torch.float8_e4m3fn;
 *   f8e5m2   OCP FP8 E5M2 (bias 15, IEEE-like infinities and NaNs, largest
 *            57344), as torch.float8_e5m2.
 * Stores to f8 round to nearest even and saturate at the largest finite
 * value (CUDA's __NV_SATFINITE); NaN stays NaN. */
#ifndef SMELT_DTYPE_H
#define SMELT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DTYPE_LIST(X) \
  X(F32, "f32", 4)    \
  X(F16, "f16", 2)    \
  X(BF16, "bf16", 2)  \
  X(F64, "f64", 8)    \
  X(I64, "i64", 8)    \
  X(I32, "i32", 4)    \
  X(I8, "i8", 1)      \
  X(U8, "u8", 1)      \
  X(BOOL, "bool", 1)  \
  X(I4, "i4", 1)      \
  X(U4, "u4", 1)      \
  X(F8E4M3, "f8e4m3", 1) \
  X(F8E5M2, "f8e5m2", 1)

typedef enum {
  DT_INVALID = 0,
#define X(id, name, size) DT_##id,
  DTYPE_LIST(X)
#undef X
  DT_COUNT
} DType;

const char *dt_name(DType dt);
/* Bytes of one element; for i4/u4 the byte that holds it (and another):
 * sizes of tensors come from ir_type_bytes, which counts bits. */
size_t dt_size(DType dt);
/* Bits of one element: 4 for i4/u4, 8 * dt_size otherwise. */
int dt_bits(DType dt);
/* Returns DT_INVALID when the name is not a dtype. */
DType dt_from_name(const char *name);
bool dt_is_float(DType dt);
bool dt_is_int(DType dt); /* integer types, bool and i4/u4 excluded */
bool dt_is_packed(DType dt); /* i4, u4: two elements per byte */
bool dt_is_f8(DType dt);     /* f8e4m3, f8e5m2 */
/* Quantised storage types (i4, u4, f8e4m3, f8e5m2): only dequantize and
 * cast read them, and no node computes them. */
bool dt_is_storage_only(DType dt);

/* FP8 bits to float and back (round to nearest even, saturating; see above). */
float dt_f8_to_f32(DType dt, uint8_t bits);
uint8_t dt_f32_to_f8(DType dt, float f);

float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);
float dt_bf16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);

/* Element access through double: the reference interpreter's lingua franca.
 * i64 values beyond 2^53 lose precision; the reference never needs them. */
double dt_load(DType dt, const void *base, size_t i);
void dt_store(DType dt, void *base, size_t i, double v);

#endif
