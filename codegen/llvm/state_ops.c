/* Kernels of the ops a generating language model needs besides attention:
 * scatter, argmax, topk and arange.
 *
 * scatter(dst, idx, src) along axis: out[o, idx[i], in] = src[o, i, in].
 * When dst is a state tensor (ir.h: ir_state_of of the result), the
 * runtime gives the destination and the result the same memory, the
 * session's state (runtime/session.c: place_states): the kernel writes only
 * the rows at idx, never reads dst, and never copies the tensor, so the
 * cost is that of the rows written (a KV cache of thousands of positions
 * takes one row per new token).  Otherwise (out of place) it first copies
 * dst into the result, then writes the rows.  An index outside [0, dim)
 * (an error in the reference; the runtime rejects host-bound positions
 * before the run) is skipped, so no write ever leaves the tensor.  Tasks
 * split the outer dims (those before axis); within one outer slice the rows
 * are written in the order of idx, so with a repeated index the last one
 * wins, as in the reference.
 *
 * argmax along axis: one task per output element (every combination of the
 * other axes); the first index of the largest element, a NaN counting as
 * the largest (the first NaN wins, as numpy's argmax); the result is i32.
 *
 * topk along axis: one task per row (every combination of the other
 * axes); the row is walked once in index order, keeping the best k so far
 * sorted best first in two stack arrays (values, indices).  An element
 * enters when fewer than k are kept or it beats the last kept one, and is
 * shifted up past every kept element it beats; since every kept index is
 * lower, "beats" needs no index test: an equal value stays behind (ties to
 * the lower index), and a NaN beats every number (largest) or none
 * (largest: false).  Most elements of a long row fail the first test, so
 * the cost is about one compare per element, k per element at worst (an
 * ascending row).  Then the k pairs are stored, values in x's dtype and
 * indices as i32, into whichever of the two results the kernel writes.
 *
 * arange: out[i] = start[0] + i in start's integer dtype.
 *
 * All read their operands through cg_emit; scatter, argmax and arange
 * write through the epilogue (only the op's own result: a consumer of a
 * scatter's result could not be computed from the rows written alone),
 * topk stores its two results directly.
 */
#include <string.h>

#include "codegen/llvm/cg_internal.h"

static void split_axis(const TensorType *t, int axis, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = *inner = 1;
  for (int i = 0; i < axis; i++) *outer *= t->dim[i];
  for (int i = axis + 1; i < t->rank; i++) *inner *= t->dim[i];
  *len = t->dim[axis];
}

/* The anchor's result must be the kernel's one epilogue result. */
static smelt_status only_own_result(CgFn *f) {
  const Node *n = &f->g->node[f->anchor];
  if (f->nepi == 1 && f->epi[0] == n->out[0]) return NULL;
  return st_error(ST_UNSUPPORTED,
                  "kernel %s: the result of '%s' (%s) must be stored as it is; elementwise consumers cannot share "
                  "its kernel on the CPU",
                  f->k->name, ir_node_name(f->g, n), ir_op_name(n->op));
}

/* Coordinates of a tensor of shape t at (outer coords oc[0..axis), a at
 * axis, inner coords ic[...]). */
static void join_coords(const TensorType *t, int axis, LLVMValueRef const *oc, LLVMValueRef a,
                        LLVMValueRef const *ic, LLVMValueRef *out) {
  for (int i = 0; i < axis; i++) out[i] = oc[i];
  out[axis] = a;
  for (int i = axis + 1; i < t->rank; i++) out[i] = ic[i - axis - 1];
}

smelt_status cg_llvm_emit_scatter(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int dv = n->in[0], iv = n->in[1], sv = n->in[2];
  const TensorType *dt = &g->val[dv].type, *it = &g->val[iv].type, *st = &g->val[sv].type;
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), dt->rank);
  if (axis < 0) return st_error(ST_INTERNAL, "kernel %s: scatter axis out of range", f->k->name);
  RETURN_IF_ERROR(only_own_result(f));
  bool in_place = ir_state_of(g, n->out[0]) >= 0;
  int64_t outer, len, inner, nidx = ir_type_numel(it);
  split_axis(dt, axis, &outer, &len, &inner);

  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ob, oe;
  cg_task_span(f, f->k->ntasks, outer, &ob, &oe);
  CgLoop lo, le, li, lj;
  LLVMValueRef o = cg_loop_begin(f, &lo, ob, oe, "o");
  LLVMValueRef oc[IR_MAX_RANK], ic[IR_MAX_RANK], c[IR_MAX_RANK], sc[IR_MAX_RANK];
  cg_delinearize(f, o, dt->dim, axis, oc);
  if (!in_place) {
    /* out[o, :, :] = dst[o, :, :] */
    LLVMValueRef e = cg_loop_begin(f, &le, cg_i64(m, 0), cg_i64(m, len * inner), "e");
    LLVMValueRef ke[2];
    int64_t li_dims[2] = {len, inner};
    cg_delinearize(f, e, li_dims, 2, ke);
    cg_delinearize(f, ke[1], dt->dim + axis + 1, dt->rank - axis - 1, ic);
    join_coords(dt, axis, oc, ke[0], ic, c);
    cg_store_epilogue(f, c, cg_emit(f, dv, c));
    cg_loop_end(f, &le, false);
  }
  /* with a ranged index count, the indices this run has */
  LLVMValueRef nidx_run = cg_i64(m, nidx);
  for (int a = 0; a < it->rank; a++)
    if (it->dyn[a] && it->dim[a] > 0) nidx_run = cg_mulc(f, cg_extent(f, it, a), nidx / it->dim[a]);
  LLVMValueRef i = cg_loop_begin(f, &li, cg_i64(m, 0), nidx_run, "i");
  LLVMValueRef ic0[1] = {i};
  LLVMValueRef k = cg_convert(m, cg_emit(f, iv, ic0), it->dt, DT_I64);
  /* unsigned: a negative index is out of range too */
  CgIf inside;
  cg_if_begin(f, &inside, LLVMBuildICmp(B, LLVMIntULT, k, cg_i64(m, len), ""), "inside");
  LLVMValueRef j = cg_loop_begin(f, &lj, cg_i64(m, 0), cg_i64(m, inner), "j");
  cg_delinearize(f, j, dt->dim + axis + 1, dt->rank - axis - 1, ic);
  join_coords(dt, axis, oc, k, ic, c);
  join_coords(st, axis, oc, i, ic, sc);
  cg_store_epilogue(f, c, cg_emit(f, sv, sc));
  cg_loop_end(f, &lj, false);
  cg_if_end(f, &inside);
  cg_loop_end(f, &li, false);
  cg_loop_end(f, &lo, false);
  return NULL;
}

smelt_status cg_llvm_emit_argmax(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int xv = n->in[0];
  const TensorType *xt = &g->val[xv].type;
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), xt->rank);
  if (axis < 0) return st_error(ST_INTERNAL, "kernel %s: argmax axis out of range", f->k->name);
  RETURN_IF_ERROR(only_own_result(f));
  bool keep = ir_attr_int(n, "keepdims") != 0;
  int64_t outer, len, inner;
  split_axis(xt, axis, &outer, &len, &inner);
  DType dt = xt->dt;
  LLVMTypeRef t = cg_ctype(m, dt);
  LLVMValueRef best = cg_alloca(f, t, 1, "best"), at = cg_alloca(f, m->t_i64, 1, "at");

  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, outer * inner, &rb, &re);
  CgLoop lr, lk;
  LLVMValueRef r = cg_loop_begin(f, &lr, rb, re, "r");
  LLVMValueRef oi[2], oc[IR_MAX_RANK], ic[IR_MAX_RANK], c[IR_MAX_RANK];
  int64_t oi_dims[2] = {outer, inner};
  cg_delinearize(f, r, oi_dims, 2, oi);
  cg_delinearize(f, oi[0], xt->dim, axis, oc);
  cg_delinearize(f, oi[1], xt->dim + axis + 1, xt->rank - axis - 1, ic);
  join_coords(xt, axis, oc, cg_i64(m, 0), ic, c);
  LLVMBuildStore(B, cg_emit(f, xv, c), best);
  LLVMBuildStore(B, cg_i64(m, 0), at);
  LLVMValueRef k = cg_loop_begin(f, &lk, cg_i64(m, 1), cg_i64(m, len), "k");
  join_coords(xt, axis, oc, k, ic, c);
  LLVMValueRef x = cg_emit(f, xv, c), b = LLVMBuildLoad2(B, t, best, "");
  LLVMValueRef take;
  if (dt_is_float(dt)) {
    /* x > best or x is NaN (unordered-greater), unless best is a NaN already */
    take = LLVMBuildAnd(B, LLVMBuildFCmp(B, LLVMRealUGT, x, b, ""), LLVMBuildFCmp(B, LLVMRealORD, b, b, ""), "");
  } else {
    bool is_unsigned = dt == DT_U8 || dt == DT_BOOL;
    take = LLVMBuildICmp(B, is_unsigned ? LLVMIntUGT : LLVMIntSGT, x, b, "");
  }
  LLVMBuildStore(B, LLVMBuildSelect(B, take, x, b, ""), best);
  LLVMBuildStore(B, LLVMBuildSelect(B, take, k, LLVMBuildLoad2(B, m->t_i64, at, ""), ""), at);
  cg_loop_end(f, &lk, false);
  LLVMValueRef res = LLVMBuildTrunc(B, LLVMBuildLoad2(B, m->t_i64, at, ""), m->t_i32, "");
  /* the result's coordinates: the other axes, with a 0 at axis if kept */
  LLVMValueRef yc[IR_MAX_RANK];
  int ny = 0;
  for (int d = 0; d < axis; d++) yc[ny++] = oc[d];
  if (keep) yc[ny++] = cg_i64(m, 0);
  for (int d = axis + 1; d < xt->rank; d++) yc[ny++] = ic[d - axis - 1];
  cg_store_epilogue(f, yc, res);
  cg_loop_end(f, &lr, false);
  return NULL;
}

/* Whether a (an element met later) beats b (kept already) in topk's order. */
static LLVMValueRef topk_beats(CgMod *m, DType dt, bool largest, LLVMValueRef a, LLVMValueRef b) {
  LLVMBuilderRef B = m->b;
  if (dt_is_float(dt)) {
    if (largest) /* a > b or a is NaN, unless b is a NaN */
      return LLVMBuildAnd(B, LLVMBuildFCmp(B, LLVMRealUGT, a, b, ""), LLVMBuildFCmp(B, LLVMRealORD, b, b, ""), "");
    /* a < b or b is NaN, unless a is a NaN */
    return LLVMBuildAnd(B, LLVMBuildFCmp(B, LLVMRealULT, a, b, ""), LLVMBuildFCmp(B, LLVMRealORD, a, a, ""), "");
  }
  bool is_unsigned = dt == DT_U8 || dt == DT_BOOL;
  LLVMIntPredicate p = largest ? (is_unsigned ? LLVMIntUGT : LLVMIntSGT) : (is_unsigned ? LLVMIntULT : LLVMIntSLT);
  return LLVMBuildICmp(B, p, a, b, "");
}

smelt_status cg_llvm_emit_topk(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int xv = n->in[0];
  const TensorType *xt = &g->val[xv].type, *yt = &g->val[n->out[0]].type;
  int axis = ir_norm_axis(ir_attr_int(n, "axis"), xt->rank);
  if (axis < 0) return st_error(ST_INTERNAL, "kernel %s: topk axis out of range", f->k->name);
  int64_t k = ir_attr_int(n, "k");
  if (k > CG_TOPK_MAX_K)
    return st_error(ST_UNSUPPORTED, "kernel %s: topk '%s' with k = %lld: the CPU kernel keeps at most %d per row",
                    f->k->name, ir_node_name(g, n), (long long)k, CG_TOPK_MAX_K);
  for (int i = 0; i < f->nepi; i++)
    if (f->epi[i] != n->out[0] && f->epi[i] != n->out[1])
      return st_error(ST_UNSUPPORTED,
                      "kernel %s: the results of '%s' (topk) must be stored as they are; elementwise consumers "
                      "cannot share its kernel on the CPU",
                      f->k->name, ir_node_name(g, n));
  bool largest = ir_attr_int(n, "largest") != 0;
  int av = -1, ai = -1; /* the output arguments of the two results (f->arg_of covers inputs only) */
  for (int i = f->nin; i < f->k->nargs; i++) {
    if (f->k->args[i] == n->out[0]) av = i;
    if (f->k->args[i] == n->out[1]) ai = i;
  }
  int64_t outer, len, inner;
  split_axis(xt, axis, &outer, &len, &inner);
  DType dt = xt->dt;
  LLVMTypeRef t = cg_ctype(m, dt);
  LLVMValueRef kv = cg_alloca(f, t, k, "topv"), ki = cg_alloca(f, m->t_i64, k, "topi");
  LLVMValueRef cnt = cg_alloca(f, m->t_i64, 1, "kept");

  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, outer * inner, &rb, &re);
  CgLoop lr, le, lq;
  LLVMValueRef r = cg_loop_begin(f, &lr, rb, re, "r");
  LLVMValueRef oi[2], oc[IR_MAX_RANK], ic[IR_MAX_RANK], c[IR_MAX_RANK];
  int64_t oi_dims[2] = {outer, inner};
  cg_delinearize(f, r, oi_dims, 2, oi);
  cg_delinearize(f, oi[0], xt->dim, axis, oc);
  cg_delinearize(f, oi[1], xt->dim + axis + 1, xt->rank - axis - 1, ic);
  LLVMBuildStore(B, cg_i64(m, 0), cnt);
  LLVMValueRef e = cg_loop_begin(f, &le, cg_i64(m, 0), cg_i64(m, len), "e");
  join_coords(xt, axis, oc, e, ic, c);
  LLVMValueRef x = cg_emit(f, xv, c);
  LLVMValueRef kept = LLVMBuildLoad2(B, m->t_i64, cnt, "");
  LLVMValueRef full = LLVMBuildICmp(B, LLVMIntEQ, kept, cg_i64(m, k), "");
  LLVMValueRef lastp = LLVMBuildInBoundsGEP2(B, t, kv, (LLVMValueRef[]){cg_i64(m, k - 1)}, 1, "");
  LLVMValueRef last = LLVMBuildLoad2(B, t, lastp, "");
  /* the last slot is read before it is written (while fewer than k are
   * kept); its value is then ignored */
  LLVMValueRef enter = LLVMBuildOr(B, LLVMBuildNot(B, full, ""), topk_beats(m, dt, largest, x, last), "");
  CgIf in;
  cg_if_begin(f, &in, enter, "enter");
  LLVMValueRef p0 = LLVMBuildSelect(B, full, cg_i64(m, k - 1), kept, "");
  LLVMBuildStore(B, LLVMBuildSelect(B, full, kept, cg_add(f, kept, cg_i64(m, 1)), ""), cnt);
  /* while (p > 0 && x beats kept[p - 1]) { kept[p] = kept[p - 1]; p--; } */
  LLVMBasicBlockRef pre = LLVMGetInsertBlock(B);
  LLVMBasicBlockRef head = LLVMAppendBasicBlockInContext(m->ctx, f->fn, "shift");
  LLVMBasicBlockRef test = LLVMAppendBasicBlockInContext(m->ctx, f->fn, "");
  LLVMBasicBlockRef move = LLVMAppendBasicBlockInContext(m->ctx, f->fn, "");
  LLVMBasicBlockRef put = LLVMAppendBasicBlockInContext(m->ctx, f->fn, "");
  LLVMBuildBr(B, head);
  LLVMPositionBuilderAtEnd(B, head);
  LLVMValueRef p = LLVMBuildPhi(B, m->t_i64, "p");
  LLVMAddIncoming(p, &p0, &pre, 1);
  LLVMBuildCondBr(B, LLVMBuildICmp(B, LLVMIntSGT, p, cg_i64(m, 0), ""), test, put);
  LLVMPositionBuilderAtEnd(B, test);
  LLVMValueRef pm = LLVMBuildNSWSub(B, p, cg_i64(m, 1), "");
  LLVMValueRef vprev_p = LLVMBuildInBoundsGEP2(B, t, kv, &pm, 1, "");
  LLVMValueRef vprev = LLVMBuildLoad2(B, t, vprev_p, "");
  LLVMBuildCondBr(B, topk_beats(m, dt, largest, x, vprev), move, put);
  LLVMPositionBuilderAtEnd(B, move);
  LLVMValueRef iprev_p = LLVMBuildInBoundsGEP2(B, m->t_i64, ki, &pm, 1, "");
  LLVMBuildStore(B, vprev, LLVMBuildInBoundsGEP2(B, t, kv, &p, 1, ""));
  LLVMBuildStore(B, LLVMBuildLoad2(B, m->t_i64, iprev_p, ""), LLVMBuildInBoundsGEP2(B, m->t_i64, ki, &p, 1, ""));
  LLVMAddIncoming(p, &pm, &move, 1);
  LLVMBuildBr(B, head);
  LLVMPositionBuilderAtEnd(B, put);
  LLVMBuildStore(B, x, LLVMBuildInBoundsGEP2(B, t, kv, &p, 1, ""));
  LLVMBuildStore(B, e, LLVMBuildInBoundsGEP2(B, m->t_i64, ki, &p, 1, ""));
  cg_if_end(f, &in);
  cg_loop_end(f, &le, false);
  /* the k pairs, best first, at positions 0..k-1 of the axis */
  LLVMValueRef q = cg_loop_begin(f, &lq, cg_i64(m, 0), cg_i64(m, k), "q");
  join_coords(yt, axis, oc, q, ic, c);
  LLVMValueRef lin = cg_linear(f, yt, c);
  if (av >= 0) cg_store_arg(f, av, lin, LLVMBuildLoad2(B, t, LLVMBuildInBoundsGEP2(B, t, kv, &q, 1, ""), ""));
  if (ai >= 0) {
    LLVMValueRef at = LLVMBuildLoad2(B, m->t_i64, LLVMBuildInBoundsGEP2(B, m->t_i64, ki, &q, 1, ""), "");
    cg_store_arg(f, ai, lin, LLVMBuildTrunc(B, at, m->t_i32, ""));
  }
  cg_loop_end(f, &lq, false);
  cg_loop_end(f, &lr, false);
  return NULL;
}

smelt_status cg_llvm_emit_arange(CgFn *f) {
  CgMod *m = f->m;
  Graph *g = f->g;
  const Node *n = &g->node[f->anchor];
  int sv = n->in[0];
  const TensorType *st = &g->val[sv].type, *yt = cg_anchor_type(f);
  RETURN_IF_ERROR(only_own_result(f));
  int64_t size = yt->dim[0];
  cg_store_loops(f, f->side, f->nside);
  LLVMValueRef ib, ie;
  cg_task_span(f, f->k->ntasks, size, &ib, &ie);
  LLVMValueRef zc[IR_MAX_RANK];
  for (int d = 0; d < IR_MAX_RANK; d++) zc[d] = cg_i64(m, 0);
  CgLoop li;
  LLVMValueRef i = cg_loop_begin(f, &li, ib, ie, "i");
  LLVMValueRef s = cg_convert(m, cg_emit(f, sv, zc), st->dt, DT_I64);
  LLVMValueRef y = cg_convert(m, LLVMBuildAdd(f->b, s, i, ""), DT_I64, yt->dt);
  LLVMValueRef yc[1] = {i};
  cg_store_epilogue(f, yc, y);
  cg_loop_end(f, &li, false);
  return NULL;
}
