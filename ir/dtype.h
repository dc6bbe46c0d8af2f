/* Element types.  f16 and bf16 are storage types: arithmetic on them is done
 * in f32 (or wider) and rounded back to nearest-even on store. */
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
  X(BOOL, "bool", 1)

typedef enum {
  DT_INVALID = 0,
#define X(id, name, size) DT_##id,
  DTYPE_LIST(X)
#undef X
  DT_COUNT
} DType;

const char *dt_name(DType dt);
size_t dt_size(DType dt);
/* Returns DT_INVALID when the name is not a dtype. */
DType dt_from_name(const char *name);
bool dt_is_float(DType dt);
bool dt_is_int(DType dt); /* integer types, bool excluded */

float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);
float dt_bf16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);

/* Element access through double: the reference interpreter's lingua franca.
 * i64 values beyond 2^53 lose precision; the reference never needs them. */
double dt_load(DType dt, const void *base, size_t i);
void dt_store(DType dt, void *base, size_t i, double v);

#endif
