/* Contraction kernels: matmul and conv2d with an elementwise epilogue.
 *
 * cg_llvm_emit_contraction is the one entry point: a matmul or conv2d whose
 * weight is a constant goes to the register-blocked GEMM with pre-packed
 * weights (gemm.c; conv2d as an implicit GEMM), a matmul whose weight is a
 * dequantize of quantised constants in the same kernel to the quantised
 * GEMV (qmatmul.c); what they do not take is done here, by the generic,
 * obviously correct loop nests below.
 *
 * matmul: one task per output row (batch index and m), and per block of
 * CG_MM_COLS columns when the rows are few (lower.h, cg_matmul_space).  The
 * columns are cut into tiles of CG_NTILE accumulators kept on the stack
 * (the column block is the tile when the columns are split).  When B is stored
 * k-major ([K,N], the usual weight layout) the loop order is k then n: each
 * A element times a contiguous row of B is added to the contiguous
 * accumulators, a loop LLVM vectorises without reassociating anything.
 * When B is transposed ([N,K]) each accumulator is a dot product along k,
 * contiguous in both operands, vectorised as a reassociated reduction.
 * Operands are read through cg_emit, so a fused prologue (a cast, a scale)
 * and broadcast batch dims (numpy semantics) cost nothing extra here, and
 * the epilogue (bias, activation, residual) runs on the accumulator tile
 * before anything is stored.
 *
 * conv2d: one task per (n, o, oh) output row, direct convolution with OW
 * accumulators: for every input channel of o's group and every (kh, kw)
 * the weight is a scalar and the valid output columns, computed exactly
 * (padding never needs a test in the inner loop), form a strided walk along
 * an input row.  Bias initialises the accumulators.
 *
 * f16/bf16 accumulate in f32, integer matmul in i64 with a saturating final
 * conversion (as the reference: sum in double, clamp on store).
 */
#include <string.h>

#include "codegen/llvm/cg_internal.h"
#include "codegen/llvm/gemm.h"
#include "codegen/llvm/qmatmul.h"

#define CG_NTILE 256

/* acc += a * b, fused where the target has FMA. */
static LLVMValueRef mul_add(CgFn *f, LLVMValueRef a, LLVMValueRef b, LLVMValueRef acc) {
  LLVMTypeRef t = LLVMTypeOf(acc);
  if (LLVMGetTypeKind(t) == LLVMIntegerTypeKind)
    return LLVMBuildAdd(f->b, acc, LLVMBuildMul(f->b, a, b, ""), "");
  LLVMValueRef args[3] = {a, b, acc};
  return cg_intrinsic(f->m, "llvm.fmuladd", &t, 1, args, 3);
}

/* Accumulator type and the conversion of an operand into it. */
static LLVMTypeRef acc_type(CgMod *m, DType dt) { return dt_is_float(dt) ? cg_ctype(m, dt) : m->t_i64; }
static LLVMValueRef to_acc(CgMod *m, DType dt, LLVMValueRef v) {
  return dt_is_float(dt) ? v : cg_convert(m, v, dt, DT_I64);
}
static LLVMValueRef from_acc(CgMod *m, DType dt, LLVMValueRef v) {
  return dt_is_float(dt) ? v : cg_convert(m, v, DT_I64, dt);
}

static LLVMValueRef slot(CgFn *f, LLVMTypeRef t, LLVMValueRef buf, LLVMValueRef i) {
  return LLVMBuildInBoundsGEP2(f->b, t, buf, &i, 1, "");
}

/* Batch coordinates of an operand with `nbat` batch dims (dims) against the
 * output's `nb` batch coordinates: right-aligned, size-1 dims at 0. */
static void batch_coords(CgFn *f, const int64_t *dims, int nbat, LLVMValueRef const *oc, int nb, LLVMValueRef *out) {
  for (int i = 0; i < nbat; i++) out[i] = dims[i] == 1 ? cg_i64(f->m, 0) : oc[nb - nbat + i];
}

static smelt_status emit_matmul(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int av = n->in[0], bv = n->in[1];
  const TensorType *at = &g->val[av].type, *bt = &g->val[bv].type, *yt = cg_anchor_type(f);
  bool ta = ir_attr_int(n, "transpose_a") != 0, tb = ir_attr_int(n, "transpose_b") != 0;
  bool a1 = at->rank == 1, b1 = bt->rank == 1;
  int64_t K = a1 ? at->dim[0] : at->dim[ta ? at->rank - 2 : at->rank - 1];
  int64_t N = b1 ? 1 : bt->dim[tb ? bt->rank - 2 : bt->rank - 1];
  int abat = a1 ? 0 : at->rank - 2, bbat = b1 ? 0 : bt->rank - 2;
  int prefix = yt->rank - (b1 ? 0 : 1); /* output dims that index a row */
  int nb = yt->rank - (a1 ? 0 : 1) - (b1 ? 0 : 1);
  int64_t rows = 1;
  for (int i = 0; i < prefix; i++) rows *= yt->dim[i];
  DType dt = at->dt;
  LLVMTypeRef t = acc_type(m, dt);
  LLVMValueRef zero = LLVMConstNull(t);
  /* the task space (lower.h): with ncb column blocks, unit u is row
   * u % rows of column block u / rows, a tile of CG_MM_COLS columns */
  int64_t ncb;
  cg_matmul_space(g, n, &rows, &ncb);
  int64_t tile = ncb > 1 ? CG_MM_COLS : N < CG_NTILE ? N : CG_NTILE, ntiles = tile ? (N + tile - 1) / tile : 0;
  LLVMValueRef acc = cg_alloca(f, t, tile, "acc"), dot = cg_alloca(f, t, 1, "dot");
  bool dot_form = tb && !b1;

  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, rows * ncb, &ub, &ue);
  CgLoop lrow, ltile;
  LLVMValueRef unit = cg_loop_begin(f, &lrow, ub, ue, "unit");
  LLVMValueRef row = unit, t0 = cg_i64(m, 0), t1 = cg_i64(m, ntiles);
  if (ncb > 1) {
    row = LLVMBuildURem(B, unit, cg_i64(m, rows), "row");
    t0 = LLVMBuildUDiv(B, unit, cg_i64(m, rows), "");
    t1 = cg_add(f, t0, cg_i64(m, 1));
  }
  LLVMValueRef pc[IR_MAX_RANK], ac[IR_MAX_RANK], bc[IR_MAX_RANK], oc[IR_MAX_RANK];
  cg_delinearize(f, row, yt->dim, prefix, pc);
  LLVMValueRef mi = a1 ? cg_i64(m, 0) : pc[nb];
  batch_coords(f, at->dim, abat, pc, nb, ac);
  batch_coords(f, bt->dim, bbat, pc, nb, bc);
  /* A[.., m, k] (or [.., k, m]) and B[.., k, n] (or [.., n, k]) */
  int am = ta ? abat + 1 : abat, ak = a1 ? 0 : ta ? abat : abat + 1;
  int bk = b1 ? 0 : tb ? bbat + 1 : bbat, bn = tb ? bbat : bbat + 1;
  if (!a1) ac[am] = mi;

  LLVMValueRef ti = cg_loop_begin(f, &ltile, t0, t1, "tile");
  LLVMValueRef n0 = cg_mulc(f, ti, tile);
  LLVMValueRef n1 = cg_min(f, cg_add(f, n0, cg_i64(m, tile)), cg_i64(m, N));
  CgLoop ln, lk;
  if (!dot_form) {
    LLVMValueRef j = cg_loop_begin(f, &ln, n0, n1, "n");
    LLVMBuildStore(B, zero, slot(f, t, acc, LLVMBuildNSWSub(B, j, n0, "")));
    cg_loop_end(f, &ln, false);
    LLVMValueRef k = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, K), "k");
    ac[ak] = k;
    LLVMValueRef a = to_acc(m, dt, cg_emit(f, av, ac));
    j = cg_loop_begin(f, &ln, n0, n1, "n");
    bc[bk] = k;
    if (!b1) bc[bn] = j;
    LLVMValueRef p = slot(f, t, acc, LLVMBuildNSWSub(B, j, n0, ""));
    LLVMValueRef s = mul_add(f, a, to_acc(m, dt, cg_emit(f, bv, bc)), LLVMBuildLoad2(B, t, p, ""));
    LLVMBuildStore(B, s, p);
    cg_loop_end(f, &ln, false);
    cg_loop_end(f, &lk, false);
  } else {
    LLVMValueRef j = cg_loop_begin(f, &ln, n0, n1, "n");
    LLVMBuildStore(B, zero, dot);
    LLVMValueRef k = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, K), "k");
    ac[ak] = k;
    bc[bk] = k;
    bc[bn] = j;
    LLVMValueRef a = to_acc(m, dt, cg_emit(f, av, ac)), b = to_acc(m, dt, cg_emit(f, bv, bc));
    LLVMBuildStore(B, mul_add(f, a, b, LLVMBuildLoad2(B, t, dot, "")), dot);
    cg_loop_end(f, &lk, true);
    LLVMBuildStore(B, LLVMBuildLoad2(B, t, dot, ""), slot(f, t, acc, LLVMBuildNSWSub(B, j, n0, "")));
    cg_loop_end(f, &ln, false);
  }
  /* the epilogue over the tile */
  LLVMValueRef j = cg_loop_begin(f, &ln, n0, n1, "n");
  for (int i = 0; i < nb; i++) oc[i] = pc[i];
  int o = nb;
  if (!a1) oc[o++] = mi;
  if (!b1) oc[o++] = j;
  LLVMValueRef y = LLVMBuildLoad2(B, t, slot(f, t, acc, LLVMBuildNSWSub(B, j, n0, "")), "");
  cg_store_epilogue(f, oc, from_acc(m, dt, y));
  cg_loop_end(f, &ln, false);
  cg_loop_end(f, &ltile, false);
  cg_loop_end(f, &lrow, false);
  return NULL;
}

static smelt_status emit_conv2d(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int xv = n->in[0], wv = n->in[1], bv = n->nin > 2 ? n->in[2] : -1;
  const TensorType *xt = &g->val[xv].type, *wt = &g->val[wv].type, *yt = cg_anchor_type(f);
  const Attr *st = ir_attr(n, "strides"), *pd = ir_attr(n, "pads"), *dl = ir_attr(n, "dilations");
  int64_t G = ir_attr_int(n, "groups");
  int64_t H = xt->dim[2], W = xt->dim[3];
  int64_t O = wt->dim[0], Cg = wt->dim[1], KH = wt->dim[2], KW = wt->dim[3];
  int64_t OW = yt->dim[3];
  int64_t sh = st->ints[0], sw = st->ints[1], pt = pd->ints[0], pl = pd->ints[1], dh = dl->ints[0], dw = dl->ints[1];
  int64_t Og = O / G;
  DType dt = xt->dt;
  LLVMTypeRef t = cg_ctype(m, dt);
  int64_t tile = OW < CG_NTILE ? OW : CG_NTILE, ntiles = tile ? (OW + tile - 1) / tile : 0;
  LLVMValueRef acc = cg_alloca(f, t, tile, "acc");

  cg_store_loops(f, f->side, f->nside);
  int64_t rows = yt->dim[0] * yt->dim[1] * yt->dim[2];
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, rows, &rb, &re);
  CgLoop lrow, ltile, lc, lkh, lkw, low;
  LLVMValueRef row = cg_loop_begin(f, &lrow, rb, re, "row");
  LLVMValueRef rc[3];
  cg_delinearize(f, row, yt->dim, 3, rc); /* n, o, oh */
  LLVMValueRef cin0 = cg_mulc(f, LLVMBuildUDiv(B, rc[1], cg_i64(m, Og), ""), Cg);
  LLVMValueRef ti = cg_loop_begin(f, &ltile, cg_i64(m, 0), cg_i64(m, ntiles), "tile");
  LLVMValueRef ow0 = cg_mulc(f, ti, tile);
  LLVMValueRef ow1 = cg_min(f, cg_add(f, ow0, cg_i64(m, tile)), cg_i64(m, OW));
  LLVMValueRef init = bv >= 0 ? cg_emit(f, bv, &rc[1]) : cg_fconst(t, 0);
  LLVMValueRef ow = cg_loop_begin(f, &low, ow0, ow1, "ow");
  LLVMBuildStore(B, init, slot(f, t, acc, LLVMBuildNSWSub(B, ow, ow0, "")));
  cg_loop_end(f, &low, false);

  LLVMValueRef c = cg_loop_begin(f, &lc, cg_i64(m, 0), cg_i64(m, Cg), "c");
  LLVMValueRef kh = cg_loop_begin(f, &lkh, cg_i64(m, 0), cg_i64(m, KH), "kh");
  LLVMValueRef ih = cg_add(f, cg_mulc(f, rc[2], sh), cg_add(f, cg_i64(m, -pt), cg_mulc(f, kh, dh)));
  CgIf in_h;
  cg_if_begin(f, &in_h, LLVMBuildICmp(B, LLVMIntULT, ih, cg_i64(m, H), ""), "inside");
  LLVMValueRef kw = cg_loop_begin(f, &lkw, cg_i64(m, 0), cg_i64(m, KW), "kw");
  LLVMValueRef wc[4] = {rc[1], c, kh, kw};
  LLVMValueRef w = cg_emit(f, wv, wc);
  /* output columns whose input column ow*sw - pl + kw*dw lies in [0, W) */
  LLVMValueRef off = LLVMBuildNSWSub(B, cg_i64(m, pl), cg_mulc(f, kw, dw), ""); /* pl - kw*dw */
  LLVMValueRef lo = LLVMBuildSDiv(B, cg_add(f, cg_max(f, off, cg_i64(m, 0)), cg_i64(m, sw - 1)), cg_i64(m, sw), "");
  LLVMValueRef u = cg_add(f, off, cg_i64(m, W - 1));
  LLVMValueRef hi = cg_add(f, LLVMBuildSDiv(B, cg_max(f, u, cg_i64(m, 0)), cg_i64(m, sw), ""), cg_i64(m, 1));
  hi = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, u, cg_i64(m, 0), ""), cg_i64(m, 0), hi, "");
  lo = cg_max(f, lo, ow0);
  hi = cg_min(f, hi, ow1);
  ow = cg_loop_begin(f, &low, lo, hi, "ow");
  LLVMValueRef iw = LLVMBuildNSWSub(B, cg_mulc(f, ow, sw), off, "");
  LLVMValueRef xc[4] = {rc[0], cg_add(f, cin0, c), ih, iw};
  LLVMValueRef p = slot(f, t, acc, LLVMBuildNSWSub(B, ow, ow0, ""));
  LLVMBuildStore(B, mul_add(f, w, cg_emit(f, xv, xc), LLVMBuildLoad2(B, t, p, "")), p);
  cg_loop_end(f, &low, false);
  cg_loop_end(f, &lkw, false);
  cg_if_end(f, &in_h);
  cg_loop_end(f, &lkh, false);
  cg_loop_end(f, &lc, false);

  ow = cg_loop_begin(f, &low, ow0, ow1, "ow");
  LLVMValueRef oc[4] = {rc[0], rc[1], rc[2], ow};
  cg_store_epilogue(f, oc, LLVMBuildLoad2(B, t, slot(f, t, acc, LLVMBuildNSWSub(B, ow, ow0, "")), ""));
  cg_loop_end(f, &low, false);
  cg_loop_end(f, &ltile, false);
  cg_loop_end(f, &lrow, false);
  return NULL;
}

smelt_status cg_llvm_emit_contraction(CgFn *f) {
  const Node *n = &f->g->node[f->anchor];
  if (n->op == OP_MATMUL) {
    bool done;
    RETURN_IF_ERROR(cg_qmatmul_try(f, &done)); /* a quantised weight dequantised in the kernel */
    if (done) return NULL;
    RETURN_IF_ERROR(cg_gemm_try(f, &done));
    return done ? NULL : emit_matmul(f);
  }
  if (n->op == OP_CONV2D) {
    bool done;
    RETURN_IF_ERROR(cg_gemm_conv_try(f, &done));
    return done ? NULL : emit_conv2d(f);
  }
  return st_error(ST_INTERNAL, "kernel %s: %s is not a contraction", f->k->name, ir_op_name(n->op));
}
