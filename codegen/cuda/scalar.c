/* Scalar CUDA C for one element: compute and storage types, conversions,
 * and the expression of every elementwise operator.
 *
 * Compute types follow SPEC §2: f16 and bf16 are storage types computed in
 * float; f64 in double.  Integer values are computed in long long and
 * brought back into their dtype's range after every node (cu_normalise), as
 * the reference's store does, so an i8 chain saturates at every step exactly
 * like the interpreter; bool is an int holding 0 or 1.  Float intermediates
 * inside a fused kernel are NOT rounded to f16 after every node (that is
 * what fusing buys); an explicit `cast` to or from f16/bf16 does round,
 * because the program asked for that precision.
 *
 * The expressions call small device functions of the prelude (module.c):
 * smelt_sigmoid, smelt_gelu_tanh, smelt_max_nan, smelt_idiv, smelt_sat_i8,
 * smelt_f2i_i32, ... so that one definition of each rule serves every
 * kernel and a reader of the generated code sees the rule's name.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_emit.h"

const char *cu_ctype(DType dt) {
  switch (dt) {
  case DT_F32: case DT_F16: case DT_BF16: return "float";
  case DT_F64: return "double";
  case DT_I64: case DT_I32: case DT_I8: case DT_U8: case DT_I4: case DT_U4: return "long long";
  case DT_BOOL: return "int";
  case DT_F8E4M3: case DT_F8E5M2: return "float";
  default: return "void";
  }
}

const char *cu_stype(DType dt) {
  switch (dt) {
  case DT_F32: return "float";
  case DT_F16: return "__half";
  case DT_BF16: return "__nv_bfloat16";
  case DT_F64: return "double";
  case DT_I64: return "long long";
  case DT_I32: return "int";
  case DT_I8: return "signed char";
  /* the quantised types are bytes: i4/u4 two per byte (emit.c loads the
   * nibble), f8 one (smelt_f8e4m3/smelt_f8e5m2 widen it) */
  case DT_U8: case DT_BOOL: case DT_I4: case DT_U4: case DT_F8E4M3: case DT_F8E5M2: return "unsigned char";
  default: return "void";
  }
}

static bool is_single(DType dt) { return dt == DT_F32 || dt == DT_F16 || dt == DT_BF16; }

const char *cu_const(CuFn *f, DType dt, double v) {
  if (dt_is_int(dt)) return cu_fmt(f, "%lldLL", (long long)v);
  if (dt == DT_BOOL) return v != 0 ? "1" : "0";
  bool single = dt != DT_F64;
  if (isnan(v)) return single ? "SMELT_NAN_F" : "SMELT_NAN_D";
  if (isinf(v)) return v > 0 ? (single ? "SMELT_INF_F" : "SMELT_INF_D") : (single ? "(-SMELT_INF_F)" : "(-SMELT_INF_D)");
  char buf[64];
  snprintf(buf, sizeof buf, single ? "%.9g" : "%.17g", v);
  /* "1" is an int literal in C: make it a floating one */
  if (!strpbrk(buf, ".e")) strcat(buf, ".0");
  return single ? cu_fmt(f, "%sf", buf) : cu_fmt(f, "%s", buf);
}

const char *cu_from_storage(CuFn *f, DType dt, const char *raw) {
  switch (dt) {
  case DT_F16: return cu_fmt(f, "__half2float(%s)", raw);
  case DT_BF16: return cu_fmt(f, "__bfloat162float(%s)", raw);
  case DT_F32: case DT_F64: return raw;
  case DT_BOOL: return cu_fmt(f, "(int)(%s != 0)", raw);
  case DT_F8E4M3: return cu_fmt(f, "smelt_f8e4m3(%s)", raw);
  case DT_F8E5M2: return cu_fmt(f, "smelt_f8e5m2(%s)", raw);
  default: return cu_fmt(f, "(long long)%s", raw);
  }
}

const char *cu_to_storage(CuFn *f, DType dt, const char *v) {
  switch (dt) {
  case DT_F16: return cu_fmt(f, "__float2half_rn(%s)", v);
  case DT_BF16: return cu_fmt(f, "__float2bfloat16_rn(%s)", v);
  case DT_F32: case DT_F64: return v;
  case DT_BOOL: return cu_fmt(f, "(unsigned char)(%s != 0)", v);
  default: return cu_fmt(f, "(%s)%s", cu_stype(dt), v);
  }
}

const char *cu_normalise(CuFn *f, DType dt, const char *v) {
  switch (dt) {
  case DT_I32: return cu_fmt(f, "smelt_sat_i32(%s)", v);
  case DT_I8: return cu_fmt(f, "smelt_sat_i8(%s)", v);
  case DT_U8: return cu_fmt(f, "smelt_sat_u8(%s)", v);
  case DT_BOOL: return cu_fmt(f, "(int)(%s != 0)", v);
  default: return v;
  }
}

const char *cu_convert(CuFn *f, const char *v, DType from, DType to) {
  if (from == to) return v;
  /* A value of an f16/bf16 node may be held in float with more precision
   * (fused, not stored): a cast sees the value its dtype holds, so that the
   * result does not depend on what was fused. */
  if (from == DT_F16) v = cu_fmt(f, "smelt_round_f16(%s)", v);
  if (from == DT_BF16) v = cu_fmt(f, "smelt_round_bf16(%s)", v);
  if (to == DT_BOOL) return cu_fmt(f, "(int)(%s != 0)", v);
  if (dt_is_float(to)) {
    /* ints, bool, other floats: a C conversion into the compute type, then
     * the storage rounding of the target applied once */
    const char *c = strcmp(cu_ctype(from), cu_ctype(to)) == 0 ? v : cu_fmt(f, "(%s)%s", cu_ctype(to), v);
    if (to == DT_F16) return cu_fmt(f, "smelt_round_f16(%s)", c);
    if (to == DT_BF16) return cu_fmt(f, "smelt_round_bf16(%s)", c);
    return c;
  }
  /* to an integer type */
  const char *suffix = to == DT_I64 ? "i64" : to == DT_I32 ? "i32" : to == DT_I8 ? "i8" : "u8";
  if (dt_is_float(from)) return cu_fmt(f, "smelt_f2i_%s(%s)", suffix, v);
  if (to == DT_I64) return cu_fmt(f, "(long long)%s", v);
  return cu_fmt(f, "smelt_sat_%s(%s)", suffix, v);
}

/* Name of a libm function for the compute type: "expf" or "exp". */
static const char *fn(CuFn *f, DType dt, const char *name) {
  return is_single(dt) ? cu_fmt(f, "%sf", name) : name;
}

const char *cu_unary(CuFn *f, const Node *n, DType dt, const char *x) {
  bool fl = dt_is_float(dt);
  switch (n->op) {
  case OP_NEG: return cu_fmt(f, "(-%s)", x);
  case OP_ABS:
    if (fl) return cu_fmt(f, "%s(%s)", fn(f, dt, "fabs"), x);
    return cu_fmt(f, "(%s < 0 ? -%s : %s)", x, x, x);
  case OP_EXP: return cu_fmt(f, "%s(%s)", fn(f, dt, "exp"), x);
  case OP_LOG: return cu_fmt(f, "%s(%s)", fn(f, dt, "log"), x);
  case OP_SQRT: return cu_fmt(f, "%s(%s)", fn(f, dt, "sqrt"), x);
  case OP_RSQRT: return cu_fmt(f, "%s(%s)", fn(f, dt, "rsqrt"), x);
  case OP_RECIPROCAL: return cu_fmt(f, "(%s / %s)", cu_const(f, dt, 1), x);
  case OP_TANH: return cu_fmt(f, "%s(%s)", fn(f, dt, "tanh"), x);
  case OP_SIGMOID: return cu_fmt(f, "smelt_sigmoid(%s)", x);
  /* x < 0 ? 0 : x keeps NaN, like numpy's maximum(x, 0) and the reference */
  case OP_RELU: return cu_fmt(f, "(%s < 0 ? %s : %s)", x, fl ? cu_const(f, dt, 0) : "0", x);
  case OP_GELU:
    return strcmp(ir_attr_enum(n, "approximate"), "tanh") == 0 ? cu_fmt(f, "smelt_gelu_tanh(%s)", x)
                                                                : cu_fmt(f, "smelt_gelu_erf(%s)", x);
  case OP_SILU:
    /* f16/bf16 tensors compute in float: the fast form is exact enough */
    return cu_fmt(f, "%s(%s)", dt == DT_F16 || dt == DT_BF16 ? "smelt_silu_fast" : "smelt_silu", x);
  case OP_ERF: return cu_fmt(f, "%s(%s)", fn(f, dt, "erf"), x);
  case OP_SIN: return cu_fmt(f, "%s(%s)", fn(f, dt, "sin"), x);
  case OP_COS: return cu_fmt(f, "%s(%s)", fn(f, dt, "cos"), x);
  case OP_FLOOR: return cu_fmt(f, "%s(%s)", fn(f, dt, "floor"), x);
  case OP_CEIL: return cu_fmt(f, "%s(%s)", fn(f, dt, "ceil"), x);
  case OP_ROUND: return cu_fmt(f, "%s(%s)", fn(f, dt, "rint"), x); /* ties to even */
  case OP_SIGN:
    if (!fl) return cu_fmt(f, "((%s > 0) - (%s < 0))", x, x);
    return cu_fmt(f, "(%s > %s ? %s : %s < %s ? %s : %s)", x, cu_const(f, dt, 0), cu_const(f, dt, 1), x,
                  cu_const(f, dt, 0), cu_const(f, dt, -1), x);
  default: cu_fail(f, ST_INTERNAL, "%s is not a unary operator", ir_op_name(n->op)); return x;
  }
}

const char *cu_max_nan(CuFn *f, DType dt, const char *a, const char *b) {
  if (!dt_is_float(dt)) return cu_fmt(f, "(%s > %s ? %s : %s)", a, b, a, b);
  return cu_fmt(f, "smelt_max_nan(%s, %s)", a, b);
}

const char *cu_min_nan(CuFn *f, DType dt, const char *a, const char *b) {
  if (!dt_is_float(dt)) return cu_fmt(f, "(%s < %s ? %s : %s)", a, b, a, b);
  return cu_fmt(f, "smelt_min_nan(%s, %s)", a, b);
}

const char *cu_binary(CuFn *f, Op op, DType dt, const char *a, const char *b) {
  switch (op) {
  case OP_ADD: return cu_fmt(f, "(%s + %s)", a, b);
  case OP_SUB: return cu_fmt(f, "(%s - %s)", a, b);
  case OP_MUL: return cu_fmt(f, "(%s * %s)", a, b);
  case OP_DIV:
    if (dt_is_float(dt)) return cu_fmt(f, "(%s / %s)", a, b);
    return cu_fmt(f, "smelt_idiv((long long)%s, (long long)%s)", a, b);
  case OP_POW: return cu_fmt(f, "%s(%s, %s)", fn(f, dt, "pow"), a, b);
  case OP_MAXIMUM: return cu_max_nan(f, dt, a, b);
  case OP_MINIMUM: return cu_min_nan(f, dt, a, b);
  case OP_LESS: return cu_fmt(f, "(int)(%s < %s)", a, b);
  case OP_GREATER: return cu_fmt(f, "(int)(%s > %s)", a, b);
  case OP_EQUAL: return cu_fmt(f, "(int)(%s == %s)", a, b);
  default: cu_fail(f, ST_INTERNAL, "%s is not a binary operator", ir_op_name(op)); return a;
  }
}
