/* Kernels of their own kind: attention, max_pool2d and avg_pool2d.
 *
 * attention: f32 with several queries (S > 1) and head dims of whole
 * vectors goes by blocks of queries (emit_attention_blocked, below); else
 * one task per query row (b, h, i).  The row of q, times the
 * scale, is kept on the stack (in f32 vector registers when the head dim
 * is a few whole vectors); the keys are visited once, in blocks of
 * ATT_KEYS, with an online softmax: a block's scores (dot products in f32
 * vectors over the head dim), then one rescale of the running sum l and of
 * the Dv output accumulators by exp(m_old - m_new) when the block raises
 * the maximum m, then the block's exps (one vector exp for f32) and each
 * key's row of v added; so the T scores are never stored, and the
 * softmax's serial chain is one step a block.  Grouped-query attention reads kv head
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

/* f32 attention's vectors: VL lanes (the target's f32 width) over the
 * head dim; 1 (scalar code only) for other dtypes or a scalar target. */
typedef struct {
  int vl;
  LLVMTypeRef vt;
} AttVec;

/* The VL elements at buf[i ..] of a stack buffer, as a vector pointer. */
static LLVMValueRef vec_at(CgFn *f, const AttVec *a, LLVMTypeRef t, LLVMValueRef buf, LLVMValueRef i) {
  return LLVMBuildBitCast(f->b, at_index(f, t, buf, i), LLVMPointerType(a->vt, 0), "");
}

static LLVMValueRef vec_load(CgFn *f, const AttVec *a, LLVMValueRef p) {
  LLVMValueRef v = LLVMBuildLoad2(f->b, a->vt, p, "");
  LLVMSetAlignment(v, 4);
  return v;
}

static void vec_store(CgFn *f, LLVMValueRef v, LLVMValueRef p) { LLVMSetAlignment(LLVMBuildStore(f->b, v, p), 4); }

/* Operand `value` at coords c[0..2] and c[3] = d0 .. d0 + VL - 1, as a
 * vector: one load from an f32 argument, else VL elements read through
 * cg_emit (so fused producers work). */
static LLVMValueRef vec_emit(CgFn *f, const AttVec *a, int value, LLVMValueRef c0, LLVMValueRef c1, LLVMValueRef c2,
                             LLVMValueRef d0) {
  const Value *val = &f->g->val[value];
  int arg = f->arg_of[value];
  if (arg >= 0 && val->type.dt == DT_F32) {
    /* an f32 argument (row-major, the head dim last): one vector load */
    LLVMValueRef c[4] = {c0, c1, c2, d0}, lin = cg_linear(f, &val->type, c);
    LLVMValueRef p = LLVMBuildInBoundsGEP2(f->b, f->m->t_f32, f->base[arg], &lin, 1, "");
    LLVMValueRef v = vec_load(f, a, LLVMBuildBitCast(f->b, p, LLVMPointerType(a->vt, 0), ""));
    cg_tag_access(f, v);
    return v;
  }
  LLVMValueRef v = LLVMGetUndef(a->vt);
  for (int l = 0; l < a->vl; l++) {
    LLVMValueRef c[4] = {c0, c1, c2, cg_add(f, d0, cg_i64(f->m, l))};
    v = LLVMBuildInsertElement(f->b, v, cg_emit(f, value, c), cg_i32(f->m, l), "");
  }
  return v;
}

static LLVMValueRef vec_splat(CgFn *f, const AttVec *a, LLVMValueRef x) {
  LLVMValueRef v = LLVMBuildInsertElement(f->b, LLVMGetUndef(a->vt), x, cg_i32(f->m, 0), "");
  return LLVMBuildShuffleVector(f->b, v, LLVMGetUndef(a->vt), LLVMConstNull(LLVMVectorType(f->m->t_i32, (unsigned)a->vl)), "");
}

/* The sum of v's lanes, by halves (log2 VL shuffles and adds). */
static LLVMValueRef vec_sum(CgFn *f, const AttVec *a, LLVMValueRef v) {
  for (int w = a->vl / 2; w >= 1; w /= 2) {
    LLVMValueRef idx[16];
    for (int l = 0; l < a->vl; l++) idx[l] = cg_i32(f->m, l < w ? l + w : l);
    v = LLVMBuildFAdd(f->b, v, LLVMBuildShuffleVector(f->b, v, LLVMGetUndef(a->vt), LLVMConstVector(idx, (unsigned)a->vl), ""), "");
  }
  return LLVMBuildExtractElement(f->b, v, cg_i32(f->m, 0), "");
}

/* The keys a block of attention's online softmax takes at once. */
#define ATT_KEYS 16
/* Head dims of up to this many whole f32 vectors stay in registers. */
#define ATT_REG_VECS 8

/* One query row's state in attention's loops. */
typedef struct {
  CgFn *f;
  const AttVec *av;
  LLVMTypeRef t;
  LLVMValueRef qbuf, acc;
  int kv, vv, mv;
  LLVMValueRef *rc; /* b, h, i */
  LLVMValueRef hk;  /* the kv head */
  int64_t D, Dv;
  DType dt;
  /* a head dim of at most ATT_REG_VECS whole vectors: q's vectors (values)
   * and acc's (allocas of one vector each, which mem2reg keeps in
   * registers across the keys); nq, na 0 otherwise */
  int nq, na;
  LLVMValueRef qv[ATT_REG_VECS], accv[ATT_REG_VECS];
} Att;

/* The score of key j: q (already scaled) . k_j, VL lanes of partial sums
 * over the head dim (independent adds, not one chain of D) added by
 * halves, then the rest element by element; plus the mask. */
static LLVMValueRef att_score(const Att *a, LLVMValueRef j, LLVMValueRef dot, LLVMValueRef vdot) {
  CgFn *f = a->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  const AttVec *av = a->av;
  LLVMTypeRef t = a->t;
  int64_t nvd = av->vl > 1 ? a->D / av->vl : 0;
  CgLoop lk;
  if (a->nq > 0) {
    /* q in registers: one product a vector, added by pairs */
    LLVMValueRef part[ATT_REG_VECS];
    for (int i = 0; i < a->nq; i++)
      part[i] = LLVMBuildFMul(B, a->qv[i], vec_emit(f, av, a->kv, a->rc[0], a->hk, j, cg_i64(m, (int64_t)i * av->vl)), "");
    for (int w = 1; w < a->nq; w *= 2)
      for (int i = 0; i + w < a->nq; i += 2 * w) part[i] = LLVMBuildFAdd(B, part[i], part[i + w], "");
    LLVMBuildStore(B, vec_sum(f, av, part[0]), dot);
    nvd = a->nq;
  } else if (nvd > 0) {
    vec_store(f, LLVMConstNull(av->vt), vdot);
    LLVMValueRef d = cg_loop_begin(f, &lk, cg_i64(m, 0), cg_i64(m, nvd), "dv");
    LLVMValueRef d0 = cg_mulc(f, d, av->vl);
    LLVMValueRef prod = LLVMBuildFMul(B, vec_load(f, av, vec_at(f, av, t, a->qbuf, d0)), vec_emit(f, av, a->kv, a->rc[0], a->hk, j, d0), "");
    vec_store(f, LLVMBuildFAdd(B, vec_load(f, av, vdot), prod, ""), vdot);
    cg_loop_end(f, &lk, false);
    LLVMBuildStore(B, vec_sum(f, av, vec_load(f, av, vdot)), dot);
  } else {
    LLVMBuildStore(B, cg_fconst(t, 0), dot);
  }
  if (nvd * av->vl < a->D) {
    LLVMValueRef d = cg_loop_begin(f, &lk, cg_i64(m, nvd * av->vl), cg_i64(m, a->D), "d");
    LLVMValueRef kc[4] = {a->rc[0], a->hk, j, d};
    LLVMValueRef prod = LLVMBuildFMul(B, LLVMBuildLoad2(B, t, at_index(f, t, a->qbuf, d), ""), cg_emit(f, a->kv, kc), "");
    LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildLoad2(B, t, dot, ""), prod, ""), dot);
    cg_loop_end(f, &lk, true);
  }
  LLVMValueRef s = LLVMBuildLoad2(B, t, dot, "");
  if (a->mv >= 0) {
    const TensorType *mt = &f->g->val[a->mv].type;
    LLVMValueRef full[4] = {a->rc[0], a->rc[1], a->rc[2], j}, mc[IR_MAX_RANK];
    cg_bcast_coords(f, mt, 4, full, mc);
    LLVMValueRef mval = cg_emit(f, a->mv, mc);
    if (mt->dt == DT_BOOL) s = LLVMBuildSelect(B, mval, s, cg_fconst(t, -INFINITY), "");
    else s = LLVMBuildFAdd(B, s, cg_convert(m, mval, mt->dt, a->dt), "");
  }
  return s;
}

/* The accumulators over the Dv outputs, VL lanes at a time and then the
 * rest: acc *= corr (p NULL), or acc += p v_j. */
static void att_acc(const Att *a, LLVMValueRef corr, LLVMValueRef p, LLVMValueRef j) {
  CgFn *f = a->f;
  CgMod *m = f->m;
  LLVMBuilderRef B = f->b;
  const AttVec *av = a->av;
  int64_t nvv = a->na > 0 ? a->na : av->vl > 1 ? a->Dv / av->vl : 0;
  LLVMValueRef vs = nvv > 0 ? vec_splat(f, av, p ? p : corr) : NULL;
  CgLoop ld;
  for (int i = 0; i < a->na; i++) {
    /* in registers */
    LLVMValueRef x = LLVMBuildLoad2(B, av->vt, a->accv[i], "");
    x = p ? LLVMBuildFAdd(B, x, LLVMBuildFMul(B, vs, vec_emit(f, av, a->vv, a->rc[0], a->hk, j, cg_i64(m, (int64_t)i * av->vl)), ""), "")
          : LLVMBuildFMul(B, x, vs, "");
    LLVMBuildStore(B, x, a->accv[i]);
  }
  if (a->na > 0) return;
  if (nvv > 0) {
    LLVMValueRef d = cg_loop_begin(f, &ld, cg_i64(m, 0), cg_i64(m, nvv), "dv");
    LLVMValueRef d0 = cg_mulc(f, d, av->vl), ap = vec_at(f, av, a->t, a->acc, d0), x = vec_load(f, av, ap);
    x = p ? LLVMBuildFAdd(B, x, LLVMBuildFMul(B, vs, vec_emit(f, av, a->vv, a->rc[0], a->hk, j, d0), ""), "") : LLVMBuildFMul(B, x, vs, "");
    vec_store(f, x, ap);
    cg_loop_end(f, &ld, false);
  }
  LLVMValueRef d = cg_loop_begin(f, &ld, cg_i64(m, nvv * av->vl), cg_i64(m, a->Dv), "d");
  LLVMValueRef vc[4] = {a->rc[0], a->hk, j, d};
  LLVMValueRef ap = at_index(f, a->t, a->acc, d), x = LLVMBuildLoad2(B, a->t, ap, "");
  x = p ? LLVMBuildFAdd(B, x, LLVMBuildFMul(B, p, cg_emit(f, a->vv, vc), ""), "") : LLVMBuildFMul(B, x, corr, "");
  LLVMBuildStore(B, x, ap);
  cg_loop_end(f, &ld, false);
}

/* ---- attention by blocks of queries (f32 prefill) ----
 * With several queries a head (S > 1) and f32 head dims of whole vectors,
 * a task takes QB query rows of one head (b, h, i0 .. i0 + QB) and the
 * keys in blocks of VL (the vector width), so that every instruction of
 * the inner loops is a full-width multiply-add shared by the block:
 *   - the block's keys are transposed in registers (VL x VL tiles,
 *     cg_transpose_square) into kt[D][VL], once for the QB queries;
 *   - query r's VL scores are one vector, sum over d of q[r][d] (scaled,
 *     broadcast) times kt[d]: D multiply-adds in two chains, no horizontal
 *     sum a key;
 *   - keys past the query's last (causal, cache positions, the last block
 *     past T) score -inf; a mask is read a lane at a time;
 *   - the online softmax a block: the block's maximum m_b; when it raises
 *     m, the running sums are rescaled by exp(m - m_b) and m = m_b (a
 *     branch: after the first blocks the maximum rarely moves); then
 *     p = exp(s - m) (0 where s is -inf), the running sum kept as a vector
 *     of lanes, l += p;
 *   - each key's row of v, loaded once, is added to the QB queries'
 *     accumulators (QB x Dv/VL vectors, in registers) times its p
 *     broadcast from the lane.
 * A key past the last one a query takes meets a weight of exactly 0, as
 * the reference's dense p @ v; a row of the last, partial block of keys
 * reads key T - 1 again for the lanes past T, with weight 0.  NaN scores
 * give NaN weights and so NaN rows, as in the reference. */
#define ATTB_MAX_ACC 16 /* accumulator vectors of a task: QB x Dv/VL */

typedef struct {
  AttVec av;
  int kv, vv, mv, pv;
  int64_t Hq, Hkv, S, T, D, Dv;
  bool causal, cache;
  double scale;
  int qb, nd, ndv; /* queries a task, vectors of D and of Dv */
} AttB;

static bool attb_ok(const CgFn *f, const Node *n, int *out_qb) {
  const Graph *g = f->g;
  const TensorType *qt = &g->val[n->in[0]].type, *vt = &g->val[n->in[2]].type;
  int vl = f->m->f32_lanes;
  if (qt->dt != DT_F32 || (vl != 8 && vl != 16) || qt->dim[2] < 2) return false;
  int64_t D = qt->dim[3], Dv = vt->dim[3];
  if (D % vl || Dv % vl || D / vl > ATT_REG_VECS || Dv / vl > ATT_REG_VECS || D == 0 || Dv == 0) return false;
  int qb = (int)(ATTB_MAX_ACC / (Dv / vl));
  *out_qb = qb > 4 ? 4 : qb < 1 ? 1 : qb;
  return true;
}

/* The NaN-ignoring maximum of v's lanes (a NaN score makes its own weight
 * NaN, which reaches the row). */
static LLVMValueRef attb_hmax(CgFn *f, const AttVec *a, LLVMValueRef v) {
  LLVMBuilderRef B = f->b;
  for (int w = a->vl / 2; w >= 1; w /= 2) {
    LLVMValueRef idx[16];
    for (int l = 0; l < a->vl; l++) idx[l] = cg_i32(f->m, l < w ? l + w : l);
    LLVMValueRef o = LLVMBuildShuffleVector(B, v, LLVMGetUndef(a->vt), LLVMConstVector(idx, (unsigned)a->vl), "");
    v = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, o, v, ""), o, v, "");
  }
  return LLVMBuildExtractElement(B, v, cg_i32(f->m, 0), "");
}

/* <vl x i64> of x in every lane. */
static LLVMValueRef i64_splat(CgFn *f, int vl, LLVMValueRef x) {
  LLVMTypeRef vi = LLVMVectorType(f->m->t_i64, (unsigned)vl);
  LLVMValueRef v = LLVMBuildInsertElement(f->b, LLVMGetUndef(vi), x, cg_i32(f->m, 0), "");
  return LLVMBuildShuffleVector(f->b, v, LLVMGetUndef(vi), LLVMConstNull(LLVMVectorType(f->m->t_i32, (unsigned)vl)), "");
}

static void emit_attention_blocked(CgFn *f, AttB *A) {
  CgMod *m = f->m;
  Graph *g = f->g;
  LLVMBuilderRef B = f->b;
  const Node *n = &g->node[f->anchor];
  int qv = n->in[0];
  const TensorType *qt = &g->val[qv].type;
  const AttVec *av = &A->av;
  int vl = av->vl, QB = A->qb;
  LLVMTypeRef t = m->t_f32, vt = av->vt;
  LLVMValueRef ninf = cg_fconst(t, -INFINITY), vninf = vec_splat(f, av, ninf), vzero = LLVMConstNull(av->vt);
  LLVMValueRef qs = cg_alloca(f, t, (int64_t)QB * A->D, "qs"), kt = cg_alloca(f, t, A->D * vl, "kt");
  LLVMValueRef obuf = cg_alloca(f, t, A->Dv, "o"), pbuf = cg_alloca(f, t, (int64_t)QB * vl, "p");
  LLVMValueRef acc[ATTB_MAX_ACC], lsum[4], mrow[4];
  for (int i = 0; i < QB * A->ndv; i++) acc[i] = cg_alloca(f, av->vt, 1, "acc");
  for (int r = 0; r < QB; r++) {
    lsum[r] = cg_alloca(f, av->vt, 1, "l");
    mrow[r] = cg_alloca(f, t, 1, "m");
  }

  cg_store_loops(f, f->side, f->nside);
  int64_t nqb = (A->S + QB - 1) / QB, units = qt->dim[0] * A->Hq * nqb;
  LLVMValueRef ub, ue;
  cg_task_span(f, f->k->ntasks, units, &ub, &ue);
  CgLoop lu, lb, ld, lc;
  LLVMValueRef unit = cg_loop_begin(f, &lu, ub, ue, "unit");
  int64_t udims[3] = {qt->dim[0], A->Hq, nqb};
  LLVMValueRef uc[3];
  cg_delinearize(f, unit, udims, 3, uc);
  LLVMValueRef b = uc[0], h = uc[1], i0 = cg_mulc(f, uc[2], QB);
  LLVMValueRef hk = LLVMBuildUDiv(B, h, cg_i64(m, A->Hq / A->Hkv), "");
  /* query r is row min(i0 + r, S - 1) (rows past S are computed, not stored) */
  LLVMValueRef qi[4], jend[4], jmax = cg_i64(m, 0);
  for (int r = 0; r < QB; r++) {
    qi[r] = cg_min(f, cg_add(f, i0, cg_i64(m, r)), cg_i64(m, A->S - 1));
    jend[r] = cg_i64(m, A->T);
    if (A->cache) {
      LLVMValueRef pc[1] = {qi[r]};
      LLVMValueRef p = cg_convert(m, cg_emit(f, A->pv, pc), g->val[A->pv].type.dt, DT_I64);
      jend[r] = cg_max(f, cg_add(f, cg_min(f, p, cg_i64(m, A->T - 1)), cg_i64(m, 1)), cg_i64(m, 0));
    } else if (A->causal) {
      jend[r] = cg_min(f, jend[r], cg_max(f, cg_add(f, qi[r], cg_i64(m, A->T - A->S + 1)), cg_i64(m, 0)));
    }
    jmax = cg_max(f, jmax, jend[r]);
    LLVMValueRef d = cg_loop_begin(f, &ld, cg_i64(m, 0), cg_i64(m, A->D), "d");
    LLVMValueRef qc[4] = {b, h, qi[r], d};
    LLVMBuildStore(B, LLVMBuildFMul(B, cg_emit(f, qv, qc), cg_fconst(t, A->scale), ""),
                   at_index(f, t, qs, cg_add(f, d, cg_i64(m, (int64_t)r * A->D))));
    cg_loop_end(f, &ld, false);
    LLVMBuildStore(B, ninf, mrow[r]);
    LLVMBuildStore(B, vzero, lsum[r]);
    for (int v = 0; v < A->ndv; v++) LLVMBuildStore(B, vzero, acc[r * A->ndv + v]);
  }
  LLVMValueRef lanes[16];
  for (int l = 0; l < vl; l++) lanes[l] = LLVMConstInt(m->t_i64, (unsigned long long)l, 0);
  LLVMValueRef lane_iota = LLVMConstVector(lanes, (unsigned)vl);

  LLVMValueRef nblk = LLVMBuildUDiv(B, cg_add(f, jmax, cg_i64(m, vl - 1)), cg_i64(m, vl), "");
  LLVMValueRef blk = cg_loop_begin(f, &lb, cg_i64(m, 0), nblk, "kb");
  LLVMValueRef j0 = cg_mulc(f, blk, vl);
  LLVMValueRef key[16];
  for (int c = 0; c < vl; c++) key[c] = cg_min(f, cg_add(f, j0, cg_i64(m, c)), cg_i64(m, A->T - 1));
  /* kt: the block's keys by d, a VL x VL tile at a time */
  for (int tile = 0; tile < A->nd; tile++) {
    LLVMValueRef rows[16];
    for (int c = 0; c < vl; c++) rows[c] = vec_emit(f, av, A->kv, b, hk, key[c], cg_i64(m, (int64_t)tile * vl));
    cg_transpose_square(m, rows, vl);
    for (int i = 0; i < vl; i++) vec_store(f, rows[i], vec_at(f, av, t, kt, cg_i64(m, (int64_t)(tile * vl + i) * vl)));
  }
  LLVMValueRef keys = LLVMBuildAdd(B, i64_splat(f, vl, j0), lane_iota, "");
  /* the scores: each kt[d] loaded once for the QB queries, two chains a query */
  LLVMValueRef p[4], s2[4][2];
  for (int r = 0; r < QB; r++) s2[r][0] = s2[r][1] = vzero;
  for (int d = 0; d < A->D; d++) {
    LLVMValueRef kd = vec_load(f, av, vec_at(f, av, t, kt, cg_i64(m, (int64_t)d * vl)));
    for (int r = 0; r < QB; r++) {
      LLVMValueRef qd = vec_splat(f, av, LLVMBuildLoad2(B, t, at_index(f, t, qs, cg_i64(m, (int64_t)r * A->D + d)), ""));
      LLVMValueRef args[3] = {qd, kd, s2[r][d & 1]};
      s2[r][d & 1] = cg_intrinsic(m, "llvm.fmuladd", &vt, 1, args, 3);
    }
  }
  for (int r = 0; r < QB; r++) {
    LLVMValueRef s = LLVMBuildFAdd(B, s2[r][0], s2[r][1], "");
    if (A->mv >= 0) {
      const TensorType *mt = &g->val[A->mv].type;
      LLVMValueRef mvec = LLVMGetUndef(mt->dt == DT_BOOL ? LLVMVectorType(m->t_i1, (unsigned)vl) : av->vt);
      for (int c = 0; c < vl; c++) {
        LLVMValueRef full[4] = {b, h, qi[r], key[c]}, mc[IR_MAX_RANK];
        cg_bcast_coords(f, mt, 4, full, mc);
        LLVMValueRef mval = cg_emit(f, A->mv, mc);
        if (mt->dt != DT_BOOL) mval = cg_convert(m, mval, mt->dt, DT_F32);
        mvec = LLVMBuildInsertElement(B, mvec, mval, cg_i32(m, c), "");
      }
      s = mt->dt == DT_BOOL ? LLVMBuildSelect(B, mvec, s, vninf, "") : LLVMBuildFAdd(B, s, mvec, "");
    }
    /* keys past the row's last: -inf */
    s = LLVMBuildSelect(B, LLVMBuildICmp(B, LLVMIntSLT, keys, i64_splat(f, vl, jend[r]), ""), s, vninf, "");
    /* the online softmax's step; the running sums are rescaled only when
     * the block raises the maximum (after the first blocks, rarely) */
    LLVMValueRef mold = LLVMBuildLoad2(B, t, mrow[r], "");
    LLVMValueRef bm = attb_hmax(f, av, s);
    CgIf raise;
    cg_if_begin(f, &raise, LLVMBuildFCmp(B, LLVMRealOGT, bm, mold, ""), "raise");
    LLVMValueRef vcorr = vec_splat(f, av, cg_exp(m, LLVMBuildFSub(B, mold, bm, "")));
    LLVMBuildStore(B, bm, mrow[r]);
    LLVMBuildStore(B, LLVMBuildFMul(B, LLVMBuildLoad2(B, vt, lsum[r], ""), vcorr, ""), lsum[r]);
    for (int v = 0; v < A->ndv; v++)
      LLVMBuildStore(B, LLVMBuildFMul(B, LLVMBuildLoad2(B, vt, acc[r * A->ndv + v], ""), vcorr, ""), acc[r * A->ndv + v]);
    cg_if_end(f, &raise);
    /* p = exp(s - m), exactly 0 for a key scored -inf (m may still be -inf) */
    LLVMValueRef mnew = LLVMBuildLoad2(B, t, mrow[r], "");
    LLVMValueRef pe = cg_exp(m, LLVMBuildFSub(B, s, vec_splat(f, av, mnew), ""));
    p[r] = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOEQ, s, vninf, ""), vzero, pe, "");
    LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildLoad2(B, vt, lsum[r], ""), p[r], ""), lsum[r]);
  }
  for (int r = 0; r < QB; r++) vec_store(f, p[r], vec_at(f, av, t, pbuf, cg_i64(m, (int64_t)r * vl)));
  /* p @ v: each key's row once, for the QB queries */
  for (int c = 0; c < vl; c++) {
    LLVMValueRef vrow[ATT_REG_VECS];
    for (int v = 0; v < A->ndv; v++) vrow[v] = vec_emit(f, av, A->vv, b, hk, key[c], cg_i64(m, (int64_t)v * vl));
    for (int r = 0; r < QB; r++) {
      /* a broadcast load (an operand of the multiply-add), not a shuffle */
      LLVMValueRef pc = vec_splat(f, av, LLVMBuildLoad2(B, t, at_index(f, t, pbuf, cg_i64(m, (int64_t)r * vl + c)), ""));
      for (int v = 0; v < A->ndv; v++) {
        LLVMValueRef slot = acc[r * A->ndv + v];
        LLVMValueRef args[3] = {pc, vrow[v], LLVMBuildLoad2(B, av->vt, slot, "")};
        LLVMBuildStore(B, cg_intrinsic(m, "llvm.fmuladd", &vt, 1, args, 3), slot);
      }
    }
  }
  cg_loop_end(f, &lb, false);

  /* the rows: acc / l, the valid ones through the epilogue */
  for (int r = 0; r < QB; r++) {
    CgIf valid;
    cg_if_begin(f, &valid, LLVMBuildICmp(B, LLVMIntSLT, cg_add(f, i0, cg_i64(m, r)), cg_i64(m, A->S), ""), "row");
    LLVMValueRef l = vec_sum(f, av, LLVMBuildLoad2(B, av->vt, lsum[r], ""));
    LLVMValueRef inv = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, l, cg_fconst(t, 0), ""),
                                       LLVMBuildFDiv(B, cg_fconst(t, 1), l, ""), cg_fconst(t, 0), "");
    for (int v = 0; v < A->ndv; v++)
      vec_store(f, LLVMBuildLoad2(B, av->vt, acc[r * A->ndv + v], ""), vec_at(f, av, t, obuf, cg_i64(m, (int64_t)v * vl)));
    LLVMValueRef d = cg_loop_begin(f, &lc, cg_i64(m, 0), cg_i64(m, A->Dv), "d");
    LLVMValueRef oc[4] = {b, h, qi[r], d};
    cg_store_epilogue(f, oc, LLVMBuildFMul(B, LLVMBuildLoad2(B, t, at_index(f, t, obuf, d), ""), inv, ""));
    cg_loop_end(f, &lc, false);
    cg_if_end(f, &valid);
  }
  cg_loop_end(f, &lu, false);
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
  int qb;
  /* with a ranged dim the runtime runs a subset of the per-row tasks
   * (codegen/ranges.c), which the blocked kernel's units do not follow */
  if (!f->k->rg.range && attb_ok(f, n, &qb)) {
    AttB A = {{m->f32_lanes, LLVMVectorType(m->t_f32, (unsigned)m->f32_lanes)}, kv, vv, mv, pv, Hq, Hkv, S, T, D, Dv, causal,
              cache, scale, qb, (int)(D / m->f32_lanes), (int)(Dv / m->f32_lanes)};
    emit_attention_blocked(f, &A);
    return NULL;
  }
  LLVMTypeRef t = cg_ctype(m, dt);
  LLVMValueRef qbuf = cg_alloca(f, t, D, "q"), acc = cg_alloca(f, t, Dv, "acc");
  LLVMValueRef mx = cg_alloca(f, t, 1, "m"), sum = cg_alloca(f, t, 1, "l"), dot = cg_alloca(f, t, 1, "s");
  AttVec av = {dt == DT_F32 && m->f32_lanes > 1 && m->f32_lanes <= 16 ? m->f32_lanes : 1, NULL};
  av.vt = LLVMVectorType(t, (unsigned)av.vl);
  LLVMValueRef vdot = av.vl > 1 ? cg_alloca(f, av.vt, 1, "sv") : NULL;
  LLVMValueRef accv[ATT_REG_VECS] = {0};
  for (int i = 0; av.vl > 1 && i < ATT_REG_VECS && (i + 1) * av.vl <= Dv; i++)
    accv[i] = cg_alloca(f, av.vt, 1, "accv");
  LLVMValueRef zero = cg_fconst(t, 0), ninf = cg_fconst(t, -INFINITY);

  cg_store_loops(f, f->side, f->nside);
  int64_t rows = qt->dim[0] * Hq * S;
  LLVMValueRef rb, re;
  cg_task_span(f, f->k->ntasks, rows, &rb, &re);
  CgLoop lrow, ld, lj;
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
  /* the keys in blocks of ATT_KEYS: each block's scores first (independent
   * dot products), then one rescale of the running sums by the block's new
   * maximum, then every key's exp and its row of v added; the online
   * softmax's serial chain (max, exp, rescale) is one a block, not one a key */
  Att a = {f, &av, t, qbuf, acc, kv, vv, mv, rc, hk, D, Dv, dt, 0, 0, {0}, {0}};
  if (av.vl > 1 && D % av.vl == 0 && D / av.vl <= ATT_REG_VECS) {
    a.nq = (int)(D / av.vl);
    for (int i = 0; i < a.nq; i++) a.qv[i] = vec_load(f, &av, vec_at(f, &av, t, qbuf, cg_i64(m, (int64_t)i * av.vl)));
  }
  if (av.vl > 1 && Dv % av.vl == 0 && Dv / av.vl <= ATT_REG_VECS) {
    a.na = (int)(Dv / av.vl);
    for (int i = 0; i < a.na; i++) {
      a.accv[i] = accv[i];
      LLVMBuildStore(B, LLVMConstNull(av.vt), accv[i]);
    }
  }
  LLVMValueRef sc = cg_alloca(f, t, ATT_KEYS, "sc"), bmax = cg_alloca(f, t, 1, "bm");
  LLVMValueRef nblk = LLVMBuildUDiv(B, cg_add(f, jend, cg_i64(m, ATT_KEYS - 1)), cg_i64(m, ATT_KEYS), "");
  /* f32: the block's exps as vectors (its scores past the last key -inf) */
  bool vexp = av.vl > 1 && ATT_KEYS % av.vl == 0;
  LLVMValueRef pbuf = vexp ? cg_alloca(f, t, ATT_KEYS, "p") : NULL;
  LLVMValueRef blk = cg_loop_begin(f, &lj, cg_i64(m, 0), nblk, "kb");
  LLVMValueRef j0 = cg_mulc(f, blk, ATT_KEYS), nb = cg_min(f, LLVMBuildNSWSub(B, jend, j0, ""), cg_i64(m, ATT_KEYS));
  LLVMBuildStore(B, ninf, bmax);
  for (int c = 0; vexp && c < ATT_KEYS / av.vl; c++) vec_store(f, vec_splat(f, &av, ninf), vec_at(f, &av, t, sc, cg_i64(m, (int64_t)c * av.vl)));
  CgLoop lq;
  LLVMValueRef jj = cg_loop_begin(f, &lq, cg_i64(m, 0), nb, "kj");
  LLVMValueRef s = att_score(&a, cg_add(f, j0, jj), dot, vdot);
  LLVMBuildStore(B, s, at_index(f, t, sc, jj));
  /* the block's maximum, NaN once a score is NaN (which then reaches the output) */
  LLVMValueRef bm = LLVMBuildLoad2(B, t, bmax, "");
  LLVMValueRef take = LLVMBuildAnd(B, LLVMBuildFCmp(B, LLVMRealUGT, s, bm, ""), LLVMBuildFCmp(B, LLVMRealORD, bm, bm, ""), "");
  LLVMBuildStore(B, LLVMBuildSelect(B, take, s, bm, ""), bmax);
  cg_loop_end(f, &lq, false);
  /* a block of masked keys only changes nothing (and exp(-inf - -inf) would be NaN) */
  CgIf live;
  LLVMValueRef bmv = LLVMBuildLoad2(B, t, bmax, "");
  cg_if_begin(f, &live, LLVMBuildFCmp(B, LLVMRealUNE, bmv, ninf, ""), "live");
  LLVMValueRef mold = LLVMBuildLoad2(B, t, mx, "");
  LLVMValueRef mnew = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOGT, bmv, mold, ""), bmv, mold, "");
  LLVMValueRef corr = cg_exp(m, LLVMBuildFSub(B, mold, mnew, ""));
  LLVMBuildStore(B, LLVMBuildFMul(B, LLVMBuildLoad2(B, t, sum, ""), corr, ""), sum);
  LLVMBuildStore(B, mnew, mx);
  att_acc(&a, corr, NULL, NULL);
  for (int c = 0; vexp && c < ATT_KEYS / av.vl; c++) {
    /* p = exp(s - m) of VL keys at once, 0 for a masked one (and past the last) */
    LLVMValueRef sv = vec_load(f, &av, vec_at(f, &av, t, sc, cg_i64(m, (int64_t)c * av.vl)));
    LLVMValueRef pe = cg_exp(m, LLVMBuildFSub(B, sv, vec_splat(f, &av, mnew), ""));
    pe = LLVMBuildSelect(B, LLVMBuildFCmp(B, LLVMRealOEQ, sv, vec_splat(f, &av, ninf), ""), LLVMConstNull(av.vt), pe, "");
    vec_store(f, pe, vec_at(f, &av, t, pbuf, cg_i64(m, (int64_t)c * av.vl)));
    LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildLoad2(B, t, sum, ""), vec_sum(f, &av, pe), ""), sum);
  }
  jj = cg_loop_begin(f, &lq, cg_i64(m, 0), nb, "kj");
  s = LLVMBuildLoad2(B, t, at_index(f, t, sc, jj), "");
  CgIf key;
  cg_if_begin(f, &key, LLVMBuildFCmp(B, LLVMRealUNE, s, ninf, ""), "key"); /* a masked key adds nothing */
  LLVMValueRef pk;
  if (vexp) {
    pk = LLVMBuildLoad2(B, t, at_index(f, t, pbuf, jj), "");
  } else {
    pk = cg_exp(m, LLVMBuildFSub(B, s, mnew, ""));
    LLVMBuildStore(B, LLVMBuildFAdd(B, LLVMBuildLoad2(B, t, sum, ""), pk, ""), sum);
  }
  att_acc(&a, NULL, pk, cg_add(f, j0, jj));
  cg_if_end(f, &key);
  cg_loop_end(f, &lq, false);
  cg_if_end(f, &live);
  cg_loop_end(f, &lj, false);

  for (int i = 0; i < a.na; i++) vec_store(f, LLVMBuildLoad2(B, av.vt, a.accv[i], ""), vec_at(f, &av, t, acc, cg_i64(m, (int64_t)i * av.vl)));
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
