/* Kernels of their own kind: attention, max_pool2d and avg_pool2d.
 *
 * attention: one task per query row (b, h, i).  The row of q, times the
 * scale, is kept on the stack; the keys are visited once with an online
 * softmax (running maximum m, running sum l, and Dv output accumulators
 * rescaled by exp(m_old - m_new) whenever the maximum grows), so the T
 * scores are never stored.  Grouped-query attention reads kv head
 * h / (H / Hkv).  Causal attention stops at key T - S + i (the last query
 * lines up with the last key).  A mask is read broadcast to [B,H,S,T]: a
 * bool mask says which keys may be attended, any other is added to the
 * scores.  Masked keys (score -inf) are skipped, and a row with no key left
 * yields 0, like the reference.  With cache: true, k and v are caches of
 * capacity T and the 4th input holds the queries' positions: row i visits
 * keys 0..min(pos[i], T - 1) only, so the cost follows the positions
 * filled, not the capacity (a negative position leaves the row 0).
 *
 * pooling: one task per output row (n, c, oh).  The window's valid rows and
 * columns are computed as index ranges, so padding costs no test per
 * element; max propagates NaN, avg divides by the number of elements
 * inside the input (count_include_pad = false), and a window wholly in the
 * padding gives -inf (max) or 0 (avg), as in the reference.
 *
 * Both read their operands through cg_emit and write through the epilogue,
 * so fused producers and elementwise consumers work as for any anchor.
 */
#include <math.h>
#include <string.h>

#include "codegen/llvm/cg_internal.h"

static LLVMValueRef at_index(CgFn *f, LLVMTypeRef t, LLVMValueRef buf, LLVMValueRef i) {
  return LLVMBuildInBoundsGEP2(f->b, t, buf, &i, 1, "");
}

smelt_status cg_llvm_emit_attention(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  /* cache: true: the 4th input is the queries' positions, not a mask */
  bool cache = ir_attr_int(n, "cache") != 0;
  int qv = n->in[0], kv = n->in[1], vv = n->in[2], mv = n->nin > 3 && !cache ? n->in[3] : -1;
  int pv = cache ? n->in[3] : -1;
  const TensorType *qt = &g->val[qv].type, *kt = &g->val[kv].type, *vt = &g->val[vv].type;
  int64_t Hq = qt->dim[1], S = qt->dim[2], D = qt->dim[3];
  int64_t Hkv = kt->dim[1], T = kt->dim[2], Dv = vt->dim[3];
  const Attr *sa = ir_attr(n, "scale");
  double scale = sa ? sa->f : 1.0 / sqrt((double)D);
  bool causal = ir_attr_int(n, "causal") != 0;
  DType dt = qt->dt;
  LLVMTypeRef t = cg_ctype(m, dt);
  LLVMValueRef qbuf = cg_alloca(f, t, D, "q"), acc = cg_alloca(f, t, Dv, "acc");
  LLVMValueRef mx = cg_alloca(f, t, 1, "m"), sum = cg_alloca(f, t, 1, "l"), dot = cg_alloca(f, t, 1, "s");
  LLVMValueRef zero = cg_fconst(t, 0), ninf = cg_fconst(t, -INFINITY);

  cg_store_loops(f, f->side, f->nside);
  int64_t rows = qt->dim[0] * Hq * S;
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, rows, &rb, &re);
  CgLoop lrow, ld, lj, lk;
  LLVMValueRef row = cg_loop_begin(f, &lrow, rb, re, "row");
  LLVMValueRef rc[4];
  cg_delinearize(f, row, qt->dim, 3, rc); /* b, h, i */
  LLVMValueRef hk = LLVMBuildUDiv(B, rc[1], cg_i64(m, Hq / Hkv), "");

  LLVMValueRef d = cg_loop_begin(f, &ld, cg_i64(m, 0), cg_i64(m, D), "d");
  LLVMValueRef qc[4] = {rc[0], rc[1], rc[2], d};
  LLVMBuildStore(B, LLVMBuildFMul(B, cg_emit(f, qv, qc), cg_fconst(t, scale), ""), at_index(f, t, qbuf, d));
  cg_loop_end(f, &ld, false);
  d = cg_loop_begin(f, &ld, cg_i64(m, 0), cg_i64(m, Dv), "d");
  LLVMBuildStore(B, zero, at_index(f, t, acc, d));
  cg_loop_end(f, &ld, false);
  LLVMBuildStore(B, ninf, mx);
  LLVMBuildStore(B, zero, sum);

  LLVMValueRef jend = cg_i64(m, T);
  if (cache) {
    /* slots 0..pos[i] of the cache, clamped into it (a position outside is
     * refused by the runtime; no read may leave the cache regardless) */
    LLVMValueRef pc[1] = {rc[2]};
    LLVMValueRef p = cg_convert(m, cg_emit(f, pv, pc), g->val[pv].type.dt, DT_I64);
    jend = cg_max(f, cg_add(f, cg_min(f, p, cg_i64(m, T - 1)), cg_i64(m, 1)), cg_i64(m, 0));
  } else if (causal) jend = cg_min(f, jend, cg_max(f, cg_add(f, rc[2], cg_i64(m, T - S + 1)), cg_i64(m, 0)));
  LLVMValueRef j = cg_loop_begin(f, &lj, cg_i64(m, 0), jend, "j");
  LLVMBuildStore(B, zero, dot);
  d = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, D), "d");
  LLVMValueRef kc[4] = {rc[0], hk, j, d};
  LLVMValueRef prod = LLVMBuildFMul(B, LLVMBuildLoad2(B, t, at_index(f, t, qbuf, d), ""), cg_emit(f, kv, kc), "");
  LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildLoad2(B, t, dot, ""), prod, ""), dot);
  cg_loop_end(f, &lk, true);
  LLVMValueRef s = LLVMBuildLoad2(B, t, dot, "");
  if (mv >= 0) {
    const TensorType *mt = &g->val[mv].type;
    LLVMValueRef full[4] = {rc[0], rc[1], rc[2], j}, mc[IR_MAX_RANK];
    cg_bcast_coords(f, mt, 4, full, mc);
    LLVMValueRef mval = cg_emit(f, mv, mc);
    if (mt->dt == DT_BOOL) s = LLVMBuildSelect(B, mval, s, ninf, "");
    else s = LLVMBuildFAdd(B, s, cg_convert(m, mval, mt->dt, dt), "");
  }
  /* a masked key changes nothing (and exp(-inf - -inf) would be NaN) */
  CgIf live;
  cg_if_begin(f, &live, LLVMBuildFCmp(B, LLVMRealUNE, s, ninf, ""), "live");
  LLVMValueRef mold = LLVMBuildLoad2(B, t, mx, "");
  LLVMValueRef mnew = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, s, mold, ""), s, mold, "");
  LLVMValueRef e1 = LLVMBuildFSub(B, mold, mnew, ""), e2 = LLVMBuildFSub(B, s, mnew, "");
  LLVMValueRef corr = cg_exp(m, e1);
  LLVMValueRef p = cg_exp(m, e2);
  LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildFMul(B, LLVMBuildLoad2(B, t, sum, ""), corr, ""), p, ""), sum);
  LLVMBuildStore(B, mnew, mx);
  d = cg_loop_begin(f, &ld, cg_i64(m, 0), cg_i64(m, Dv), "d");
  LLVMValueRef vc[4] = {rc[0], hk, j, d};
  LLVMValueRef ap = at_index(f, t, acc, d);
  LLVMValueRef nv = LLVMBuildFAdd(B, LLVMBuildFMul(B, LLVMBuildLoad2(B, t, ap, ""), corr, ""),
                                  LLVMBuildFMul(B, p, cg_emit(f, vv, vc), ""), "");
  LLVMBuildStore(B, nv, ap);
  cg_loop_end(f, &ld, false);
  cg_if_end(f, &live);
  cg_loop_end(f, &lj, false);

  LLVMValueRef l = LLVMBuildLoad2(B, t, sum, "");
  LLVMValueRef inv = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, l, zero, ""),
                                     LLVMBuildFDiv(B, cg_fconst(t, 1), l, ""), zero, "");
  d = cg_loop_begin(f, &ld, cg_i64(m, 0), cg_i64(m, Dv), "d");
  LLVMValueRef oc[4] = {rc[0], rc[1], rc[2], d};
  cg_store_epilogue(f, oc, LLVMBuildFMul(B, LLVMBuildLoad2(B, t, at_index(f, t, acc, d), ""), inv, ""));
  cg_loop_end(f, &ld, false);
  cg_loop_end(f, &lrow, false);
  return NULL;
}

smelt_status cg_llvm_emit_pool(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int xv = n->in[0];
  const TensorType *xt = &g->val[xv].type, *yt = cg_anchor_type(f);
  const Attr *ka = ir_attr(n, "kernel"), *sa = ir_attr(n, "strides"), *pa = ir_attr(n, "pads");
  if (!sa) sa = ka;
  bool is_max = n->op == OP_MAX_POOL2D;
  int64_t H = xt->dim[2], W = xt->dim[3], OW = yt->dim[3];
  int64_t KH = ka->ints[0], KW = ka->ints[1], sh = sa->ints[0], sw = sa->ints[1];
  int64_t pt = pa->ints[0], pl = pa->ints[1];
  DType dt = xt->dt;
  LLVMTypeRef t = cg_ctype(m, dt);
  LLVMValueRef acc = cg_alloca(f, t, 1, "acc");

  cg_store_loops(f, f->side, f->nside);
  int64_t rows = yt->dim[0] * yt->dim[1] * yt->dim[2];
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, rows, &rb, &re);
  CgLoop lrow, low, lkh, lkw;
  LLVMValueRef row = cg_loop_begin(f, &lrow, rb, re, "row");
  LLVMValueRef rc[3];
  cg_delinearize(f, row, yt->dim, 3, rc); /* n, c, oh */
  /* window rows inside the input: kh in [max(0, pt - oh*sh), min(KH, H + pt - oh*sh)) */
  LLVMValueRef top = LLVMBuildNSWSub(B, cg_i64(m, pt), cg_mulc(f, rc[2], sh), "");
  LLVMValueRef kh0 = cg_max(f, top, cg_i64(m, 0)), kh1 = cg_min(f, cg_add(f, top, cg_i64(m, H)), cg_i64(m, KH));
  LLVMValueRef ow = cg_loop_begin(f, &low, cg_i64(m, 0), cg_i64(m, OW), "ow");
  LLVMValueRef left = LLVMBuildNSWSub(B, cg_i64(m, pl), cg_mulc(f, ow, sw), "");
  LLVMValueRef kw0 = cg_max(f, left, cg_i64(m, 0)), kw1 = cg_min(f, cg_add(f, left, cg_i64(m, W)), cg_i64(m, KW));
  LLVMBuildStore(B, cg_fconst(t, is_max ? -INFINITY : 0), acc);
  LLVMValueRef kh = cg_loop_begin(f, &lkh, kh0, kh1, "kh");
  LLVMValueRef kw = cg_loop_begin(f, &lkw, kw0, kw1, "kw");
  LLVMValueRef xc[4] = {rc[0], rc[1], LLVMBuildNSWSub(B, kh, top, ""), LLVMBuildNSWSub(B, kw, left, "")};
  LLVMValueRef x = cg_emit(f, xv, xc), a = LLVMBuildLoad2(B, t, acc, "");
  LLVMBuildStore(B, is_max ? cg_fmax_nan(m, x, a) : LLVMBuildFAdd(B, a, x, ""), acc);
  cg_loop_end(f, &lkw, false);
  cg_loop_end(f, &lkh, false);
  LLVMValueRef y = LLVMBuildLoad2(B, t, acc, "");
  if (!is_max) {
    LLVMValueRef cnt = cg_mul(f, cg_max(f, LLVMBuildNSWSub(B, kh1, kh0, ""), cg_i64(m, 0)),
                              cg_max(f, LLVMBuildNSWSub(B, kw1, kw0, ""), cg_i64(m, 0)));
    LLVMValueRef fc = LLVMBuildSIToFP(B, cnt, t, "");
    y = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSGT, cnt, cg_i64(m, 0), ""), LLVMBuildFDiv(B, y, fc, ""), cg_fconst(t, 0), "");
  }
  LLVMValueRef oc[4] = {rc[0], rc[1], rc[2], ow};
  cg_store_epilogue(f, oc, y);
  cg_loop_end(f, &low, false);
  cg_loop_end(f, &lrow, false);
  return NULL;
}
