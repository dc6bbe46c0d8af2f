/* Scalar code: one element of one operator, as LLVM IR.
 *
 * Every dtype has a storage type (how it sits in memory) and a compute type
 * (what arithmetic runs in): f32, f16 and bf16 all compute in f32, f64 in
 * f64, integers in their own width, bool as i1.  Loads widen to the compute
 * type and stores narrow with round-to-nearest-even, so a chain of f16 ops
 * fused into one kernel rounds once, at the end.
 *
 * The semantics are those of the reference kernels (ir/ref_ops.c), which
 * compute in double and saturate when they store an integer: integer
 * add/sub/mul saturate (llvm.*.sat), division by zero gives the saturated
 * infinity, float to integer conversion truncates and saturates with NaN to
 * 0 (llvm.fptosi.sat); maximum/minimum propagate NaN like numpy.
 *
 * f16 loads use the hardware conversion when the target has one (F16C,
 * AArch64) and otherwise integer bit manipulation (F. Giesen's exact
 * conversions); stores always round with integer bit manipulation
 * (round-to-nearest-even), which vectorises and needs no compiler-rt helper
 * at JIT time.  A native fptrunc would be simpler, but InstCombine then
 * narrows fptrunc(fpext a + fpext b) to an f16 add, which LLVM 14 cannot
 * vectorise on x86: f16 kernels ran 4x slower.  bf16 is always bit
 * manipulation: the top half of an f32.
 *
 * exp, tanh and erf on f32 are inline polynomials (see below) so that
 * loops calling them vectorise; log, sin, cos, pow, sqrt are LLVM
 * intrinsics, and f64 uses the intrinsics and libm (tanh, erf), resolved by
 * the JIT in the running process.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "codegen/llvm/cg_internal.h"

void cg_fail(CgMod *m, StatusCode code, const char *fmt, ...) {
  if (m->err) return;
  va_list ap;
  va_start(ap, fmt);
  m->err = st_errorv(code, fmt, ap);
  va_end(ap);
}

LLVMTypeRef cg_ctype(CgMod *m, DType dt) {
  switch (dt) {
  case DT_F32: case DT_F16: case DT_BF16: return m->t_f32;
  case DT_F64: return m->t_f64;
  case DT_I64: return m->t_i64;
  case DT_I32: return m->t_i32;
  case DT_I8: case DT_U8: case DT_I4: case DT_U4: return m->t_i8;
  case DT_BOOL: return m->t_i1;
  default: return m->t_f32; /* f8e4m3, f8e5m2 compute in f32 */
  }
}

LLVMTypeRef cg_stype(CgMod *m, DType dt) {
  switch (dt) {
  case DT_F16: return m->native_f16 ? m->t_f16 : m->t_i16;
  case DT_BF16: return m->t_i16;
  case DT_BOOL: case DT_F8E4M3: case DT_F8E5M2: return m->t_i8;
  default: return cg_ctype(m, dt); /* i4, u4: the byte holding the nibble, see cg_load_arg */
  }
}

LLVMValueRef cg_i64(CgMod *m, int64_t v) { return LLVMConstInt(m->t_i64, (unsigned long long)v, 1); }
LLVMValueRef cg_i32(CgMod *m, int32_t v) { return LLVMConstInt(m->t_i32, (unsigned long long)(int64_t)v, 1); }
LLVMValueRef cg_fconst(LLVMTypeRef t, double v) { return LLVMConstReal(t, v); }

/* f8 values are f32 once loaded. */
static bool is_floatish(DType dt) { return dt_is_float(dt) || dt_is_f8(dt); }

LLVMValueRef cg_const_of(CgMod *m, DType dt, double v) {
  LLVMTypeRef t = cg_ctype(m, dt);
  if (is_floatish(dt)) return LLVMConstReal(t, v);
  if (dt == DT_BOOL) return LLVMConstInt(t, v != 0, 0);
  return LLVMConstInt(t, (unsigned long long)(int64_t)v, dt != DT_U8);
}

LLVMValueRef cg_intrinsic(CgMod *m, const char *name, LLVMTypeRef *over, int nover, LLVMValueRef *args,
                          int nargs) {
  unsigned id = LLVMLookupIntrinsicID(name, strlen(name));
  if (!id) {
    cg_fail(m, ST_INTERNAL, "LLVM has no intrinsic %s", name);
    return LLVMGetUndef(LLVMTypeOf(args[0]));
  }
  LLVMValueRef fn = LLVMGetIntrinsicDeclaration(m->mod, id, over, (size_t)nover);
  LLVMTypeRef fty = LLVMIntrinsicGetType(m->ctx, id, over, (size_t)nover);
  return LLVMBuildCall2(m->b, fty, fn, args, (unsigned)nargs, "");
}

LLVMValueRef cg_libm(CgMod *m, const char *name, LLVMTypeRef t, LLVMValueRef x) {
  LLVMTypeRef fty = LLVMFunctionType(t, &t, 1, 0);
  LLVMValueRef fn = LLVMGetNamedFunction(m->mod, name);
  if (!fn) {
    fn = LLVMAddFunction(m->mod, name, fty);
    /* tanh and erf neither fail nor touch errno: pure functions, so LLVM
     * may hoist and combine them */
    const char *attrs[] = {"nounwind", "readnone", "willreturn"};
    for (int i = 0; i < 3; i++) {
      unsigned kind = LLVMGetEnumAttributeKindForName(attrs[i], strlen(attrs[i]));
      LLVMAddAttributeAtIndex(fn, LLVMAttributeFunctionIndex, LLVMCreateEnumAttribute(m->ctx, kind, 0));
    }
  }
  return LLVMBuildCall2(m->b, fty, fn, &x, 1, "");
}

LLVMValueRef cg_select(CgMod *m, LLVMValueRef c, LLVMValueRef a, LLVMValueRef b) {
  return LLVMBuildSelect(m->b, c, a, b, "");
}

/* numpy maximum/minimum: NaN if either is NaN (a + b is then NaN). */
LLVMValueRef cg_fmax_nan(CgMod *m, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef r = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, a, b, ""), a, b, "");
  return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, a, b, ""), LLVMBuildFAdd(B, a, b, ""), r, "");
}

LLVMValueRef cg_fmin_nan(CgMod *m, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef r = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, a, b, ""), a, b, "");
  return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealUNO, a, b, ""), LLVMBuildFAdd(B, a, b, ""), r, "");
}

/* ---- f16 and bf16 ---- */

static LLVMValueRef c32(CgMod *m, uint32_t v) { return LLVMConstInt(m->t_i32, v, 0); }

/* Exact f16 bits (i16) to f32, branch-free. */
static LLVMValueRef soft_f16_to_f32(CgMod *m, LLVMValueRef h) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef h32 = LLVMBuildZExt(B, h, m->t_i32, "");
  LLVMValueRef o = LLVMBuildShl(B, LLVMBuildAnd(B, h32, c32(m, 0x7fff), ""), c32(m, 13), "");
  LLVMValueRef e = LLVMBuildAnd(B, o, c32(m, 0x7c00u << 13), "");
  o = LLVMBuildAdd(B, o, c32(m, (127 - 15) << 23), ""); /* rebias the exponent */
  LLVMValueRef infnan = LLVMBuildICmp(B, LLVMIntEQ, e, c32(m, 0x7c00u << 13), "");
  LLVMValueRef denorm = LLVMBuildICmp(B, LLVMIntEQ, e, c32(m, 0), "");
  LLVMValueRef o_inf = LLVMBuildAdd(B, o, c32(m, (128 - 16) << 23), ""); /* exponent to 255 */
  /* a subnormal: let the FPU normalise it, 2^-14 * (1 + m) - 2^-14 */
  LLVMValueRef o_den = LLVMBuildBitCast(B, LLVMBuildAdd(B, o, c32(m, 1u << 23), ""), m->t_f32, "");
  o_den = LLVMBuildFSub(B, o_den, LLVMBuildBitCast(B, c32(m, 113u << 23), m->t_f32, ""), "");
  LLVMValueRef r = LLVMBuildSelect(B, infnan, o_inf, o, "");
  r = LLVMBuildSelect(B, denorm, LLVMBuildBitCast(B, o_den, m->t_i32, ""), r, "");
  LLVMValueRef sign = LLVMBuildShl(B, LLVMBuildAnd(B, h32, c32(m, 0x8000), ""), c32(m, 16), "");
  return LLVMBuildBitCast(B, LLVMBuildOr(B, r, sign, ""), m->t_f32, "");
}

/* f32 to f16 bits with round-to-nearest-even, overflow to inf, NaN quiet. */
static LLVMValueRef soft_f32_to_f16(CgMod *m, LLVMValueRef f) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef u = LLVMBuildBitCast(B, f, m->t_i32, "");
  LLVMValueRef sign = LLVMBuildAnd(B, u, c32(m, 0x80000000u), "");
  LLVMValueRef a = LLVMBuildXor(B, u, sign, "");
  /* too big for f16 (>= 2^16): inf, or a quiet NaN */
  LLVMValueRef big = LLVMBuildICmp(B, LLVMIntUGE, a, c32(m, (127 + 16) << 23), "");
  LLVMValueRef o_big = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntUGT, a, c32(m, 0x7f800000u), ""),
                                       c32(m, 0x7e00), c32(m, 0x7c00), "");
  /* subnormal result: adding 0.5 aligns the mantissa so the FPU rounds */
  LLVMValueRef small = LLVMBuildICmp(B, LLVMIntULT, a, c32(m, 113u << 23), "");
  LLVMValueRef magic = c32(m, ((127 - 15) + (23 - 10) + 1) << 23);
  LLVMValueRef t = LLVMBuildFAdd(B, LLVMBuildBitCast(B, a, m->t_f32, ""), LLVMBuildBitCast(B, magic, m->t_f32, ""), "");
  LLVMValueRef o_small = LLVMBuildSub(B, LLVMBuildBitCast(B, t, m->t_i32, ""), magic, "");
  /* normal: rebias, round half to even through the carry */
  LLVMValueRef odd = LLVMBuildAnd(B, LLVMBuildLShr(B, a, c32(m, 13), ""), c32(m, 1), "");
  LLVMValueRef n = LLVMBuildAdd(B, a, c32(m, (uint32_t)((15 - 127) * (1 << 23)) + 0xfff), "");
  n = LLVMBuildLShr(B, LLVMBuildAdd(B, n, odd, ""), c32(m, 13), "");
  LLVMValueRef o = LLVMBuildSelect(B, small, o_small, n, "");
  o = LLVMBuildSelect(B, big, o_big, o, "");
  o = LLVMBuildOr(B, o, LLVMBuildLShr(B, sign, c32(m, 16), ""), "");
  return LLVMBuildTrunc(B, o, m->t_i16, "");
}

static LLVMValueRef bf16_to_f32(CgMod *m, LLVMValueRef h) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef u = LLVMBuildShl(B, LLVMBuildZExt(B, h, m->t_i32, ""), c32(m, 16), "");
  return LLVMBuildBitCast(B, u, m->t_f32, "");
}

/* Round to nearest even on the top 16 bits; NaN stays a quiet NaN. */
static LLVMValueRef f32_to_bf16(CgMod *m, LLVMValueRef f) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef u = LLVMBuildBitCast(B, f, m->t_i32, "");
  LLVMValueRef hi = LLVMBuildLShr(B, u, c32(m, 16), "");
  LLVMValueRef isnan = LLVMBuildICmp(B, LLVMIntUGT, LLVMBuildAnd(B, u, c32(m, 0x7fffffff), ""), c32(m, 0x7f800000), "");
  LLVMValueRef r = LLVMBuildAdd(B, u, LLVMBuildAdd(B, c32(m, 0x7fff), LLVMBuildAnd(B, hi, c32(m, 1), ""), ""), "");
  r = LLVMBuildLShr(B, r, c32(m, 16), "");
  r = LLVMBuildSelect(B, isnan, LLVMBuildOr(B, hi, c32(m, 0x40), ""), r, "");
  return LLVMBuildTrunc(B, r, m->t_i16, "");
}

/* FP8 bits to f32 through a table of the 256 values (dt_f8_to_f32's), one
 * constant global per format: exact, and a gather when vectorised. */
static LLVMValueRef f8_to_f32(CgMod *m, DType dt, LLVMValueRef raw) {
  const char *name = dt == DT_F8E4M3 ? "smelt_f8e4m3_table" : "smelt_f8e5m2_table";
  LLVMTypeRef at = LLVMArrayType(m->t_f32, 256);
  LLVMValueRef tab = LLVMGetNamedGlobal(m->mod, name);
  if (!tab) {
    LLVMValueRef vals[256];
    for (int i = 0; i < 256; i++) vals[i] = LLVMConstReal(m->t_f32, dt_f8_to_f32(dt, (uint8_t)i));
    tab = LLVMAddGlobal(m->mod, at, name);
    LLVMSetInitializer(tab, LLVMConstArray(m->t_f32, vals, 256));
    LLVMSetGlobalConstant(tab, 1);
    LLVMSetLinkage(tab, LLVMPrivateLinkage);
    LLVMSetUnnamedAddr(tab, 1);
  }
  LLVMValueRef idx[2] = {LLVMConstInt(m->t_i64, 0, 0), LLVMBuildZExt(m->b, raw, m->t_i64, "")};
  LLVMValueRef p = LLVMBuildInBoundsGEP2(m->b, at, tab, idx, 2, "");
  return LLVMBuildLoad2(m->b, m->t_f32, p, "");
}

LLVMValueRef cg_from_storage(CgMod *m, DType dt, LLVMValueRef raw) {
  switch (dt) {
  case DT_F8E4M3: case DT_F8E5M2: return f8_to_f32(m, dt, raw);
  case DT_F16:
    return m->native_f16 ? LLVMBuildFPExt(m->b, raw, m->t_f32, "") : soft_f16_to_f32(m, raw);
  case DT_BF16: return bf16_to_f32(m, raw);
  case DT_BOOL: return LLVMBuildICmp(m->b, LLVMIntNE, raw, LLVMConstInt(m->t_i8, 0, 0), "");
  default: return raw;
  }
}

LLVMValueRef cg_to_storage(CgMod *m, DType dt, LLVMValueRef v) {
  switch (dt) {
  case DT_F16: {
    LLVMValueRef h = soft_f32_to_f16(m, v); /* not fptrunc: see the top of the file */
    return m->native_f16 ? LLVMBuildBitCast(m->b, h, m->t_f16, "") : h;
  }
  case DT_BF16: return f32_to_bf16(m, v);
  case DT_BOOL: return LLVMBuildZExt(m->b, v, m->t_i8, "");
  default: return v;
  }
}

/* ---- conversions ---- */

static bool is_half(DType dt) { return dt == DT_F16 || dt == DT_BF16; }

/* The range of an integer dtype, for saturation. */
static void int_range(DType dt, int64_t *lo, int64_t *hi) {
  switch (dt) {
  case DT_I32: *lo = INT32_MIN, *hi = INT32_MAX; break;
  case DT_I8: *lo = INT8_MIN, *hi = INT8_MAX; break;
  case DT_U8: *lo = 0, *hi = UINT8_MAX; break;
  default: *lo = INT64_MIN, *hi = INT64_MAX; break;
  }
}

LLVMValueRef cg_convert(CgMod *m, LLVMValueRef v, DType from, DType to) {
  LLVMBuilderRef B = m->b;
  if (from == to) return v;
  LLVMTypeRef tt = cg_ctype(m, to);
  if (to == DT_BOOL) {
    if (is_floatish(from)) return LLVMBuildFCmp(B, LLVMRealUNE, v, LLVMConstReal(LLVMTypeOf(v), 0), "");
    return LLVMBuildICmp(B, LLVMIntNE, v, LLVMConstInt(LLVMTypeOf(v), 0, 0), "");
  }
  if (is_floatish(to)) {
    LLVMValueRef r;
    if (is_floatish(from)) {
      r = from == DT_F64 && to != DT_F64 ? LLVMBuildFPTrunc(B, v, tt, "")
          : to == DT_F64 && from != DT_F64 ? LLVMBuildFPExt(B, v, tt, "")
                                           : v;
    } else if (from == DT_U8 || from == DT_U4 || from == DT_BOOL) {
      r = LLVMBuildUIToFP(B, v, tt, "");
    } else {
      r = LLVMBuildSIToFP(B, v, tt, "");
    }
    /* a cast to f16/bf16 rounds here even though the value stays in f32 */
    if (is_half(to)) r = cg_from_storage(m, to, cg_to_storage(m, to, r));
    return r;
  }
  /* to an integer type */
  if (is_floatish(from)) {
    LLVMTypeRef over[2] = {tt, LLVMTypeOf(v)};
    return cg_intrinsic(m, to == DT_U8 ? "llvm.fptoui.sat" : "llvm.fptosi.sat", over, 2, &v, 1);
  }
  if (from == DT_BOOL) return LLVMBuildZExt(B, v, tt, "");
  /* int to int: widen to i64, clamp to the target's range, narrow */
  LLVMValueRef w = from == DT_U8 ? LLVMBuildZExt(B, v, m->t_i64, "")
                   : from == DT_I64 ? v
                                    : LLVMBuildSExt(B, v, m->t_i64, "");
  if (to == DT_I64) return w;
  int64_t lo, hi;
  int_range(to, &lo, &hi);
  LLVMValueRef clo = cg_i64(m, lo), chi = cg_i64(m, hi);
  w = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, w, clo, ""), clo, w, "");
  w = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSGT, w, chi, ""), chi, w, "");
  return LLVMBuildTrunc(B, w, tt, "");
}

/* ---- unary ---- */


/* ---- vectorisable f32 transcendentals ----
 *
 * LLVM 14 has no vector math library to map llvm.exp or tanhf to, so a
 * vectorised loop would call expf once per lane.  For f32 these are
 * computed inline instead, branch-free, from the Cephes single-precision
 * algorithms (errors of a few f32 ulp): exp by Cody-Waite reduction to
 * [-ln2/2, ln2/2] and a degree-6 polynomial, tanh by an odd polynomial below
 * 0.625 and 1 - 2/(e^2x + 1) above, erf by its Taylor series below 0.5 and
 * Numerical Recipes' erfc (fractional error < 1.2e-7) above.  f64 keeps the
 * exact intrinsics and libm. */

static LLVMValueRef fintr1(CgMod *m, const char *name, LLVMValueRef x) {
  LLVMTypeRef t = LLVMTypeOf(x);
  return cg_intrinsic(m, name, &t, 1, &x, 1);
}

static LLVMValueRef fma_(CgMod *m, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
  LLVMTypeRef t = LLVMTypeOf(a);
  LLVMValueRef args[3] = {a, b, c};
  return cg_intrinsic(m, "llvm.fmuladd", &t, 1, args, 3);
}

/* The constant v of type t: a float, or every lane of a float or integer
 * vector (cg_exp takes f32 vectors too). */
static LLVMValueRef const_like(LLVMTypeRef t, double v) {
  bool vec = LLVMGetTypeKind(t) == LLVMVectorTypeKind;
  LLVMTypeRef e = vec ? LLVMGetElementType(t) : t;
  LLVMValueRef lane = LLVMGetTypeKind(e) == LLVMIntegerTypeKind ? LLVMConstInt(e, (unsigned long long)(long long)v, 1)
                                                                  : LLVMConstReal(e, v);
  if (!vec) return lane;
  LLVMValueRef lanes[64];
  unsigned n = LLVMGetVectorSize(t);
  for (unsigned i = 0; i < n && i < 64; i++) lanes[i] = lane;
  return LLVMConstVector(lanes, n < 64 ? n : 64);
}

/* c[0] + x*(c[1] + x*(... c[n-1])) by Horner's rule. */
static LLVMValueRef horner(CgMod *m, LLVMValueRef x, const double *c, int n) {
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef p = const_like(t, c[n - 1]);
  for (int i = n - 2; i >= 0; i--) p = fma_(m, p, x, const_like(t, c[i]));
  return p;
}

LLVMValueRef cg_exp(CgMod *m, LLVMValueRef x) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(x);
  /* f32, or a vector of f32 (lane by lane the same arithmetic) */
  bool vec = LLVMGetTypeKind(t) == LLVMVectorTypeKind && LLVMGetElementType(t) == m->t_f32 && LLVMGetVectorSize(t) <= 64;
  if (t != m->t_f32 && !vec) return fintr1(m, "llvm.exp", x);
  LLVMTypeRef it = vec ? LLVMVectorType(m->t_i32, LLVMGetVectorSize(t)) : m->t_i32;
  /* beyond [-104, 89] the result is 0 or inf anyway; NaN is put back at the
   * end (fptosi of NaN would be poison) */
  LLVMValueRef isnan = LLVMBuildFCmp(B, LLVMRealUNO, x, x, "");
  LLVMValueRef xc = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, x, const_like(t, -104), ""), const_like(t, -104), x, "");
  xc = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, xc, const_like(t, 89), ""), const_like(t, 89), xc, "");
  xc = LLVMBuildSelect(B, isnan, const_like(t, 0), xc, "");
  LLVMValueRef z = fma_(m, xc, const_like(t, 1.44269504088896341), const_like(t, 0.5));
  z = fintr1(m, "llvm.floor", z);
  LLVMValueRef r = fma_(m, z, const_like(t, -0.693359375), xc);
  r = fma_(m, z, const_like(t, 2.12194440e-4), r);
  static const double c[] = {5.0000001201E-1, 1.6666665459E-1, 4.1665795894E-2, 8.3334519073E-3, 1.3981999507E-3,
                             1.9875691500E-4};
  LLVMValueRef p = horner(m, r, c, 6);
  p = fma_(m, p, LLVMBuildFMul(B, r, r, ""), LLVMBuildFAdd(B, r, const_like(t, 1), ""));
  /* times 2^n in two factors, so that n in [-150, 128] never leaves the
   * range of a normal exponent */
  LLVMValueRef n = LLVMBuildFPToSI(B, z, it, "");
  LLVMValueRef n1 = LLVMBuildAShr(B, n, const_like(it, 1), ""), n2 = LLVMBuildSub(B, n, n1, "");
  LLVMValueRef s1 = LLVMBuildBitCast(B, LLVMBuildShl(B, LLVMBuildAdd(B, n1, const_like(it, 127), ""), const_like(it, 23), ""), t, "");
  LLVMValueRef s2 = LLVMBuildBitCast(B, LLVMBuildShl(B, LLVMBuildAdd(B, n2, const_like(it, 127), ""), const_like(it, 23), ""), t, "");
  p = LLVMBuildFMul(B, LLVMBuildFMul(B, p, s1, ""), s2, "");
  return LLVMBuildSelect(B, isnan, x, p, "");
}

LLVMValueRef cg_tanh(CgMod *m, LLVMValueRef x) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(x);
  if (t != m->t_f32) return cg_libm(m, "tanh", t, x);
  LLVMValueRef z = fintr1(m, "llvm.fabs", x);
  LLVMValueRef s = cg_exp(m, LLVMBuildFAdd(B, z, z, ""));
  LLVMValueRef big = LLVMBuildFSub(B, LLVMConstReal(t, 1),
                                   LLVMBuildFDiv(B, LLVMConstReal(t, 2), LLVMBuildFAdd(B, s, LLVMConstReal(t, 1), ""), ""), "");
  big = cg_intrinsic(m, "llvm.copysign", &t, 1, (LLVMValueRef[]){big, x}, 2);
  static const double c[] = {-3.33332819422E-1, 1.33314422036E-1, -5.37397155531E-2, 2.06390887954E-2,
                             -5.70498872745E-3};
  LLVMValueRef x2 = LLVMBuildFMul(B, x, x, "");
  LLVMValueRef small = fma_(m, LLVMBuildFMul(B, horner(m, x2, c, 5), x2, ""), x, x);
  return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGE, z, LLVMConstReal(t, 0.625), ""), big, small, "");
}

LLVMValueRef cg_erf(CgMod *m, LLVMValueRef x) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(x);
  if (t != m->t_f32) return cg_libm(m, "erf", t, x);
  /* |x| < 0.5: 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)) */
  static const double taylor[] = {1.1283791670955126,       -1.1283791670955126 / 3,  1.1283791670955126 / 10,
                                  -1.1283791670955126 / 42, 1.1283791670955126 / 216, -1.1283791670955126 / 1320,
                                  1.1283791670955126 / 9360};
  LLVMValueRef x2 = LLVMBuildFMul(B, x, x, "");
  LLVMValueRef small = LLVMBuildFMul(B, x, horner(m, x2, taylor, 7), "");
  /* above: 1 - erfc(|x|), erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2) */
  static const double nr[] = {-1.26551223, 1.00002368, 0.37409196,  0.09678418, -0.18628806,
                              0.27886807,  -1.13520398, 1.48851587, -0.82215223, 0.17087277};
  LLVMValueRef z = fintr1(m, "llvm.fabs", x);
  LLVMValueRef tt = LLVMBuildFDiv(B, LLVMConstReal(t, 1), fma_(m, z, LLVMConstReal(t, 0.5), LLVMConstReal(t, 1)), "");
  LLVMValueRef e = LLVMBuildFSub(B, horner(m, tt, nr, 10), x2, "");
  LLVMValueRef erfc = LLVMBuildFMul(B, tt, cg_exp(m, e), "");
  LLVMValueRef big = LLVMBuildFSub(B, LLVMConstReal(t, 1), erfc, "");
  big = cg_intrinsic(m, "llvm.copysign", &t, 1, (LLVMValueRef[]){big, x}, 2);
  return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, z, LLVMConstReal(t, 0.5), ""), small, big, "");
}

/* 1 / (1 + e^-x) without overflow: with e = exp(-|x|) it is 1/(1+e) for
 * x >= 0 and e/(1+e) below, the same split as the reference. */
static LLVMValueRef sigmoid(CgMod *m, LLVMValueRef x) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef one = LLVMConstReal(t, 1);
  LLVMValueRef e = cg_exp(m, LLVMBuildFNeg(B, fintr1(m, "llvm.fabs", x), ""));
  LLVMValueRef r = LLVMBuildFDiv(B, one, LLVMBuildFAdd(B, one, e, ""), "");
  LLVMValueRef ge = LLVMBuildFCmp(B, LLVMRealOGE, x, LLVMConstReal(t, 0), "");
  return LLVMBuildSelect(B, ge, r, LLVMBuildFMul(B, e, r, ""), "");
}

static LLVMValueRef gelu(CgMod *m, LLVMValueRef x, bool tanh_form) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(x);
  LLVMValueRef inner;
  if (tanh_form) {
    LLVMValueRef x3 = LLVMBuildFMul(B, LLVMBuildFMul(B, x, x, ""), x, "");
    LLVMValueRef u = LLVMBuildFAdd(B, x, LLVMBuildFMul(B, LLVMConstReal(t, 0.044715), x3, ""), "");
    inner = cg_tanh(m, LLVMBuildFMul(B, LLVMConstReal(t, 0.7978845608028654), u, ""));
  } else {
    inner = cg_erf(m, LLVMBuildFMul(B, x, LLVMConstReal(t, 0.7071067811865476), ""));
  }
  LLVMValueRef h = LLVMBuildFMul(B, LLVMConstReal(t, 0.5), x, "");
  return LLVMBuildFMul(B, h, LLVMBuildFAdd(B, LLVMConstReal(t, 1), inner, ""), "");
}

/* Saturating integer ops: the reference computes in double and clamps. */
static LLVMValueRef sat(CgMod *m, const char *name, LLVMValueRef a, LLVMValueRef b) {
  LLVMTypeRef t = LLVMTypeOf(a);
  LLVMValueRef args[2] = {a, b};
  return cg_intrinsic(m, name, &t, 1, args, 2);
}

LLVMValueRef cg_unary(CgMod *m, const Node *n, DType dt, LLVMValueRef x) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(x);
  Op op = n->op;
  if (op == OP_CAST) return cg_convert(m, x, dt, ir_attr(n, "to")->dt);
  if (!is_floatish(dt)) {
    /* neg, abs, relu are the ops defined on integers and bool */
    LLVMValueRef zero = LLVMConstInt(t, 0, 0);
    if (op == OP_SIGN) { /* (x > 0) - (x < 0) */
      bool sgn = dt != DT_BOOL && dt != DT_U8;
      LLVMValueRef gt = LLVMBuildICmp(B, sgn ? LLVMIntSGT : LLVMIntUGT, x, zero, "");
      LLVMValueRef lt = LLVMBuildICmp(B, LLVMIntSLT, x, zero, "");
      LLVMValueRef pos = LLVMBuildSelect(B, gt, LLVMConstInt(t, 1, 0), zero, "");
      return sgn ? LLVMBuildSelect(B, lt, LLVMConstInt(t, (unsigned long long)-1, 1), pos, "") : pos;
    }
    if (dt == DT_BOOL || dt == DT_U8) {
      if (op == OP_NEG && dt == DT_U8) return zero; /* -x saturates at 0 */
      return x;
    }
    LLVMValueRef neg = sat(m, "llvm.ssub.sat", zero, x);
    LLVMValueRef isneg = LLVMBuildICmp(B, LLVMIntSLT, x, zero, "");
    switch (op) {
    case OP_NEG: return neg;
    case OP_ABS: return LLVMBuildSelect(B, isneg, neg, x, "");
    case OP_RELU: return LLVMBuildSelect(B, isneg, zero, x, "");
    default:
      cg_fail(m, ST_INTERNAL, "%s on %s", ir_op_name(op), dt_name(dt));
      return x;
    }
  }
  LLVMValueRef one = LLVMConstReal(t, 1);
  switch (op) {
  case OP_NEG: return LLVMBuildFNeg(B, x, "");
  case OP_ABS: return fintr1(m, "llvm.fabs", x);
  case OP_EXP: return cg_exp(m, x);
  case OP_LOG: return fintr1(m, "llvm.log", x);
  case OP_SQRT: return fintr1(m, "llvm.sqrt", x);
  case OP_RSQRT: return LLVMBuildFDiv(B, one, fintr1(m, "llvm.sqrt", x), "");
  case OP_RECIPROCAL: return LLVMBuildFDiv(B, one, x, "");
  case OP_TANH: return cg_tanh(m, x);
  case OP_SIGMOID: return sigmoid(m, x);
  case OP_RELU: /* x < 0 ? 0 : x keeps NaN, like the reference */
    return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, x, LLVMConstReal(t, 0), ""), LLVMConstReal(t, 0), x, "");
  case OP_GELU: return gelu(m, x, strcmp(ir_attr_enum(n, "approximate"), "tanh") == 0);
  case OP_SILU: return LLVMBuildFMul(B, x, sigmoid(m, x), "");
  case OP_ERF: return cg_erf(m, x);
  case OP_SIN: return fintr1(m, "llvm.sin", x);
  case OP_COS: return fintr1(m, "llvm.cos", x);
  case OP_FLOOR: return fintr1(m, "llvm.floor", x);
  case OP_CEIL: return fintr1(m, "llvm.ceil", x);
  case OP_ROUND: return fintr1(m, "llvm.rint", x); /* ties to even in the default rounding mode */
  case OP_SIGN: {
    LLVMValueRef zero = LLVMConstReal(t, 0);
    LLVMValueRef neg = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOLT, x, zero, ""), LLVMConstReal(t, -1), x, "");
    return LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, x, zero, ""), one, neg, "");
  }
  default:
    cg_fail(m, ST_INTERNAL, "%s is not a unary operator", ir_op_name(op));
    return x;
  }
}

/* ---- binary ---- */

static LLVMValueRef bool_binary(CgMod *m, Op op, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  LLVMValueRef t1 = LLVMConstInt(m->t_i1, 1, 0);
  switch (op) {
  case OP_ADD: case OP_MAXIMUM: return LLVMBuildOr(B, a, b, "");
  case OP_SUB: return LLVMBuildXor(B, a, b, "");
  case OP_MUL: case OP_MINIMUM: return LLVMBuildAnd(B, a, b, "");
  case OP_DIV: return LLVMBuildOr(B, a, LLVMBuildXor(B, b, t1, ""), ""); /* x/0 is inf or NaN: true */
  case OP_LESS: return LLVMBuildICmp(B, LLVMIntULT, a, b, "");
  case OP_GREATER: return LLVMBuildICmp(B, LLVMIntUGT, a, b, "");
  case OP_EQUAL: return LLVMBuildICmp(B, LLVMIntEQ, a, b, "");
  default:
    cg_fail(m, ST_INTERNAL, "%s on bool", ir_op_name(op));
    return a;
  }
}

/* Integer division as the reference does it: trunc(x / y) in double, then
 * saturated, so x/0 is the largest value of x's sign and 0/0 is 0. */
static LLVMValueRef int_div(CgMod *m, DType dt, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  LLVMTypeRef t = LLVMTypeOf(a);
  int64_t lo, hi;
  int_range(dt, &lo, &hi);
  LLVMValueRef zero = LLVMConstInt(t, 0, 0), one = LLVMConstInt(t, 1, 0);
  LLVMValueRef cmax = LLVMConstInt(t, (unsigned long long)hi, 1), cmin = LLVMConstInt(t, (unsigned long long)lo, 1);
  LLVMValueRef bz = LLVMBuildICmp(B, LLVMIntEQ, b, zero, "");
  if (dt == DT_U8) {
    LLVMValueRef q = LLVMBuildUDiv(B, a, LLVMBuildSelect(B, bz, one, b, ""), "");
    LLVMValueRef inf = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntNE, a, zero, ""), cmax, zero, "");
    return LLVMBuildSelect(B, bz, inf, q, "");
  }
  LLVMValueRef ovf = LLVMBuildAnd(B, LLVMBuildICmp(B, LLVMIntEQ, a, cmin, ""),
                                  LLVMBuildICmp(B, LLVMIntEQ, b, LLVMConstInt(t, (unsigned long long)-1, 1), ""), "");
  LLVMValueRef safe = LLVMBuildSelect(B, LLVMBuildOr(B, bz, ovf, ""), one, b, "");
  LLVMValueRef q = LLVMBuildSDiv(B, a, safe, "");
  q = LLVMBuildSelect(B, ovf, cmax, q, "");
  LLVMValueRef inf = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSGT, a, zero, ""), cmax,
                                     LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, a, zero, ""), cmin, zero, ""), "");
  return LLVMBuildSelect(B, bz, inf, q, "");
}

static LLVMValueRef int_binary(CgMod *m, Op op, DType dt, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  bool u = dt == DT_U8;
  switch (op) {
  case OP_ADD: return sat(m, u ? "llvm.uadd.sat" : "llvm.sadd.sat", a, b);
  case OP_SUB: return sat(m, u ? "llvm.usub.sat" : "llvm.ssub.sat", a, b);
  case OP_MUL: {
    LLVMTypeRef t = LLVMTypeOf(a);
    LLVMValueRef args[3] = {a, b, cg_i32(m, 0)};
    return cg_intrinsic(m, u ? "llvm.umul.fix.sat" : "llvm.smul.fix.sat", &t, 1, args, 3);
  }
  case OP_DIV: return int_div(m, dt, a, b);
  case OP_MAXIMUM: return LLVMBuildSelect(B, LLVMBuildICmp(B, u ? LLVMIntUGT : LLVMIntSGT, a, b, ""), a, b, "");
  case OP_MINIMUM: return LLVMBuildSelect(B, LLVMBuildICmp(B, u ? LLVMIntULT : LLVMIntSLT, a, b, ""), a, b, "");
  case OP_LESS: return LLVMBuildICmp(B, u ? LLVMIntULT : LLVMIntSLT, a, b, "");
  case OP_GREATER: return LLVMBuildICmp(B, u ? LLVMIntUGT : LLVMIntSGT, a, b, "");
  case OP_EQUAL: return LLVMBuildICmp(B, LLVMIntEQ, a, b, "");
  default:
    cg_fail(m, ST_INTERNAL, "%s on %s", ir_op_name(op), dt_name(dt));
    return a;
  }
}

LLVMValueRef cg_binary(CgMod *m, Op op, DType dt, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  if (dt == DT_BOOL) return bool_binary(m, op, a, b);
  if (!is_floatish(dt)) return int_binary(m, op, dt, a, b);
  switch (op) {
  case OP_ADD: return LLVMBuildFAdd(B, a, b, "");
  case OP_SUB: return LLVMBuildFSub(B, a, b, "");
  case OP_MUL: return LLVMBuildFMul(B, a, b, "");
  case OP_DIV: return LLVMBuildFDiv(B, a, b, "");
  case OP_POW: {
    LLVMTypeRef t = LLVMTypeOf(a);
    LLVMValueRef args[2] = {a, b};
    return cg_intrinsic(m, "llvm.pow", &t, 1, args, 2);
  }
  case OP_MAXIMUM: return cg_fmax_nan(m, a, b);
  case OP_MINIMUM: return cg_fmin_nan(m, a, b);
  case OP_LESS: return LLVMBuildFCmp(B, LLVMRealOLT, a, b, "");
  case OP_GREATER: return LLVMBuildFCmp(B, LLVMRealOGT, a, b, "");
  case OP_EQUAL: return LLVMBuildFCmp(B, LLVMRealOEQ, a, b, "");
  default:
    cg_fail(m, ST_INTERNAL, "%s is not a binary operator", ir_op_name(op));
    return a;
  }
}

/* log2 n rounds of the perfect shuffle (vectors t and t + n/2 interleaved
 * into 2t and 2t + 1), each rotating the element index's bits by one. */
void cg_transpose_square(CgMod *m, LLVMValueRef *r, int n) {
  int h = n / 2;
  LLVMValueRef lo[16], hi[16];
  for (int i = 0; i < n; i++) {
    lo[i] = cg_i32(m, i / 2 + (i & 1) * n);
    hi[i] = cg_i32(m, h + i / 2 + (i & 1) * n);
  }
  LLVMValueRef mlo = LLVMConstVector(lo, (unsigned)n), mhi = LLVMConstVector(hi, (unsigned)n);
  for (int round = 1; round < n; round *= 2) {
    LLVMValueRef out[16];
    for (int t = 0; t < h; t++) {
      out[2 * t] = LLVMBuildShuffleVector(m->b, r[t], r[t + h], mlo, "");
      out[2 * t + 1] = LLVMBuildShuffleVector(m->b, r[t], r[t + h], mhi, "");
    }
    memcpy(r, out, sizeof(LLVMValueRef) * (size_t)n);
  }
}
