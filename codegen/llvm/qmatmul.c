/* The quantised matmuls of the CPU backend: y = x @ dequantize(Wq, S[, Z])
 * with the weight read packed (int8/uint8, int4/uint4 two per byte, fp8)
 * and dequantised in registers, never stored in float whole.
 *
 * From QMM_PANEL_ROWS output rows (prefill) the weight is dequantised a
 * panel at a time (NR columns by a chunk of k, on the stack) and the f32
 * GEMM's micro-kernel runs on it for a unit of up to 192 rows (gemm.c's
 * cg_gemm_panels; fill_panel below writes the panel): the dequantisation
 * is paid once per unit, not once per row.  [K, N] weights fill a panel
 * row (VL columns) per vector; [N, K] ones read VL k's of a column per
 * vector and transpose VL x VL tiles in registers.  Below that row count
 * (decode), the GEMV that follows, which reads each weight byte once per
 * row and no more:
 *
 * At decode (a few rows of x) a matmul is bound by the bytes of its weight;
 * int4 with groups of 128 reads ~1/7 of f32's.  The kernel:
 *   - tasks are cg_matmul_space's (lower.h): one output row and one block
 *     of CG_MM_COLS columns each when the rows are few, so M = 1 spreads
 *     its columns, and with them the weight's bytes, over the threads;
 *   - the task's row of x is read once, through cg_emit (so a fused
 *     prologue and f16 inputs work), into a float buffer on the stack;
 *   - the weight's elements are loaded VL at a time (VL = 16 lanes of f32
 *     with AVX-512, 8 with AVX/AVX2, else 4: the host's width, as gemm.c)
 *     and widened to float in registers: int8 by sign extension, uint8 by
 *     zero extension; int4 and uint4 by loading VL/2 bytes, splitting low
 *     and high nibbles and interleaving them (element 2i is the low nibble
 *     of byte i, ir/dtype.h), then for int4 (v ^ 8) - 8 for the sign; fp8
 *     by moving exponent and mantissa into float's place (exponent
 *     rebiased, subnormal codes m * 2^(1-bias-M) exactly, NaN and the sign
 *     bit restored);
 *   - scales are applied once per group, not per element: for each group
 *     of G elements along K the products x[k] * q[k, n] are summed into a
 *     partial vector, which is then multiplied by the group's scales and
 *     added to the accumulator.  This is the reference's arithmetic
 *     reassociated (sum_k x_k q_k s = s sum_k x_k q_k): the results agree
 *     to f32 rounding, and the dequantised weight is not rounded to its
 *     f16/bf16 `to` dtype as the reference's stored dequantize is (the
 *     kernel is the more exact of the two; the difference is within the
 *     output's own rounding in f16, about one step in bf16);
 *   - zero points (asymmetric int4 as GPTQ, AWQ and ONNX MatMulNBits make
 *     it: u4 codes with a u4 zero per group) are applied once per group
 *     too, through the row's group sums of x (xsum, computed with the row):
 *       sum_k x_k (q_k - z) s = s (sum_k x_k q_k - z sum_k x_k),
 *     so the inner loop is the symmetric one.  z is of the qweight's dtype
 *     (i8, u8, i4, u4: read element by element, so a row of [N, K/G] u4
 *     zeros may start mid-byte) or of the scales' float dtype, as
 *     dequantize allows.  The subtraction cancels about log2(mean |q| /
 *     spread of q - z) bits, one or two for codes centred on their zero,
 *     well inside f32's 24 (tests/unit/test_llvm_quant.c sees the same
 *     relative error, ~2e-7, as without zero points);
 *   - [K, N] weights (the YAML layout; dequantize axis 0): per k, the VL
 *     consecutive columns of a vector; four vectors (4 VL columns) of
 *     independent accumulators per pass over K, then single vectors, then
 *     leftover columns one by one through the generic element-wise
 *     dequantize;
 *   - [N, K] weights (transpose_b, axis 1; Hugging Face's layout and the
 *     importers'): each output column is a dot product along K; four
 *     columns at once share the x vector, each sums VL lanes, reduced at
 *     the end, less the column's zero-point term (a scalar per column);
 *   - the block's outputs go through a stack tile to the epilogue (bias,
 *     activation, residual: cg_store_epilogue), as in gemm.c.
 * Not taken here (the generic loop nest dequantises element by element):
 * zero points of fp8 weights, more than QMM_MAX_GROUPS groups along K
 * with zero points (their sums of x are on the stack), f16 scales or zero
 * points without hardware conversion, weights, scales or zero points the
 * kernel does not receive as arguments, A transposed or 1-D, batched or
 * broadcast weights, K over QMM_MAX_K (the row buffer), a K or group that
 * is not a multiple of VL for [N, K], an odd N for 4-bit [K, N].
 */
#include <math.h>
#include <string.h>

#include <llvm-c/TargetMachine.h>

#include "codegen/llvm/gemm.h"
#include "codegen/llvm/qmatmul.h"

#define QMM_MAX_K 16384 /* floats of the row buffer: 64 KiB of the worker's stack */
#define QMM_VECS 4      /* vectors (or columns) of accumulators per pass over K */
#define QMM_MAX_TILE 256
#define QMM_MAX_GROUPS (QMM_MAX_K / 8) /* floats of the group sums of x: 8 KiB of stack */
/* output rows from which the weight is dequantised a panel at a time for
 * blocks of rows (gemm.c's cg_gemm_panels) instead of once per row */
#define QMM_PANEL_ROWS 5

typedef struct {
  CgFn *f;
  CgMod *m;
  LLVMBuilderRef B;
  const Node *mm, *dq;
  int av, bv, qarg, sarg, zarg; /* zarg: the zero points' argument, -1 without */
  DType qdt, sdt, zdt;
  bool tb; /* [N, K] weight */
  int64_t K, N, G, ng;
  int vl;
  LLVMTypeRef vf, vi;  /* <vl x float>, <vl x i32> */
  LLVMValueRef xrow;   /* float[K]: the task's row of A (de-interleaved when split) */
  LLVMValueRef xsum;   /* float[ng]: its sum over each group (when corr) */
  bool split;          /* 4-bit [N, K]: even and odd k apart, nibbles unsigned (see nk_split) */
  double zbias;        /* what the split path's codes exceed the qweight's by: 8 for int4, else 0 */
  bool corr;           /* a zero-point term per group: zero points, or zbias != 0 */
  LLVMValueRef tile;   /* float[tile]: the block's outputs before the epilogue */
  LLVMValueRef acc[QMM_VECS], part[QMM_VECS]; /* <vl x float> allocas */
} Qmm;

/* ---- vector helpers ---- */

static LLVMValueRef vconst_i32(Qmm *q, int64_t v) {
  LLVMValueRef e[16];
  for (int i = 0; i < q->vl; i++) e[i] = LLVMConstInt(q->m->t_i32, (unsigned long long)v, 1);
  return LLVMConstVector(e, (unsigned)q->vl);
}

static LLVMValueRef vconst_f32(Qmm *q, double v) {
  LLVMValueRef e[16];
  for (int i = 0; i < q->vl; i++) e[i] = LLVMConstReal(q->m->t_f32, v);
  return LLVMConstVector(e, (unsigned)q->vl);
}

static LLVMValueRef splat(Qmm *q, LLVMValueRef x) {
  LLVMValueRef v = LLVMBuildInsertElement(q->B, LLVMGetUndef(q->vf), x, cg_i32(q->m, 0), "");
  LLVMValueRef zeros = LLVMConstNull(LLVMVectorType(q->m->t_i32, (unsigned)q->vl));
  return LLVMBuildShuffleVector(q->B, v, LLVMGetUndef(q->vf), zeros, "");
}

/* n elements of type elt at base[idx], as one vector load. */
static LLVMValueRef load_vec(Qmm *q, LLVMTypeRef elt, int n, LLVMValueRef base, LLVMValueRef idx, unsigned align) {
  LLVMTypeRef vt = LLVMVectorType(elt, (unsigned)n);
  LLVMValueRef p = LLVMBuildInBoundsGEP2(q->B, elt, base, &idx, 1, "");
  p = LLVMBuildBitCast(q->B, p, LLVMPointerType(vt, 0), "");
  LLVMValueRef v = LLVMBuildLoad2(q->B, vt, p, "");
  LLVMSetAlignment(v, align);
  return v;
}

static LLVMValueRef fmadd(Qmm *q, LLVMValueRef a, LLVMValueRef b, LLVMValueRef c) {
  LLVMTypeRef t = LLVMTypeOf(a);
  LLVMValueRef args[3] = {a, b, c};
  return cg_intrinsic(q->m, "llvm.fmuladd", &t, 1, args, 3);
}

/* FP8 codes (zero-extended to <vl x i32>) to float: see the top. */
static LLVMValueRef f8_vec(Qmm *q, LLVMValueRef b) {
  LLVMBuilderRef B = q->B;
  bool e5 = q->qdt == DT_F8E5M2;
  int M = e5 ? 2 : 3, bias = e5 ? 15 : 7;
  LLVMValueRef mag = LLVMBuildAnd(B, b, vconst_i32(q, 0x7f), "");
  LLVMValueRef e = LLVMBuildLShr(B, mag, vconst_i32(q, M), "");
  LLVMValueRef man = LLVMBuildAnd(B, mag, vconst_i32(q, (1 << M) - 1), "");
  LLVMValueRef normal = LLVMBuildAdd(B, LLVMBuildShl(B, mag, vconst_i32(q, 23 - M), ""),
                                     vconst_i32(q, (int64_t)(127 - bias) << 23), "");
  LLVMValueRef sub = LLVMBuildFMul(B, LLVMBuildSIToFP(B, man, q->vf, ""), vconst_f32(q, ldexp(1.0, 1 - bias - M)), "");
  LLVMValueRef is_sub = LLVMBuildICmp(B, LLVMIntEQ, e, vconst_i32(q, 0), "");
  LLVMValueRef v = LLVMBuildSelect(B, is_sub, sub, LLVMBuildBitCast(B, normal, q->vf, ""), "");
  if (e5) {
    LLVMValueRef top = LLVMBuildICmp(B, LLVMIntEQ, e, vconst_i32(q, 31), "");
    LLVMValueRef special = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, man, vconst_i32(q, 0), ""),
                                           vconst_f32(q, INFINITY), vconst_f32(q, NAN), "");
    v = LLVMBuildSelect(B, top, special, v, "");
  } else {
    v = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntEQ, mag, vconst_i32(q, 0x7f), ""), vconst_f32(q, NAN), v, "");
  }
  LLVMValueRef sign = LLVMBuildShl(B, LLVMBuildAnd(B, b, vconst_i32(q, 0x80), ""), vconst_i32(q, 24), "");
  return LLVMBuildBitCast(B, LLVMBuildOr(B, LLVMBuildBitCast(B, v, q->vi, ""), sign, ""), q->vf, "");
}

/* With a hardware f16 conversion (F16C): e5m2 is the top byte of an f16,
 * and e4m3's exponent and mantissa bits shifted into f16's place are an
 * f16 of 2^-8 times the value (bias 15 against 7; subnormal codes land on
 * f16 subnormals, converted exactly), so the scale is applied as 256 times
 * it (f8_scale).  The e4m3 NaN code gives 480 there: it is put back. */
static LLVMValueRef vconst_i16(Qmm *q, int v) {
  LLVMValueRef e[16];
  for (int i = 0; i < q->vl; i++) e[i] = LLVMConstInt(q->m->t_i16, (unsigned long long)v, 0);
  return LLVMConstVector(e, (unsigned)q->vl);
}

static LLVMValueRef f8_via_f16(Qmm *q, LLVMValueRef bytes) {
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  LLVMValueRef w = LLVMBuildZExt(B, bytes, LLVMVectorType(m->t_i16, (unsigned)q->vl), "");
  LLVMValueRef h;
  if (q->qdt == DT_F8E5M2) {
    h = LLVMBuildShl(B, w, vconst_i16(q, 8), "");
  } else {
    LLVMValueRef mag = LLVMBuildShl(B, LLVMBuildAnd(B, w, vconst_i16(q, 0x7f), ""), vconst_i16(q, 7), "");
    LLVMValueRef sign = LLVMBuildShl(B, LLVMBuildAnd(B, w, vconst_i16(q, 0x80), ""), vconst_i16(q, 8), "");
    h = LLVMBuildOr(B, mag, sign, "");
  }
  LLVMValueRef v = LLVMBuildFPExt(B, LLVMBuildBitCast(B, h, LLVMVectorType(m->t_f16, (unsigned)q->vl), ""), q->vf, "");
  if (q->qdt == DT_F8E4M3) {
    LLVMValueRef nan = LLVMBuildICmp(B, LLVMIntEQ, LLVMBuildAnd(B, w, vconst_i16(q, 0x7f), ""), vconst_i16(q, 0x7f), "");
    v = LLVMBuildSelect(B, nan, vconst_f32(q, NAN), v, "");
  }
  return v;
}

/* What the scales are multiplied by for the values qvals gives: 256 for
 * e4m3 through f16 (f8_via_f16), else 1. */
static double f8_scale(const Qmm *q) { return q->qdt == DT_F8E4M3 && q->m->native_f16 ? 256.0 : 1.0; }

/* vl consecutive integer codes (i8, u8, i4, u4) of argument arg from
 * element lin (even for 4-bit), as floats. */
static LLVMValueRef ivals(Qmm *q, int arg, DType dt, LLVMValueRef lin) {
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  LLVMValueRef base = q->f->base[arg];
  switch (dt) {
  case DT_I8: return LLVMBuildSIToFP(B, load_vec(q, m->t_i8, q->vl, base, lin, 1), q->vf, "");
  case DT_U8: return LLVMBuildUIToFP(B, load_vec(q, m->t_i8, q->vl, base, lin, 1), q->vf, "");
  default: { /* i4, u4 */
    int h = q->vl / 2;
    LLVMTypeRef hi32 = LLVMVectorType(m->t_i32, (unsigned)h);
    LLVMValueRef bytes = LLVMBuildZExt(B, load_vec(q, m->t_i8, h, base, LLVMBuildLShr(B, lin, cg_i64(m, 1), ""), 1), hi32, "");
    LLVMValueRef e15[8], e4[8], mask[16];
    for (int i = 0; i < h; i++) {
      e15[i] = LLVMConstInt(m->t_i32, 15, 0);
      e4[i] = LLVMConstInt(m->t_i32, 4, 0);
    }
    LLVMValueRef lo = LLVMBuildAnd(B, bytes, LLVMConstVector(e15, (unsigned)h), "");
    LLVMValueRef hi = LLVMBuildLShr(B, bytes, LLVMConstVector(e4, (unsigned)h), "");
    for (int i = 0; i < q->vl; i++) mask[i] = cg_i32(m, (i & 1) ? h + i / 2 : i / 2);
    LLVMValueRef v = LLVMBuildShuffleVector(B, lo, hi, LLVMConstVector(mask, (unsigned)q->vl), "");
    if (dt == DT_I4) v = LLVMBuildSub(B, LLVMBuildXor(B, v, vconst_i32(q, 8), ""), vconst_i32(q, 8), "");
    return LLVMBuildSIToFP(B, v, q->vf, "");
  }
  }
}

/* The quantised values of vl consecutive elements from element lin (even
 * for 4-bit), as floats (not yet scaled). */
static LLVMValueRef qvals(Qmm *q, LLVMValueRef lin) {
  if (!dt_is_f8(q->qdt)) return ivals(q, q->qarg, q->qdt, lin);
  LLVMValueRef bytes = load_vec(q, q->m->t_i8, q->vl, q->f->base[q->qarg], lin, 1);
  if (q->m->native_f16) return f8_via_f16(q, bytes);
  return f8_vec(q, LLVMBuildZExt(q->B, bytes, q->vi, ""));
}

/* vl consecutive floats (f32, f16, bf16) of argument arg from element lin. */
static LLVMValueRef fvals(Qmm *q, int arg, DType dt, LLVMValueRef lin) {
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  LLVMValueRef base = q->f->base[arg];
  switch (dt) {
  case DT_F32: return load_vec(q, m->t_f32, q->vl, base, lin, 4);
  case DT_F16: return LLVMBuildFPExt(B, load_vec(q, m->t_f16, q->vl, base, lin, 2), q->vf, "");
  default: { /* bf16: the top half of an f32 */
    LLVMValueRef w = LLVMBuildZExt(B, load_vec(q, m->t_i16, q->vl, base, lin, 2), q->vi, "");
    return LLVMBuildBitCast(B, LLVMBuildShl(B, w, vconst_i32(q, 16), ""), q->vf, "");
  }
  }
}

static LLVMValueRef svals(Qmm *q, LLVMValueRef lin) { return fvals(q, q->sarg, q->sdt, lin); }

/* vl consecutive zero points from element lin (even for 4-bit), as floats. */
static LLVMValueRef zvals(Qmm *q, LLVMValueRef lin) {
  return dt_is_float(q->zdt) ? fvals(q, q->zarg, q->zdt, lin) : ivals(q, q->zarg, q->zdt, lin);
}

/* The zero point at element lin as a float, plus zbias (the split path's
 * offset of its codes); 0 + zbias without zero points. */
static LLVMValueRef zero_at(Qmm *q, LLVMValueRef lin) {
  CgMod *m = q->m;
  if (q->zarg < 0) return LLVMConstReal(m->t_f32, q->zbias);
  LLVMValueRef z = cg_convert(m, cg_load_arg(q->f, q->zarg, lin), q->zdt, DT_F32);
  return q->zbias != 0 ? LLVMBuildFAdd(q->B, z, LLVMConstReal(m->t_f32, q->zbias), "") : z;
}

static LLVMValueRef vload(Qmm *q, LLVMValueRef slot) { return LLVMBuildLoad2(q->B, q->vf, slot, ""); }
static void vstore(Qmm *q, LLVMValueRef v, LLVMValueRef slot) { LLVMBuildStore(q->B, v, slot); }

static LLVMValueRef fslot(Qmm *q, LLVMValueRef buf, LLVMValueRef i) {
  return LLVMBuildInBoundsGEP2(q->B, q->m->t_f32, buf, &i, 1, "");
}

/* ---- [K, N]: VL columns a vector ---- */

/* nv vectors of columns from c0 (of the tile starting at n0): per group,
 * partial sums of x[k] * q[k, :], less the zero points times the group's
 * sum of x, then times the group's scales. */
static void kn_columns(Qmm *q, int nv, LLVMValueRef c0, LLVMValueRef n0) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  for (int j = 0; j < nv; j++) vstore(q, vconst_f32(q, 0), q->acc[j]);
  CgLoop lg, lk;
  LLVMValueRef gi = cg_loop_begin(f, &lg, cg_i64(m, 0), cg_i64(m, q->ng), "group");
  for (int j = 0; j < nv; j++) vstore(q, vconst_f32(q, 0), q->part[j]);
  LLVMValueRef k0 = cg_mulc(f, gi, q->G);
  LLVMValueRef k = cg_loop_begin(f, &lk, k0, cg_add(f, k0, cg_i64(m, q->G)), "k");
  LLVMValueRef xk = splat(q, LLVMBuildLoad2(q->B, m->t_f32, fslot(q, q->xrow, k), ""));
  LLVMValueRef row = cg_add(f, cg_mulc(f, k, q->N), c0);
  for (int j = 0; j < nv; j++) {
    LLVMValueRef w = qvals(q, cg_add(f, row, cg_i64(m, (int64_t)j * q->vl)));
    vstore(q, fmadd(q, xk, w, vload(q, q->part[j])), q->part[j]);
  }
  cg_loop_end(f, &lk, false);
  LLVMValueRef srow = cg_add(f, cg_mulc(f, gi, q->N), c0), nxs = NULL;
  if (q->corr) nxs = splat(q, LLVMBuildFNeg(q->B, LLVMBuildLoad2(q->B, m->t_f32, fslot(q, q->xsum, gi), ""), ""));
  for (int j = 0; j < nv; j++) {
    LLVMValueRef lin = cg_add(f, srow, cg_i64(m, (int64_t)j * q->vl));
    LLVMValueRef s = svals(q, lin), p = vload(q, q->part[j]);
    if (f8_scale(q) != 1.0) s = LLVMBuildFMul(q->B, s, vconst_f32(q, f8_scale(q)), "");
    if (nxs) p = fmadd(q, zvals(q, lin), nxs, p);
    vstore(q, fmadd(q, p, s, vload(q, q->acc[j])), q->acc[j]);
  }
  cg_loop_end(f, &lg, false);
  LLVMValueRef off = LLVMBuildNSWSub(q->B, c0, n0, "");
  for (int j = 0; j < nv; j++) {
    LLVMValueRef p = fslot(q, q->tile, cg_add(f, off, cg_i64(m, (int64_t)j * q->vl)));
    p = LLVMBuildBitCast(q->B, p, LLVMPointerType(q->vf, 0), "");
    LLVMSetAlignment(LLVMBuildStore(q->B, vload(q, q->acc[j]), p), 4);
  }
}

/* One column n the generic way: the dequantize member emitted element by
 * element (leftover columns, fewer than VL). */
static void scalar_column(Qmm *q, LLVMValueRef n, LLVMValueRef n0) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMValueRef sum = cg_alloca(f, m->t_f32, 1, "sum");
  LLVMBuildStore(q->B, LLVMConstReal(m->t_f32, 0), sum);
  CgLoop lk;
  LLVMValueRef k = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, q->K), "k");
  LLVMValueRef bc[2] = {q->tb ? n : k, q->tb ? k : n};
  LLVMValueRef w = cg_emit(f, q->bv, bc);
  LLVMValueRef x = LLVMBuildLoad2(q->B, m->t_f32, fslot(q, q->xrow, k), "");
  LLVMTypeRef t = m->t_f32;
  LLVMValueRef args[3] = {x, w, LLVMBuildLoad2(q->B, t, sum, "")};
  LLVMBuildStore(q->B, cg_intrinsic(m, "llvm.fmuladd", &t, 1, args, 3), sum);
  cg_loop_end(f, &lk, false);
  LLVMBuildStore(q->B, LLVMBuildLoad2(q->B, t, sum, ""), fslot(q, q->tile, LLVMBuildNSWSub(q->B, n, n0, "")));
}

static void kn_tile(Qmm *q, LLVMValueRef n0, LLVMValueRef n1) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  int64_t wide = (int64_t)QMM_VECS * q->vl;
  LLVMValueRef width = LLVMBuildNSWSub(B, n1, n0, "");
  LLVMValueRef nwide = LLVMBuildUDiv(B, width, cg_i64(m, wide), "");
  CgLoop l;
  LLVMValueRef i = cg_loop_begin(f, &l, cg_i64(m, 0), nwide, "wide");
  kn_columns(q, QMM_VECS, cg_add(f, n0, cg_mulc(f, i, wide)), n0);
  cg_loop_end(f, &l, false);
  LLVMValueRef done = cg_add(f, n0, cg_mulc(f, nwide, wide));
  LLVMValueRef nsingle = LLVMBuildUDiv(B, LLVMBuildNSWSub(B, n1, done, ""), cg_i64(m, q->vl), "");
  i = cg_loop_begin(f, &l, cg_i64(m, 0), nsingle, "vec");
  kn_columns(q, 1, cg_add(f, done, cg_mulc(f, i, q->vl)), n0);
  cg_loop_end(f, &l, false);
  done = cg_add(f, done, cg_mulc(f, nsingle, q->vl));
  LLVMValueRef n = cg_loop_begin(f, &l, done, n1, "col");
  scalar_column(q, n, n0);
  cg_loop_end(f, &l, false);
}

/* ---- [N, K]: a dot product a column ---- */

static LLVMValueRef hsum(Qmm *q, LLVMValueRef v) {
  LLVMValueRef s = LLVMBuildExtractElement(q->B, v, cg_i32(q->m, 0), "");
  for (int i = 1; i < q->vl; i++) s = LLVMBuildFAdd(q->B, s, LLVMBuildExtractElement(q->B, v, cg_i32(q->m, i), ""), "");
  return s;
}

/* The end of group gi for nc columns from c: acc[j] += part[j] * s, and
 * with a zero-point term corr[j] += s (z + zbias) xsum[gi], which the
 * column's result subtracts (nk_store). */
static void nk_group_end(Qmm *q, int nc, LLVMValueRef c, LLVMValueRef gi, LLVMValueRef *corr) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  LLVMTypeRef t = m->t_f32;
  LLVMValueRef xs = q->corr ? LLVMBuildLoad2(B, t, fslot(q, q->xsum, gi), "") : NULL;
  for (int j = 0; j < nc; j++) {
    LLVMValueRef lin = cg_add(f, cg_mulc(f, cg_add(f, c, cg_i64(m, j)), q->ng), gi);
    LLVMValueRef sc = cg_load_arg(f, q->sarg, lin);
    if (f8_scale(q) != 1.0) sc = LLVMBuildFMul(B, sc, LLVMConstReal(t, f8_scale(q)), "");
    vstore(q, fmadd(q, vload(q, q->part[j]), splat(q, sc), vload(q, q->acc[j])), q->acc[j]);
    if (!q->corr) continue;
    LLVMValueRef args[3] = {LLVMBuildFMul(B, sc, zero_at(q, lin), ""), xs, LLVMBuildLoad2(B, t, corr[j], "")};
    LLVMBuildStore(B, cg_intrinsic(m, "llvm.fmuladd", &t, 1, args, 3), corr[j]);
  }
}

/* Starts nc columns: accumulators and zero-point terms at 0. */
static void nk_start(Qmm *q, int nc, LLVMValueRef *corr) {
  for (int j = 0; j < nc; j++) {
    vstore(q, vconst_f32(q, 0), q->acc[j]);
    if (q->corr) LLVMBuildStore(q->B, LLVMConstReal(q->m->t_f32, 0), corr[j]);
  }
}

/* The nc columns' results into the tile: the lanes' sum less the
 * zero-point term. */
static void nk_store(Qmm *q, int nc, LLVMValueRef c, LLVMValueRef n0, LLVMValueRef *corr) {
  CgFn *f = q->f;
  LLVMBuilderRef B = q->B;
  for (int j = 0; j < nc; j++) {
    LLVMValueRef off = LLVMBuildNSWSub(B, cg_add(f, c, cg_i64(q->m, j)), n0, "");
    LLVMValueRef y = hsum(q, vload(q, q->acc[j]));
    if (q->corr) y = LLVMBuildFSub(B, y, LLVMBuildLoad2(B, q->m->t_f32, corr[j], ""), "");
    LLVMBuildStore(B, y, fslot(q, q->tile, off));
  }
}

/* nc columns from c (of the tile starting at n0). */
static void nk_columns(Qmm *q, int nc, LLVMValueRef c, LLVMValueRef n0, LLVMValueRef *corr) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  nk_start(q, nc, corr);
  CgLoop lg, lk;
  LLVMValueRef gi = cg_loop_begin(f, &lg, cg_i64(m, 0), cg_i64(m, q->ng), "group");
  for (int j = 0; j < nc; j++) vstore(q, vconst_f32(q, 0), q->part[j]);
  LLVMValueRef kv = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, q->G / q->vl), "kv");
  LLVMValueRef k = cg_add(f, cg_mulc(f, gi, q->G), cg_mulc(f, kv, q->vl));
  LLVMValueRef x = load_vec(q, m->t_f32, q->vl, q->xrow, k, 4);
  for (int j = 0; j < nc; j++) {
    LLVMValueRef col = cg_add(f, c, cg_i64(m, j));
    LLVMValueRef w = qvals(q, cg_add(f, cg_mulc(f, col, q->K), k));
    vstore(q, fmadd(q, x, w, vload(q, q->part[j])), q->part[j]);
  }
  cg_loop_end(f, &lk, false);
  nk_group_end(q, nc, c, gi, corr);
  cg_loop_end(f, &lg, false);
  nk_store(q, nc, c, n0, corr);
}

/* 4-bit [N, K] with groups of a multiple of 2 VL: VL bytes hold 2 VL
 * consecutive k's, the low nibbles the even ones and the high nibbles the
 * odd ones, so x is staged with each block of 2 VL de-interleaved (evens,
 * then odds) and the nibbles need no shuffle.  They are taken unsigned:
 * for u4 the nibble is the value; for i4, u = nibble ^ 8 is the value
 * plus 8 (zbias), and per group
 *   sum_k x_k (u_k - 8 - z) s = s (sum_k x_k u_k) - (z + 8) s sum_k x_k,
 * the second term as a zero point's (nk_group_end). */
static void nk_split_columns(Qmm *q, int nc, LLVMValueRef c, LLVMValueRef n0, LLVMValueRef *corr) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  LLVMTypeRef t = m->t_f32;
  nk_start(q, nc, corr);
  LLVMValueRef x88[16], x15[16], x4[16];
  for (int i = 0; i < q->vl; i++) {
    x88[i] = LLVMConstInt(m->t_i8, 0x88, 0);
    x15[i] = LLVMConstInt(m->t_i32, 15, 0);
    x4[i] = LLVMConstInt(m->t_i32, 4, 0);
  }
  LLVMValueRef c88 = LLVMConstVector(x88, (unsigned)q->vl), c15 = LLVMConstVector(x15, (unsigned)q->vl);
  LLVMValueRef c4 = LLVMConstVector(x4, (unsigned)q->vl);
  CgLoop lg, lk;
  LLVMValueRef gi = cg_loop_begin(f, &lg, cg_i64(m, 0), cg_i64(m, q->ng), "group");
  for (int j = 0; j < nc; j++) vstore(q, vconst_f32(q, 0), q->part[j]);
  LLVMValueRef kv = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, q->G / (2 * q->vl)), "kv");
  LLVMValueRef k = cg_add(f, cg_mulc(f, gi, q->G), cg_mulc(f, kv, 2 * q->vl));
  LLVMValueRef xe = load_vec(q, t, q->vl, q->xrow, k, 4);
  LLVMValueRef xo = load_vec(q, t, q->vl, q->xrow, cg_add(f, k, cg_i64(m, q->vl)), 4);
  for (int j = 0; j < nc; j++) {
    LLVMValueRef col = cg_add(f, c, cg_i64(m, j));
    LLVMValueRef byte = LLVMBuildLShr(B, cg_add(f, cg_mulc(f, col, q->K), k), cg_i64(m, 1), "");
    LLVMValueRef b8 = load_vec(q, m->t_i8, q->vl, q->f->base[q->qarg], byte, 1);
    if (q->qdt == DT_I4) b8 = LLVMBuildXor(B, b8, c88, "");
    LLVMValueRef w = LLVMBuildZExt(B, b8, q->vi, "");
    LLVMValueRef lo = LLVMBuildUIToFP(B, LLVMBuildAnd(B, w, c15, ""), q->vf, "");
    LLVMValueRef hi = LLVMBuildUIToFP(B, LLVMBuildLShr(B, w, c4, ""), q->vf, "");
    LLVMValueRef p = fmadd(q, xe, lo, vload(q, q->part[j]));
    vstore(q, fmadd(q, xo, hi, p), q->part[j]);
  }
  cg_loop_end(f, &lk, false);
  nk_group_end(q, nc, c, gi, corr);
  cg_loop_end(f, &lg, false);
  nk_store(q, nc, c, n0, corr);
}

static void nk_tile(Qmm *q, LLVMValueRef n0, LLVMValueRef n1) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMValueRef nwide = LLVMBuildUDiv(q->B, LLVMBuildNSWSub(q->B, n1, n0, ""), cg_i64(m, QMM_VECS), "");
  LLVMValueRef corr[QMM_VECS] = {0};
  for (int j = 0; j < QMM_VECS && q->corr; j++) corr[j] = cg_alloca(f, m->t_f32, 1, "corr");
  CgLoop l;
  LLVMValueRef i = cg_loop_begin(f, &l, cg_i64(m, 0), nwide, "cols");
  if (q->split) nk_split_columns(q, QMM_VECS, cg_add(f, n0, cg_mulc(f, i, QMM_VECS)), n0, corr);
  else nk_columns(q, QMM_VECS, cg_add(f, n0, cg_mulc(f, i, QMM_VECS)), n0, corr);
  cg_loop_end(f, &l, false);
  LLVMValueRef n = cg_loop_begin(f, &l, cg_add(f, n0, cg_mulc(f, nwide, QMM_VECS)), n1, "col");
  if (q->split) nk_split_columns(q, 1, n, n0, corr);
  else nk_columns(q, 1, n, n0, corr);
  cg_loop_end(f, &l, false);
}

/* ---- many rows: the weight dequantised a panel at a time (gemm.c) ---- */

typedef struct {
  CgPanelSource src; /* first: fill gets &src */
  Qmm *q;
} QPanels;

/* panel[(k - k0) * nr + j] = B[k][col0 + j] for a panel inside the
 * weight: per k (or per VL k's of a column for [N, K]) a vector of codes,
 * less the zero points, times the scales, as the reference's dequantize
 * computes it in f32.  [N, K]'s vectors run along k, so their lanes are
 * stored nr floats apart. */
static void fill_vectors(Qmm *q, LLVMValueRef panel, LLVMValueRef col0, LLVMValueRef k0, LLVMValueRef k1, int nr) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  double f8s = f8_scale(q);
  CgLoop lk, lj;
  if (!q->tb) {
    LLVMValueRef k = cg_loop_begin(f, &lk, k0, k1, "pk");
    LLVMValueRef g = LLVMBuildUDiv(B, k, cg_i64(m, q->G), "");
    LLVMValueRef dst = cg_mulc(f, LLVMBuildNSWSub(B, k, k0, ""), nr);
    for (int v = 0; v < nr / q->vl; v++) {
      LLVMValueRef col = cg_add(f, col0, cg_i64(m, (int64_t)v * q->vl));
      LLVMValueRef w = qvals(q, cg_add(f, cg_mulc(f, k, q->N), col));
      LLVMValueRef gl = cg_add(f, cg_mulc(f, g, q->N), col);
      if (q->zarg >= 0) w = LLVMBuildFSub(B, w, zvals(q, gl), "");
      LLVMValueRef sc = svals(q, gl);
      if (f8s != 1.0) sc = LLVMBuildFMul(B, sc, vconst_f32(q, f8s), "");
      LLVMValueRef p = fslot(q, panel, cg_add(f, dst, cg_i64(m, (int64_t)v * q->vl)));
      LLVMSetAlignment(LLVMBuildStore(B, LLVMBuildFMul(B, w, sc, ""), LLVMBuildBitCast(B, p, LLVMPointerType(q->vf, 0), "")), 4);
    }
    cg_loop_end(f, &lk, false);
    return;
  }
  /* [N, K]: VL columns at a time, a vector of VL k's each, transposed in
   * registers so that the panel's rows are stored as vectors */
  int vl = q->vl;
  LLVMValueRef jb = cg_loop_begin(f, &lj, cg_i64(m, 0), cg_i64(m, nr / vl), "pjb");
  LLVMValueRef nvec = LLVMBuildUDiv(B, LLVMBuildNSWSub(B, k1, k0, ""), cg_i64(m, vl), "");
  LLVMValueRef kv = cg_loop_begin(f, &lk, cg_i64(m, 0), nvec, "pkv");
  LLVMValueRef k = cg_add(f, k0, cg_mulc(f, kv, vl));
  LLVMValueRef g = LLVMBuildUDiv(B, k, cg_i64(m, q->G), "");
  LLVMValueRef r[16];
  for (int c = 0; c < vl; c++) {
    LLVMValueRef col = cg_add(f, col0, cg_add(f, cg_mulc(f, jb, vl), cg_i64(m, c)));
    LLVMValueRef w = qvals(q, cg_add(f, cg_mulc(f, col, q->K), k));
    LLVMValueRef gl = cg_add(f, cg_mulc(f, col, q->ng), g);
    if (q->zarg >= 0) w = LLVMBuildFSub(B, w, splat(q, zero_at(q, gl)), "");
    LLVMValueRef sc = cg_load_arg(f, q->sarg, gl);
    if (f8s != 1.0) sc = LLVMBuildFMul(B, sc, LLVMConstReal(m->t_f32, f8s), "");
    r[c] = LLVMBuildFMul(B, w, splat(q, sc), "");
  }
  cg_transpose_square(q->m, r, vl);
  LLVMValueRef dst = cg_add(f, cg_mulc(f, cg_mulc(f, kv, vl), nr), cg_mulc(f, jb, vl));
  for (int i = 0; i < vl; i++) {
    LLVMValueRef p = fslot(q, panel, cg_add(f, dst, cg_i64(m, (int64_t)i * nr)));
    LLVMSetAlignment(LLVMBuildStore(B, r[i], LLVMBuildBitCast(B, p, LLVMPointerType(q->vf, 0), "")), 4);
  }
  cg_loop_end(f, &lk, false);
  cg_loop_end(f, &lj, false);
}

/* The last panel, past N in part: the valid columns element by element
 * through the dequantize member (cg_emit), the rest 0. */
static void fill_scalar(Qmm *q, LLVMValueRef panel, LLVMValueRef col0, LLVMValueRef k0, LLVMValueRef k1, int nr) {
  CgFn *f = q->f;
  CgMod *m = q->m;
  LLVMBuilderRef B = q->B;
  LLVMValueRef ncols = LLVMBuildNSWSub(B, cg_i64(m, q->N), col0, "");
  CgLoop lk, lj;
  LLVMValueRef k = cg_loop_begin(f, &lk, k0, k1, "pk");
  LLVMValueRef dst = cg_mulc(f, LLVMBuildNSWSub(B, k, k0, ""), nr);
  LLVMValueRef j = cg_loop_begin(f, &lj, cg_i64(m, 0), ncols, "pj");
  LLVMValueRef col = cg_add(f, col0, j);
  LLVMValueRef bc[2] = {q->tb ? col : k, q->tb ? k : col};
  LLVMBuildStore(B, cg_emit(f, q->bv, bc), fslot(q, panel, cg_add(f, dst, j)));
  cg_loop_end(f, &lj, false);
  j = cg_loop_begin(f, &lj, ncols, cg_i64(m, nr), "pz");
  LLVMBuildStore(B, LLVMConstReal(m->t_f32, 0), fslot(q, panel, cg_add(f, dst, j)));
  cg_loop_end(f, &lj, false);
  cg_loop_end(f, &lk, false);
}

static void fill_panel(CgPanelSource *s, CgFn *f, LLVMValueRef panel, LLVMValueRef col0, LLVMValueRef k0, LLVMValueRef k1,
                       int nr) {
  Qmm *q = ((QPanels *)s)->q;
  LLVMBuilderRef B = f->b;
  CgIf whole, part;
  LLVMValueRef inside = LLVMBuildICmp(B, LLVMIntSLE, cg_add(f, col0, cg_i64(f->m, nr)), cg_i64(f->m, q->N), "");
  cg_if_begin(f, &whole, inside, "whole_panel");
  fill_vectors(q, panel, col0, k0, k1, nr);
  cg_if_end(f, &whole);
  cg_if_begin(f, &part, LLVMBuildNot(B, inside, ""), "part_panel");
  fill_scalar(q, panel, col0, k0, k1, nr);
  cg_if_end(f, &part);
}

/* ---- the kernel ---- */

/* Whether this kernel is one qmatmul takes (see the top); fills q. */
static bool eligible(CgFn *f, Qmm *q) {
  Graph *g = f->g;
  const Node *n = &g->node[f->anchor];
  if (n->op != OP_MATMUL || n->nin != 2 || ir_attr_int(n, "transpose_a")) return false;
  int bv = n->in[1];
  const Value *b = &g->val[bv];
  if (b->kind != VK_NODE || !f->member[b->node]) return false;
  const Node *dq = &g->node[b->node];
  if (dq->op != OP_DEQUANTIZE || dq->nin < 2 || dq->nin > 3) return false;
  int qv = dq->in[0], sv = dq->in[1], zv = dq->nin > 2 ? dq->in[2] : -1;
  if (f->arg_of[qv] < 0 || f->arg_of[sv] < 0 || (zv >= 0 && f->arg_of[zv] < 0)) return false;
  const TensorType *qt = &g->val[qv].type, *at = &g->val[n->in[0]].type, *yt = &g->val[n->out[0]].type;
  DType qdt = qt->dt, sdt = g->val[sv].type.dt, ydt = b->type.dt;
  if (qdt != DT_I8 && qdt != DT_U8 && qdt != DT_I4 && qdt != DT_U4 && !dt_is_f8(qdt)) return false;
  if (sdt != DT_F32 && sdt != DT_BF16 && !(sdt == DT_F16 && f->m->native_f16)) return false;
  /* zeros are of the qweight's dtype or the scales' (ir/infer.c), both
   * read here; fp8 with zero points is left alone */
  DType zdt = zv >= 0 ? g->val[zv].type.dt : DT_INVALID;
  if (zv >= 0 && (dt_is_f8(qdt) || (zdt != qdt && zdt != sdt))) return false;
  if (ydt != DT_F32 && ydt != DT_F16 && ydt != DT_BF16) return false;
  if (qt->rank != 2 || at->rank < 2 || at->rank != yt->rank || at->dt != ydt) return false;
  for (int i = 0; i + 2 < at->rank; i++)
    if (at->dim[i] != yt->dim[i]) return false;
  bool tb = ir_attr_int(n, "transpose_b") != 0;
  int axis = ir_norm_axis(ir_attr_int(dq, "axis"), 2);
  if (axis != (tb ? 1 : 0)) return false;
  int64_t K = qt->dim[axis], N = qt->dim[1 - axis], G = ir_attr_int(dq, "group");
  if (G == 0) G = K;
  int vl = f->m->f32_lanes;
  if (K <= 0 || N <= 0 || K > QMM_MAX_K || K % G) return false;
  if (zv >= 0 && K / G > QMM_MAX_GROUPS) return false;
  if (tb && G % vl) return false;
  /* [K, N] 4-bit: vectors of VL columns (and of their zeros) start on a byte */
  if (!tb && dt_is_packed(qdt) && N % 2) return false;
  *q = (Qmm){.f = f, .m = f->m, .B = f->b, .mm = n, .dq = dq, .av = n->in[0], .bv = bv, .qarg = f->arg_of[qv],
             .sarg = f->arg_of[sv], .zarg = zv >= 0 ? f->arg_of[zv] : -1, .qdt = qdt, .sdt = sdt, .zdt = zdt, .tb = tb,
             .K = K, .N = N, .G = G, .ng = K / G, .vl = vl};
  return true;
}

smelt_status cg_qmatmul_try(CgFn *f, bool *out_done) {
  *out_done = false;
  Qmm q;
  if (!eligible(f, &q)) return NULL;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  const TensorType *yt = cg_anchor_type(f), *at = &f->g->val[q.av].type;
  q.vf = LLVMVectorType(m->t_f32, (unsigned)q.vl);
  q.vi = LLVMVectorType(m->t_i32, (unsigned)q.vl);
  int64_t rows, ncb;
  cg_matmul_space(f->g, q.mm, &rows, &ncb);
  /* (not with a ranged dim: the runtime then runs a subset of the per-row
   * tasks, codegen/ranges.c, which the panels' units do not follow) */
  if (ir_type_numel(yt) / q.N >= QMM_PANEL_ROWS && !f->k->rg.range) {
    QPanels qp = {{fill_panel, q.K, q.N}, &q};
    RETURN_IF_ERROR(cg_gemm_panels(f, &qp.src));
    *out_done = true;
    return NULL;
  }
  int64_t tile = ncb > 1 ? CG_MM_COLS : q.N < QMM_MAX_TILE ? q.N : QMM_MAX_TILE, ntiles = (q.N + tile - 1) / tile;
  q.xrow = cg_alloca(f, m->t_f32, q.K, "xrow");
  q.split = q.tb && dt_is_packed(q.qdt) && q.G % (2 * q.vl) == 0;
  q.zbias = q.split && q.qdt == DT_I4 ? 8 : 0;
  q.corr = q.zarg >= 0 || q.zbias != 0;
  if (q.corr) q.xsum = cg_alloca(f, m->t_f32, q.ng, "xsum");
  q.tile = cg_alloca(f, m->t_f32, tile, "ytile");
  for (int j = 0; j < QMM_VECS; j++) {
    q.acc[j] = LLVMBuildAlloca(f->ab, q.vf, "acc");
    q.part[j] = LLVMBuildAlloca(f->ab, q.vf, "part");
  }
  int prefix = yt->rank - 1; /* output dims that index a row */

  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, rows * ncb, &ub, &ue);
  CgLoop lrow, ltile, lk, ln;
  LLVMValueRef unit = cg_loop_begin(f, &lrow, ub, ue, "unit");
  LLVMValueRef row = unit, t0 = cg_i64(m, 0), t1 = cg_i64(m, ntiles);
  if (ncb > 1) {
    row = LLVMBuildURem(B, unit, cg_i64(m, rows), "row");
    t0 = LLVMBuildUDiv(B, unit, cg_i64(m, rows), "");
    t1 = cg_add(f, t0, cg_i64(m, 1));
  }
  LLVMValueRef pc[IR_MAX_RANK], ac[IR_MAX_RANK], oc[IR_MAX_RANK];
  cg_delinearize(f, row, yt->dim, prefix, pc);
  /* the task's row of A, once */
  for (int i = 0; i < prefix; i++) ac[i] = pc[i];
  LLVMValueRef k = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, q.K), "xk");
  ac[at->rank - 1] = k;
  LLVMValueRef x = cg_convert(m, cg_emit(f, q.av, ac), at->dt, DT_F32), dst = k;
  if (q.split) {
    /* within each block of 2 VL: the even k's, then the odd ones */
    int64_t blk = 2 * q.vl;
    LLVMValueRef r = LLVMBuildAnd(B, k, cg_i64(m, blk - 1), "");
    dst = cg_add(f, LLVMBuildNSWSub(B, k, r, ""),
                 cg_add(f, cg_mulc(f, LLVMBuildAnd(B, r, cg_i64(m, 1), ""), q.vl), LLVMBuildLShr(B, r, cg_i64(m, 1), "")));
  }
  LLVMBuildStore(B, x, fslot(&q, q.xrow, dst));
  cg_loop_end(f, &lk, false);
  if (q.corr) {
    CgLoop lg;
    LLVMValueRef sum = cg_alloca(f, m->t_f32, 1, "xs");
    LLVMValueRef gi = cg_loop_begin(f, &lg, cg_i64(m, 0), cg_i64(m, q.ng), "xg");
    LLVMBuildStore(B, LLVMConstReal(m->t_f32, 0), sum);
    LLVMValueRef kk = cg_loop_begin(f, &lk, cg_mulc(f, gi, q.G), cg_add(f, cg_mulc(f, gi, q.G), cg_i64(m, q.G)), "xgk");
    LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildLoad2(B, m->t_f32, sum, ""),
                                    LLVMBuildLoad2(B, m->t_f32, fslot(&q, q.xrow, kk), ""), ""), sum);
    cg_loop_end(f, &lk, false);
    LLVMBuildStore(B, LLVMBuildLoad2(B, m->t_f32, sum, ""), fslot(&q, q.xsum, gi));
    cg_loop_end(f, &lg, false);
  }

  LLVMValueRef ti = cg_loop_begin(f, &ltile, t0, t1, "tile");
  LLVMValueRef n0 = cg_mulc(f, ti, tile);
  LLVMValueRef n1 = cg_min(f, cg_add(f, n0, cg_i64(m, tile)), cg_i64(m, q.N));
  if (q.tb) nk_tile(&q, n0, n1);
  else kn_tile(&q, n0, n1);
  /* the epilogue over the tile */
  LLVMValueRef n = cg_loop_begin(f, &ln, n0, n1, "n");
  for (int i = 0; i < prefix; i++) oc[i] = pc[i];
  oc[prefix] = n;
  LLVMValueRef y = LLVMBuildLoad2(B, m->t_f32, fslot(&q, q.tile, LLVMBuildNSWSub(B, n, n0, "")), "");
  cg_store_epilogue(f, oc, y);
  cg_loop_end(f, &ln, false);
  cg_loop_end(f, &ltile, false);
  cg_loop_end(f, &lrow, false);
  *out_done = true;
  return NULL;
}
