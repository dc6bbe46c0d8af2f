/* Reduction kernels: sum, mean, max, min, softmax, log_softmax, layer_norm,
 * rms_norm and global_avg_pool, with an elementwise prologue feeding the
 * anchor and an elementwise epilogue consuming it.
 *
 * A row is one combination of the kept axes; the reduced axes (one for
 * softmax and the norms, any set for sum/mean/max/min, all spatial axes for
 * global_avg_pool) span D elements, walked by a linear index kk that is
 * split into coordinates (no division at all for a single reduced axis, so
 * a row with stride `inner` is still an affine walk).  Per row:
 *   pass 1  the anchor's input x = prologue(kk) is computed once, kept in a
 *           row buffer (D accumulator-typed elements on the stack: the
 *           group's on-chip footprint), and the first statistic is
 *           accumulated: the sum, the maximum, the sum of squares;
 *           prologue results that are stored themselves (the residual
 *           stream h = x + r of "add + rms_norm") are written here too;
 *   pass 2  softmax's sum of exp(x - max), layer_norm's sum of squared
 *           deviations (two passes, free of E[x^2] - E[x]^2 cancellation,
 *           like the reference);
 *   pass 3  the anchor's value at each kk, computed from the buffer and the
 *           statistics, goes through the epilogue to every stored result.
 * sum/mean/max/min/global_avg_pool have one value per row instead, stored
 * through the epilogue at the row's output coordinates.  Rows longer than
 * CG_ROW_BUF elements are not buffered: passes 2 and 3 recompute the
 * prologue (and read x from memory again) rather than put megabytes on a
 * thread's stack.  Accumulation is in f32 for f32/f16/bf16 (f64 for f64).
 */
#include <math.h>
#include <string.h>

#include "codegen/llvm/cg_internal.h"

#define CG_ROW_BUF 16384

typedef struct {
  CgFn *f;
  const TensorType *xt;
  bool red[IR_MAX_RANK];
  int kaxis[IR_MAX_RANK], raxis[IR_MAX_RANK], nk, nr;
  int64_t kdim[IR_MAX_RANK], rdim[IR_MAX_RANK];
  LLVMValueRef kept[IR_MAX_RANK]; /* the current row's kept coordinates */
} Rows;

/* Coordinates in x of element kk of the current row. */
static void row_coords(Rows *r, LLVMValueRef kk, LLVMValueRef *c) {
  LLVMValueRef rc[IR_MAX_RANK];
  cg_delinearize(r->f, kk, r->rdim, r->nr, rc);
  for (int i = 0; i < r->nk; i++) c[r->kaxis[i]] = r->kept[i];
  for (int i = 0; i < r->nr; i++) c[r->raxis[i]] = rc[i];
}

static LLVMValueRef load_acc(CgFn *f, LLVMTypeRef t, LLVMValueRef p) { return LLVMBuildLoad2(f->b, t, p, ""); }

static LLVMValueRef buf_at(CgFn *f, LLVMTypeRef t, LLVMValueRef buf, LLVMValueRef kk) {
  return LLVMBuildInBoundsGEP2(f->b, t, buf, &kk, 1, "");
}

/* x at element kk: from the row buffer, or computed again. */
static LLVMValueRef x_at(Rows *r, LLVMTypeRef t, LLVMValueRef buf, LLVMValueRef kk, int x, LLVMValueRef *c) {
  row_coords(r, kk, c);
  if (buf) return LLVMBuildLoad2(r->f->b, t, buf_at(r->f, t, buf, kk), "");
  return cg_emit(r->f, x, c);
}

/* Float bits as a signed integer that orders like the float (negative
 * values get their magnitude bits flipped), and back: the map is its own
 * inverse.  -0 sorts below +0, NaNs beyond the infinities. */
static LLVMValueRef flip_bits(CgFn *f, LLVMValueRef i) {
  LLVMTypeRef it = LLVMTypeOf(i);
  unsigned w = LLVMGetIntTypeWidth(it);
  LLVMValueRef sign = LLVMBuildAShr(f->b, i, LLVMConstInt(it, w - 1, 0), "");
  LLVMValueRef mask = LLVMConstInt(it, w == 64 ? 0x7fffffffffffffffull : 0x7fffffffull, 0);
  return LLVMBuildXor(f->b, i, LLVMBuildAnd(f->b, sign, mask, ""), "");
}
static LLVMTypeRef bits_type(CgMod *m, LLVMTypeRef ft) { return ft == m->t_f64 ? m->t_i64 : m->t_i32; }
static LLVMValueRef float_to_ordered(CgFn *f, LLVMValueRef v) {
  return flip_bits(f, LLVMBuildBitCast(f->b, v, bits_type(f->m, LLVMTypeOf(v)), ""));
}
static LLVMValueRef ordered_to_float(CgFn *f, LLVMValueRef i, LLVMTypeRef ft) {
  return LLVMBuildBitCast(f->b, flip_bits(f, i), ft, "");
}

static bool same_shape(const TensorType *a, const TensorType *b) {
  return a->rank == b->rank && memcmp(a->dim, b->dim, sizeof(int64_t) * (size_t)a->rank) == 0;
}

/* The statistic of pass 1: a sum (sum, mean, layer_norm, global_avg_pool),
 * a sum of squares (rms_norm) or an extreme (max, min, and softmax's max).
 * A float extreme is kept as the ordered-integer image of the floats: an
 * integer max is a reduction LLVM 14 vectorises, a float one only under
 * fast-math.  max and min also keep a NaN flag so that NaN propagates like
 * numpy; softmax needs none: a NaN in x makes the sum of exponentials NaN. */
typedef struct {
  Op op;
  DType dt;
  LLVMTypeRef t;       /* accumulator type */
  LLVMValueRef slot;   /* the accumulator (for a float extreme: its integer image) */
  LLVMValueRef nan;    /* max/min of floats: any NaN seen */
  bool extreme, is_min;
} Stat;

static void stat_init(CgFn *f, Stat *s, Op op, DType dt) {
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  memset(s, 0, sizeof *s);
  s->op = op;
  s->dt = dt;
  s->t = cg_ctype(m, dt);
  s->is_min = op == OP_MIN;
  s->extreme = op == OP_MAX || op == OP_MIN || op == OP_SOFTMAX || op == OP_LOG_SOFTMAX;
  bool is_float = dt_is_float(dt);
  LLVMValueRef init;
  if (!s->extreme) {
    init = LLVMConstNull(s->t);
  } else if (is_float) {
    init = cg_fconst(s->t, s->is_min ? INFINITY : -INFINITY);
  } else if (dt == DT_BOOL || dt == DT_U8) {
    init = s->is_min ? LLVMConstAllOnes(s->t) : LLVMConstNull(s->t);
  } else {
    unsigned w = LLVMGetIntTypeWidth(s->t);
    init = LLVMConstInt(s->t, s->is_min ? (1ull << (w - 1)) - 1 : 1ull << (w - 1), 0);
  }
  if (s->extreme && is_float) {
    init = float_to_ordered(f, init);
    if (op == OP_MAX || op == OP_MIN) {
      s->nan = cg_alloca(f, m->t_i1, 1, "nan");
      LLVMBuildStore(B, LLVMConstInt(m->t_i1, 0, 0), s->nan);
    }
  }
  s->slot = cg_alloca(f, LLVMTypeOf(init), 1, "stat");
  LLVMBuildStore(B, init, s->slot);
}

static void stat_add(CgFn *f, Stat *s, LLVMValueRef v) {
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  bool is_float = dt_is_float(s->dt);
  LLVMTypeRef at = s->extreme && is_float ? bits_type(m, s->t) : s->t;
  LLVMValueRef a = LLVMBuildLoad2(B, at, s->slot, ""), r;
  if (s->extreme && is_float) {
    LLVMValueRef iv = float_to_ordered(f, v);
    r = LLVMBuildSelect(B, LLVMBuildICmp(B, s->is_min ? LLVMIntSLT : LLVMIntSGT, iv, a, ""), iv, a, "");
    if (s->nan)
      LLVMBuildStore(B, LLVMBuildOr(B, LLVMBuildLoad2(B, m->t_i1, s->nan, ""), LLVMBuildFCmp(B, LLVMRealUNO, v, v, ""), ""),
                     s->nan);
  } else if (s->extreme) {
    r = cg_binary(m, s->is_min ? OP_MINIMUM : OP_MAXIMUM, s->dt, v, a);
  } else if (s->op == OP_RMS_NORM) {
    r = LLVMBuildFAdd(B, a, LLVMBuildFMul(B, v, v, ""), "");
  } else {
    r = is_float ? LLVMBuildFAdd(B, a, v, "") : cg_binary(m, OP_ADD, s->dt, a, v);
  }
  LLVMBuildStore(B, r, s->slot);
}

static LLVMValueRef stat_result(CgFn *f, Stat *s) {
  LLVMBuilderRef B = f->b;
  if (!(s->extreme && dt_is_float(s->dt))) return LLVMBuildLoad2(B, s->t, s->slot, "");
  LLVMValueRef y = ordered_to_float(f, LLVMBuildLoad2(B, bits_type(f->m, s->t), s->slot, ""), s->t);
  if (s->nan) y = LLVMBuildSelect(B, LLVMBuildLoad2(B, f->m->t_i1, s->nan, ""), cg_fconst(s->t, NAN), y, "");
  return y;
}

smelt_status cg_llvm_emit_reduction(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *a = &g->node[f->anchor];
  Op op = a->op;
  int x = a->in[0];
  Rows r = {.f = f, .xt = &g->val[x].type};
  const TensorType *xt = r.xt;
  DType dt = xt->dt;
  cg_reduced_axes(g, a, r.red);
  int64_t D = 1, rows = 1;
  for (int i = 0; i < xt->rank; i++) {
    if (r.red[i]) {
      r.raxis[r.nr] = i;
      r.rdim[r.nr++] = xt->dim[i];
      D *= xt->dim[i];
    } else {
      r.kaxis[r.nk] = i;
      r.kdim[r.nk++] = xt->dim[i];
      rows *= xt->dim[i];
    }
  }
  bool keeps_shape = op == OP_SOFTMAX || op == OP_LOG_SOFTMAX || op == OP_LAYER_NORM || op == OP_RMS_NORM;
  bool is_float = dt_is_float(dt);
  if ((op == OP_MEAN || keeps_shape || op == OP_GLOBAL_AVG_POOL) && !is_float)
    return st_error(ST_INTERNAL, "kernel %s: %s of %s", f->k->name, ir_op_name(op), dt_name(dt));

  /* side results shaped like x are stored in pass 1, others by loop nests */
  int inl[256], ninl = 0, rest[256], nrest = 0;
  for (int i = 0; i < f->nside && i < 256; i++) {
    if (same_shape(&g->val[f->side[i]].type, xt)) inl[ninl++] = f->side[i];
    else rest[nrest++] = f->side[i];
  }
  cg_store_loops(f, rest, nrest);

  LLVMTypeRef t = cg_ctype(m, dt); /* f32 for f16/bf16: the accumulator type */
  bool buffered = keeps_shape && D > 0 && D <= CG_ROW_BUF;
  LLVMValueRef buf = buffered ? cg_alloca(f, t, D, "row") : NULL;
  LLVMValueRef acc2 = cg_alloca(f, t, 1, "acc2");
  LLVMValueRef fD = is_float ? cg_fconst(t, (double)D) : NULL;

  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, rows, &rb, &re);
  CgLoop lrow;
  LLVMValueRef row = cg_loop_begin(f, &lrow, rb, re, "row");
  cg_delinearize(f, row, r.kdim, r.nk, r.kept);

  /* pass 1 */
  Stat st;
  stat_init(f, &st, op, dt);
  LLVMValueRef c[IR_MAX_RANK];
  CgLoop l1;
  LLVMValueRef kk = cg_loop_begin(f, &l1, cg_i64(m, 0), cg_i64(m, D), "k");
  row_coords(&r, kk, c);
  LLVMValueRef v = cg_emit(f, x, c);
  if (buf) LLVMBuildStore(B, v, buf_at(f, t, buf, kk));
  for (int i = 0; i < ninl; i++) cg_store_value(f, inl[i], c);
  stat_add(f, &st, v);
  cg_loop_end(f, &l1, is_float);
  LLVMValueRef stat = stat_result(f, &st);

  if (!keeps_shape) {
    LLVMValueRef y = stat;
    if (op == OP_MEAN || op == OP_GLOBAL_AVG_POOL) y = LLVMBuildFDiv(B, stat, fD, "");
    const TensorType *ot = cg_anchor_type(f);
    LLVMValueRef oc[IR_MAX_RANK];
    if (ot->rank == xt->rank) { /* keepdims, global_avg_pool */
      for (int i = 0, k = 0; i < xt->rank; i++) oc[i] = r.red[i] ? cg_i64(m, 0) : r.kept[k++];
    } else {
      for (int i = 0; i < r.nk; i++) oc[i] = r.kept[i];
    }
    cg_store_epilogue(f, oc, y);
    cg_loop_end(f, &lrow, false);
    return NULL;
  }

  /* pass 2 */
  LLVMValueRef mean = NULL, inv = NULL, mx = NULL, s2 = NULL;
  if (op == OP_SOFTMAX || op == OP_LOG_SOFTMAX || op == OP_LAYER_NORM) {
    if (op == OP_LAYER_NORM) mean = LLVMBuildFDiv(B, stat, fD, "");
    else mx = stat;
    LLVMBuildStore(B, cg_fconst(t, 0), acc2);
    CgLoop l2;
    kk = cg_loop_begin(f, &l2, cg_i64(m, 0), cg_i64(m, D), "k");
    LLVMValueRef xv = x_at(&r, t, buf, kk, x, c), term;
    if (mean) {
      LLVMValueRef d = LLVMBuildFSub(B, xv, mean, "");
      term = LLVMBuildFMul(B, d, d, "");
    } else {
      LLVMValueRef d = LLVMBuildFSub(B, xv, mx, "");
      term = cg_exp(m, d);
    }
    LLVMBuildStore(B, LLVMBuildFAdd(B, load_acc(f, t, acc2), term, ""), acc2);
    cg_loop_end(f, &l2, true);
    s2 = load_acc(f, t, acc2);
  }
  if (op == OP_LAYER_NORM || op == OP_RMS_NORM) {
    LLVMValueRef var = LLVMBuildFDiv(B, op == OP_LAYER_NORM ? s2 : stat, fD, "");
    var = LLVMBuildFAdd(B, var, cg_fconst(t, ir_attr_float(a, "eps")), "");
    inv = LLVMBuildFDiv(B, cg_fconst(t, 1), cg_intrinsic(m, "llvm.sqrt", &t, 1, &var, 1), "");
  }
  LLVMValueRef lse = NULL, rsum = NULL;
  if (op == OP_LOG_SOFTMAX) lse = LLVMBuildFAdd(B, mx, cg_intrinsic(m, "llvm.log", &t, 1, &s2, 1), "");
  if (op == OP_SOFTMAX) rsum = LLVMBuildFDiv(B, cg_fconst(t, 1), s2, "");

  /* pass 3: the anchor's value at every element, through the epilogue */
  CgLoop l3;
  kk = cg_loop_begin(f, &l3, cg_i64(m, 0), cg_i64(m, D), "k");
  LLVMValueRef xv = x_at(&r, t, buf, kk, x, c), y;
  switch (op) {
  case OP_SOFTMAX: {
    LLVMValueRef d = LLVMBuildFSub(B, xv, mx, "");
    y = LLVMBuildFMul(B, cg_exp(m, d), rsum, "");
    break;
  }
  case OP_LOG_SOFTMAX: y = LLVMBuildFSub(B, xv, lse, ""); break;
  default: {
    int axis = r.raxis[0];
    LLVMValueRef cen = mean ? LLVMBuildFSub(B, xv, mean, "") : xv;
    y = LLVMBuildFMul(B, LLVMBuildFMul(B, cen, inv, ""), cg_emit(f, a->in[1], &c[axis]), "");
    if (a->nin > 2) y = LLVMBuildFAdd(B, y, cg_emit(f, a->in[2], &c[axis]), "");
  }
  }
  cg_store_epilogue(f, c, y);
  cg_loop_end(f, &l3, false);
  cg_loop_end(f, &lrow, false);
  return NULL;
}
