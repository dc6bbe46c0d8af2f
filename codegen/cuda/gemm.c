/* A contraction as a batch of GEMMs, C[M,N] = A[M,K] B[K,N] over a third
 * dimension z, which every contraction kernel (the simple one in
 * contraction.c, the families in mma.c, tf32.c, gemv.c, wgmma.c) reads:
 *   matmul   z = the broadcast batch, A and B the (transposed) operands;
 *   conv2d   z = the group, A[m,k] = w[g*Og + m, c, kh, kw] with
 *            k = (c, kh, kw), B[k,p] = x[n, g*Cg + c, ih, iw] with
 *            p = (n, oh, ow) (implicit GEMM: the im2col matrix is never
 *            built; padding reads as 0).
 * The loaders emit an operand element with cu_emit, so whatever computes
 * an operand inside the group (a transpose, a cast) is fused into the
 * load; the result callback gives the anchor's coordinates and value
 * (bias added, integers normalised) for C[m, n].
 */
#include <stdlib.h>
#include <string.h>

#include "codegen/cuda/cu_gemm.h"

typedef CuGemm Gemm;

/* ---- matmul ---- */

/* The batch coordinates of operand t (rank - 2 batch dims) for the result
 * batch index z: delinearised over the result's batch dims, broadcast. */
static void batch_coords(CuFn *f, const Gemm *gm, const char *z, const TensorType *t, CuCoords *out) {
  TensorType bt = {.dt = gm->yt->dt, .rank = gm->nbatch};
  for (int d = 0; d < gm->nbatch; d++) bt.dim[d] = gm->yt->dim[d];
  CuCoords zc;
  cu_delinearize(f, z, &bt, &zc);
  TensorType ob = {.dt = t->dt, .rank = t->rank - 2};
  for (int d = 0; d < ob.rank; d++) ob.dim[d] = t->dim[d];
  cu_bcast_coords(&ob, &zc, out);
  out->rank = t->rank;
}

static void mm_load_a(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *k, CuVal *out) {
  CuCoords co;
  if (gm->a1) {
    cu_coords_scalar(&co, 1, &k);
  } else {
    batch_coords(f, gm, z, gm->at, &co);
    int r = gm->at->rank;
    co.c[r - 2] = gm->ta ? k : m;
    co.c[r - 1] = gm->ta ? m : k;
    co.step[r - 2] = co.step[r - 1] = 0;
  }
  cu_emit(f, gm->an->in[0], &co, out);
}

static void mm_load_b(CuFn *f, const Gemm *gm, const char *z, const char *k, const char *n, CuVal *out) {
  CuCoords co;
  if (gm->b1) {
    cu_coords_scalar(&co, 1, &k);
  } else {
    batch_coords(f, gm, z, gm->bt, &co);
    int r = gm->bt->rank;
    co.c[r - 2] = gm->tb ? n : k;
    co.c[r - 1] = gm->tb ? k : n;
    co.step[r - 2] = co.step[r - 1] = 0;
  }
  cu_emit(f, gm->an->in[1], &co, out);
}

static void mm_result(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *n, const char *acc,
                      CuCoords *out_co, CuVal *out_val) {
  TensorType bt = {.dt = gm->yt->dt, .rank = gm->nbatch};
  for (int d = 0; d < gm->nbatch; d++) bt.dim[d] = gm->yt->dim[d];
  cu_delinearize(f, z, &bt, out_co);
  out_co->rank = gm->yt->rank;
  int d = gm->nbatch;
  if (!gm->a1) out_co->c[d++] = m;
  if (!gm->b1) out_co->c[d++] = n;
  for (int i = gm->nbatch; i < out_co->rank; i++) out_co->step[i] = 0;
  memset(out_val, 0, sizeof *out_val);
  out_val->l[0] = cu_normalise(f, gm->yt->dt, acc);
}

static void setup_matmul(const Graph *g, const Node *an, Gemm *gm) {
  gm->at = &g->val[an->in[0]].type;
  gm->bt = &g->val[an->in[1]].type;
  gm->yt = &g->val[an->out[0]].type;
  gm->ta = ir_attr_int(an, "transpose_a") != 0;
  gm->tb = ir_attr_int(an, "transpose_b") != 0;
  gm->a1 = gm->at->rank == 1;
  gm->b1 = gm->bt->rank == 1;
  int ra = gm->at->rank, rb = gm->bt->rank;
  gm->M = gm->a1 ? 1 : gm->at->dim[gm->ta ? ra - 1 : ra - 2];
  gm->K = gm->a1 ? gm->at->dim[0] : gm->at->dim[gm->ta ? ra - 2 : ra - 1];
  gm->N = gm->b1 ? 1 : gm->bt->dim[gm->tb ? rb - 2 : rb - 1];
  gm->nbatch = gm->yt->rank - (gm->a1 ? 0 : 1) - (gm->b1 ? 0 : 1);
  gm->Z = 1;
  for (int d = 0; d < gm->nbatch; d++) gm->Z *= gm->yt->dim[d];
  gm->a_m_fast = gm->ta;  /* A stored [.., K, M]: m is contiguous */
  gm->b_n_fast = !gm->tb; /* B stored [.., K, N]: n is contiguous */
  gm->load_a = mm_load_a;
  gm->load_b = mm_load_b;
  gm->result = mm_result;
}

/* ---- conv2d ---- */

static void cv_load_a(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *k, CuVal *out) {
  const char *c[4];
  c[0] = cu_add(f, cu_mulk(f, z, gm->Og), m);
  TensorType kt = {.dt = gm->bt->dt, .rank = 3, .dim = {gm->Cg, gm->KH, gm->KW}};
  CuCoords kc;
  cu_delinearize(f, k, &kt, &kc);
  c[1] = kc.c[0], c[2] = kc.c[1], c[3] = kc.c[2];
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  cu_emit(f, gm->an->in[1], &co, out);
}

static void cv_load_b(CuFn *f, const Gemm *gm, const char *z, const char *k, const char *n, CuVal *out) {
  TensorType kt = {.dt = gm->at->dt, .rank = 3, .dim = {gm->Cg, gm->KH, gm->KW}};
  TensorType pt = {.dt = gm->at->dt, .rank = 3, .dim = {gm->yt->dim[0], gm->OH, gm->OW}};
  CuCoords kc, pc;
  cu_delinearize(f, k, &kt, &kc);
  cu_delinearize(f, n, &pt, &pc);
  const char *ih = cu_tmp(f), *iw = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, ih, cu_add(f, cu_addk(f, cu_mulk(f, pc.c[1], gm->sh), -gm->pt), cu_mulk(f, kc.c[1], gm->dh)));
  cu_line(f, "const %s %s = %s;", f->idx, iw, cu_add(f, cu_addk(f, cu_mulk(f, pc.c[2], gm->sw), -gm->pl), cu_mulk(f, kc.c[2], gm->dw)));
  DType dt = gm->at->dt;
  const char *r = cu_tmp(f);
  cu_line(f, "%s %s = %s;  // zero padding", cu_ctype(dt), r, cu_const(f, dt, 0));
  cu_open(f, "if (%s >= 0 && %s < %lld && %s >= 0 && %s < %lld)", ih, ih, (long long)gm->H, iw, iw, (long long)gm->W);
  const char *c[4] = {pc.c[0], cu_add(f, cu_mulk(f, z, gm->Cg), kc.c[0]), ih, iw};
  CuCoords co;
  cu_coords_scalar(&co, 4, c);
  CuVal x;
  cu_emit(f, gm->an->in[0], &co, &x);
  cu_line(f, "%s = %s;", r, x.l[0]);
  cu_close(f);
  memset(out, 0, sizeof *out);
  out->l[0] = r;
}

static void cv_result(CuFn *f, const Gemm *gm, const char *z, const char *m, const char *n, const char *acc,
                      CuCoords *out_co, CuVal *out_val) {
  TensorType pt = {.dt = gm->yt->dt, .rank = 3, .dim = {gm->yt->dim[0], gm->OH, gm->OW}};
  CuCoords pc;
  cu_delinearize(f, n, &pt, &pc);
  const char *o = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", f->idx, o, cu_add(f, cu_mulk(f, z, gm->Og), m));
  const char *c[4] = {pc.c[0], o, pc.c[1], pc.c[2]};
  cu_coords_scalar(out_co, 4, c);
  memset(out_val, 0, sizeof *out_val);
  const char *v = acc;
  if (gm->an->nin > 2) {
    CuCoords bc;
    cu_coords_scalar(&bc, 1, &o);
    CuVal b;
    cu_emit(f, gm->an->in[2], &bc, &b);
    v = cu_fmt(f, "(%s + %s)", acc, b.l[0]);
  }
  out_val->l[0] = cu_normalise(f, gm->yt->dt, v);
}

static void setup_conv(const Graph *g, const Node *an, Gemm *gm) {
  gm->at = &g->val[an->in[0]].type; /* x */
  gm->bt = &g->val[an->in[1]].type; /* w */
  gm->yt = &g->val[an->out[0]].type;
  const Attr *st = ir_attr(an, "strides"), *pd = ir_attr(an, "pads"), *dl = ir_attr(an, "dilations");
  int64_t G = ir_attr_int(an, "groups");
  gm->C = gm->at->dim[1], gm->H = gm->at->dim[2], gm->W = gm->at->dim[3];
  gm->O = gm->bt->dim[0], gm->Cg = gm->bt->dim[1], gm->KH = gm->bt->dim[2], gm->KW = gm->bt->dim[3];
  gm->OH = gm->yt->dim[2], gm->OW = gm->yt->dim[3];
  gm->Og = gm->O / (G ? G : 1);
  gm->sh = st->ints[0], gm->sw = st->ints[1], gm->pt = pd->ints[0], gm->pl = pd->ints[1];
  gm->dh = dl->ints[0], gm->dw = dl->ints[1];
  gm->M = gm->Og;
  gm->N = gm->yt->dim[0] * gm->OH * gm->OW;
  gm->K = gm->Cg * gm->KH * gm->KW;
  gm->Z = G;
  gm->a_m_fast = false; /* w[o, c, kh, kw]: k is contiguous */
  gm->b_n_fast = true;  /* x[n, c, ih, iw]: neighbouring outputs read neighbouring iw */
  gm->load_a = cv_load_a;
  gm->load_b = cv_load_b;
  gm->result = cv_result;
}

void cu_gemm_setup(const CuFn *f, CuGemm *gm) {
  const Node *an = &f->g->node[f->anchor];
  memset(gm, 0, sizeof *gm);
  gm->an = an;
  if (an->op == OP_MATMUL) setup_matmul(f->g, an, gm);
  else setup_conv(f->g, an, gm);
}

/* Operand t of a matmul has rank-2 batch dims, right-aligned against the
 * result's nbatch dims and broadcast where they are 1: the element offset
 * of batch z's matrix is a sum over the result's batch coordinates. */
const char *cu_gemm_batch_offset(CuFn *f, const CuGemm *gm, const char *z, const TensorType *t) {
  int nb = t->rank - 2;
  if (nb <= 0 || gm->Z <= 1) return "0LL";
  CuBuf b = {0};
  int64_t matrix = t->dim[t->rank - 2] * t->dim[t->rank - 1], stride = matrix, below = 1;
  /* innermost result batch dim first: coordinate = (z / below) % dim */
  for (int d = gm->nbatch - 1, od = nb - 1; d >= 0; d--, od--) {
    int64_t rd = gm->yt->dim[d];
    if (od >= 0 && t->dim[od] != 1 && rd > 1)
      cu_buf_printf(&b, "%s(((long long)%s / %lldLL) %% %lldLL) * %lldLL", b.len ? " + " : "", z, (long long)below,
                    (long long)rd, (long long)stride);
    if (od >= 0) stride *= t->dim[od];
    below *= rd;
  }
  const char *e = b.len || b.oom ? cu_buf_str(f, &b) : "0LL";
  cu_buf_free(&b);
  return e;
}

/* ---- ranged dims ---- */

bool cu_gemm_ranged(const CuGemm *gm) { return ir_type_dynamic(gm->yt); }

const char *cu_gemm_run_m(CuFn *f, const CuGemm *gm) {
  const TensorType *y = gm->yt;
  /* M is the result's second-to-last axis, its last when B is a vector */
  int ma = gm->an->op != OP_MATMUL || gm->a1 ? -1 : gm->b1 ? y->rank - 1 : y->rank - 2;
  if (ma < 0 || !y->dyn[ma]) return cu_fmt(f, "%lld", (long long)gm->M);
  return cu_extent(f, y, ma);
}

void cu_gemm_store_at(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *n, const char *acc,
                      const int *epi, int nepi) {
  CuCoords co;
  CuVal val;
  gm->result(f, gm, z, m, n, acc, &co, &val);
  const Value *yv = &f->g->val[gm->an->out[0]];
  const char *r = cu_tmp(f);
  cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(yv->type.dt), r, val.l[0], yv->name, ir_op_name(gm->an->op));
  val.l[0] = r;
  const char *run = cu_gemm_run_m(f, gm);
  bool ranged = !cu_is_lit(run, NULL);
  if (ranged) cu_open(f, "if (%s < %s)", m, run);
  cu_store_epilogue(f, epi, nepi, &co, &val);
  if (ranged) cu_close(f);
}

void cu_gemm_store_pair_at(CuFn *f, const CuGemm *gm, const char *z, const char *m, const char *n, const char *acc0,
                           const char *acc1, const int *epi, int nepi) {
  CuCoords co, co1;
  CuVal val, val1;
  gm->result(f, gm, z, m, n, acc0, &co, &val);
  gm->result(f, gm, z, m, cu_fmt(f, "(%s + 1)", n), acc1, &co1, &val1);
  val.l[1] = val1.l[0];
  co.lanes = 2;
  co.step[co.rank - 1] = 1;
  co.aligned = false;
  co.whole_lanes = true;
  const Value *yv = &f->g->val[gm->an->out[0]];
  for (int e = 0; e < 2; e++) {
    const char *r = cu_tmp(f);
    cu_line(f, "const %s %s = %s;  // %s (%s)%s", cu_ctype(yv->type.dt), r, val.l[e], yv->name, ir_op_name(gm->an->op),
            e ? ", column n + 1" : "");
    val.l[e] = r;
  }
  const char *run = cu_gemm_run_m(f, gm);
  bool ranged = !cu_is_lit(run, NULL);
  if (ranged) cu_open(f, "if (%s < %s)", m, run);
  cu_store_epilogue(f, epi, nepi, &co, &val);
  if (ranged) cu_close(f);
}

CuPrefetch cu_gemm_prefetch_mode(void) {
  const char *e = getenv("SMELT_CUDA_PREFETCH");
  if (e && !strcmp(e, "none")) return CU_PREFETCH_NONE;
  if (e && !strcmp(e, "all")) return CU_PREFETCH_ALL;
  return CU_PREFETCH_FIRST;
}

bool cu_gemm_wants_pairs(const CuFn *f, const CuGemm *gm) {
  const Graph *g = f->g;
  int av = gm->an->out[0];
  for (int i = 0; i < f->grp->nnodes; i++) {
    const Node *n = &g->node[f->grp->nodes[i]];
    if (n->op == OP_SLICE && n->in[0] == av && ir_attr_int(n, "step") == 2) return true;
  }
  return false;
}

const char *cu_gemm_run_n(CuFn *f, const CuGemm *gm) {
  const TensorType *y = gm->yt;
  /* a conv2d's N is batch x OH x OW, of which only the batch may be ranged */
  if (gm->an->op != OP_CONV2D || !y->dyn[0]) return cu_fmt(f, "%lld", (long long)gm->N);
  return cu_fmt(f, "(%s * %lldLL)", cu_extent(f, y, 0), (long long)(gm->OH * gm->OW));
}

const char *cu_gemm_batch_past(CuFn *f, const CuGemm *gm, const char *z) {
  if (gm->an->op != OP_MATMUL || gm->nbatch == 0) return NULL;
  TensorType bt = {.dt = gm->yt->dt, .rank = gm->nbatch};
  for (int d = 0; d < gm->nbatch; d++) {
    bt.dim[d] = gm->yt->dim[d], bt.dyn[d] = gm->yt->dyn[d];
    bt.dyn_a[d] = gm->yt->dyn_a[d], bt.dyn_b[d] = gm->yt->dyn_b[d];
  }
  const char *live = cu_live(f, &bt, z);
  return live ? cu_fmt(f, "!%s", live) : NULL;
}
