/* The ops a causal LM's state and sampling need (ops.def "needed by causal
 * LMs"): scatter, argmax, topk and arange.
 *
 * scatter(dst, idx, src) along `axis`: out[o, idx[i], e] = src[o, i, e].
 *   When the result lives in a state's memory (ir_state_of: dst is a state
 *   tensor, and the runtime passes the state's memory for both dst and the
 *   result) it runs in place: a grid-stride loop over the rows of src times
 *   their inner elements, 16 bytes per thread where the inner dim allows
 *   (and the pointers are aligned), writes only the rows named by idx;
 *   nothing reads dst, nothing copies the cache.  An index outside
 *   [0, dim) is skipped (the reference reports it; the session checks
 *   positions before a run), and when two indices name the same row the
 *   later one wins, as in the reference's sequential writes (each thread
 *   looks at the indices after its own: none for a decode step).
 *   Into any other destination the result is a new tensor: one pass over
 *   the result, each element taking src at the last index that names its
 *   row, else dst (the copy and the writes in one kernel; it costs the
 *   result's size times the number of indices in index compares).
 * argmax(x) along `axis` (i32 result; NaN counts as the largest and the
 *   first index wins, as numpy): with the axis innermost (or followed only
 *   by dims of 1), one block per row of up to 1024 threads, each walking
 *   the row with 16-byte loads and keeping its best (value, index), then a
 *   warp reduction of the pairs with shuffles and one pair per warp through
 *   shared memory; otherwise a thread per result element walks its axis.
 * topk(x) along `axis` (values and i32 indices, best first; ties to the
 *   lower index, NaN the largest): one block per row of up to 256 threads
 *   (an axis that is not innermost is read with its stride).  Each thread
 *   walks its elements of the row (threadIdx.x, + blockDim.x, ...) in index
 *   order and keeps its own best k sorted in local arrays, by insertion (an
 *   equal value met later stays behind); then k rounds of a block-wide
 *   argmax over the heads of the threads' lists (shuffles in each warp, one
 *   pair per warp through shared memory, every thread reducing the warps'
 *   pairs): the thread whose head won pops it, thread 0 stores it as the
 *   round's result.  Per-thread lists cost k registers or local memory, so
 *   k is limited to CU_TOPK_MAX_K (sampling's top-k is 40-50); a larger k
 *   is refused at compile time.
 * arange(start): start[0] + i, a grid-stride loop.
 * Every value is read with cu_emit, so producers fused into the group are
 * computed where they are read; results go through the group's epilogue
 * (cu_store_epilogue), side outputs through cu_store_loops.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "codegen/cuda/cu_kernels.h"

#define ARGMAX_MAX_THREADS 1024

static void around_axis(const TensorType *t, int ax, int64_t *outer, int64_t *len, int64_t *inner) {
  *outer = 1, *len = t->dim[ax], *inner = 1;
  for (int d = 0; d < ax; d++) *outer *= t->dim[d];
  for (int d = ax + 1; d < t->rank; d++) *inner *= t->dim[d];
}

static int norm_axis(int64_t a, int rank) {
  if (a < 0) a += rank;
  return a >= 0 && a < rank ? (int)a : -1;
}

/* A loop body emitted with `lanes` elements per thread. */
typedef void (*LoopBody)(CuFn *f, const void *ctx, int lanes);

/* body with `lanes` lanes (vector accesses) when the pointers it accesses
 * as vectors are aligned, else with one lane; lanes 1: just that. */
static void vector_or_scalar(CuFn *f, LoopBody body, const void *ctx, int lanes) {
  if (lanes <= 1) {
    body(f, ctx, 1);
    return;
  }
  CuBuf vec = {0};
  CuBuf *saved = f->out;
  int saved_indent = f->indent;
  f->out = &vec;
  f->indent = saved_indent + 1; /* inside a block opened below */
  memset(f->vec_bytes, 0, sizeof(int) * (size_t)f->k->nargs);
  body(f, ctx, lanes);
  f->out = saved;
  f->indent = saved_indent;
  const char *cond = cu_vec_condition(f);
  if (!cond[0] || f->opt->args_aligned) {
    cu_open(f, "%s", "");
    cu_buf_append_buf(f->out, &vec);
    cu_close(f);
  } else {
    cu_open(f, "if (%s)", cond);
    cu_buf_append_buf(f->out, &vec);
    f->indent--;
    cu_line(f, "} else {");
    f->indent++;
    body(f, ctx, 1);
    cu_close(f);
  }
  cu_buf_free(&vec);
}

/* The one epilogue value a kernel around an opaque anchor may store: the
 * anchor's result itself (these anchors are placed alone); false (and
 * f->err) otherwise. */
static bool only_result(CuFn *f, const int *epi, int nepi) {
  int out = f->g->node[f->anchor].out[0];
  if (nepi == 1 && epi[0] == out) return true;
  if (nepi == 0) return true;
  cu_fail(f, ST_UNSUPPORTED, "%s '%s': no CUDA lowering with an epilogue fused behind it",
          ir_op_name(f->g->node[f->anchor].op), f->g->val[out].name);
  return false;
}

/* ---- scatter ---- */

typedef struct {
  const Node *n;
  int ax;
  int64_t len, nidx;
  const char *nrun; /* the indices this run has along a ranged axis (an expression), NULL: all nidx */
} ScatterCtx;

/* idx[j] (j a C expression) as a long long expression. */
static const char *index_at(CuFn *f, int idxv, const char *j) {
  const char *c[1] = {j};
  CuCoords co;
  cu_coords_scalar(&co, 1, c);
  CuVal x;
  cu_emit(f, idxv, &co, &x);
  return cu_fmt(f, "(long long)(%s)", x.l[0]);
}

/* In place: one iteration per `lanes` elements of src; the row it names
 * in the result is written, nothing else. */
static void scatter_inplace_body(CuFn *f, const void *vctx, int lanes) {
  const ScatterCtx *c = vctx;
  const Graph *g = f->g;
  const Node *n = c->n;
  int srcv = n->in[2], idxv = n->in[1], out = n->out[0];
  const TensorType *st = &g->val[srcv].type;
  int64_t items = ir_type_numel(st) / lanes;
  const char *t = cu_tmp(f);
  cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (%s)gridDim.x * blockDim.x)", f->idx,
          t, f->idx, t, (long long)items, t, f->idx);
  const char *e = t;
  if (lanes > 1) {
    e = cu_tmp(f);
    cu_line(f, "const %s %s = %s * %d;", f->idx, e, t, lanes);
  }
  CuCoords co;
  cu_delinearize(f, e, st, &co);
  co.lanes = lanes;
  if (lanes > 1) co.step[st->rank - 1] = 1;
  const char *i = co.c[c->ax], *k = cu_tmp(f);
  if (c->nrun) cu_line(f, "if ((long long)%s >= %s) continue;  // a row beyond this run's", i, c->nrun);
  cu_line(f, "const long long %s = %s;  // the row of the result that src row %s goes to", k, index_at(f, idxv, i), i);
  cu_line(f, "if (%s < 0 || %s >= %lldLL) continue;  // outside the destination: skipped", k, k, (long long)c->len);
  if (c->nidx > 1) {
    const char *later = cu_tmp(f), *j = cu_tmp(f);
    cu_line(f, "bool %s = false;  // a later index naming the same row wins", later);
    cu_open(f, "for (%s %s = %s + 1; %s < %s; %s++)", f->idx, j, i, j, c->nrun ? c->nrun : cu_fmt(f, "%lld", (long long)c->nidx), j);
    cu_line(f, "if (%s == %s) { %s = true; break; }", index_at(f, idxv, j), k, later);
    cu_close(f);
    cu_line(f, "if (%s) continue;", later);
  }
  CuVal v;
  cu_emit(f, srcv, &co, &v);
  CuCoords oc = co;
  const char *kk = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)%s;", f->idx, kk, f->idx, k);
  oc.c[c->ax] = kk;
  cu_store(f, out, &oc, &v);
  cu_close(f);
}

/* A new tensor: every element of the result, from src at the last index
 * naming its row, else from dst. */
static void scatter_copy_body(CuFn *f, const void *vctx, int lanes) {
  const ScatterCtx *c = vctx;
  const Graph *g = f->g;
  const Node *n = c->n;
  int dstv = n->in[0], srcv = n->in[2], idxv = n->in[1], out = n->out[0];
  const TensorType *ot = &g->val[out].type;
  DType dt = ot->dt;
  int64_t items = ir_type_numel(ot) / lanes;
  const char *t = cu_tmp(f);
  cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (%s)gridDim.x * blockDim.x)", f->idx,
          t, f->idx, t, (long long)items, t, f->idx);
  const char *e = t;
  if (lanes > 1) {
    e = cu_tmp(f);
    cu_line(f, "const %s %s = %s * %d;", f->idx, e, t, lanes);
  }
  CuCoords co;
  cu_delinearize(f, e, ot, &co);
  co.lanes = lanes;
  if (lanes > 1) co.step[ot->rank - 1] = 1;
  const char *found = cu_tmp(f), *j = cu_tmp(f);
  cu_line(f, "long long %s = -1;  // the last index naming this row", found);
  cu_open(f, "for (long long %s = %s - 1; %s >= 0; %s--)", j, c->nrun ? c->nrun : cu_fmt(f, "%lldLL", (long long)c->nidx), j, j);
  cu_line(f, "if (%s == (long long)%s) { %s = %s; break; }", index_at(f, idxv, cu_fmt(f, "(%s)%s", f->idx, j)), co.c[c->ax],
          found, j);
  cu_close(f);
  CuVal r = {{0}};
  for (int l = 0; l < lanes; l++) {
    r.l[l] = cu_tmp(f);
    cu_line(f, "%s %s;", cu_ctype(dt), r.l[l]);
  }
  cu_open(f, "if (%s >= 0)", found);
  CuCoords sc = co;
  const char *fi = cu_tmp(f);
  cu_line(f, "const %s %s = (%s)%s;", f->idx, fi, f->idx, found);
  sc.c[c->ax] = fi;
  CuVal v;
  cu_emit(f, srcv, &sc, &v);
  for (int l = 0; l < lanes; l++) cu_line(f, "%s = %s;", r.l[l], v.l[l]);
  f->indent--;
  cu_line(f, "} else {");
  f->indent++;
  cu_emit(f, dstv, &co, &v);
  for (int l = 0; l < lanes; l++) cu_line(f, "%s = %s;", r.l[l], v.l[l]);
  cu_close(f);
  cu_store(f, out, &co, &r);
  cu_close(f);
}

static void emit_scatter(CuFn *f, CuLaunch *l, const int *epi, int nepi) {
  const Graph *g = f->g;
  const Node *n = &g->node[f->anchor];
  int out = n->out[0];
  const TensorType *dt = &g->val[n->in[0]].type, *st = &g->val[n->in[2]].type;
  ScatterCtx c = {n, norm_axis(ir_attr_int(n, "axis"), dt->rank), 0, 0, NULL};
  if (c.ax < 0) {
    cu_fail(f, ST_INTERNAL, "scatter '%s': axis out of range", g->val[out].name);
    return;
  }
  if (!only_result(f, epi, nepi)) return;
  int64_t outer, inner;
  around_axis(dt, c.ax, &outer, &c.len, &inner);
  c.nidx = st->dim[c.ax];
  /* with a ranged index count (codegen/ranges.c: never the destination)
   * only the indices this run has are written: the rows beyond hold what
   * an earlier run left */
  for (int a = 0; a < st->rank; a++) {
    if (!st->dyn[a]) continue;
    if (a != c.ax) {
      cu_fail(f, ST_UNSUPPORTED, "scatter '%s': its source follows ranged dim '%s' along another axis than the "
              "indices; compile exact values of the dim for CUDA", g->val[out].name, g->ranges[st->dyn[a] - 1].name);
      return;
    }
    c.nrun = cu_extent(f, st, a);
  }
  bool inplace = ir_state_of(g, out) >= 0;
  if (f->arg_of[out] < 0) {
    cu_fail(f, ST_INTERNAL, "scatter '%s': its result is not an argument of kernel %s (nothing in this run reads it)",
            g->val[out].name, f->k->name);
    return;
  }
  l->kind = "elementwise"; /* the launch table knows the kinds of format/cuda_launch.c */
  l->block[0] = CU_EW_THREADS;
  /* lanes along the innermost dim: not the axis (rows are whole vectors) */
  int vals[2] = {n->in[2], out};
  const TensorType *lt = inplace ? st : dt;
  int lanes = c.ax == lt->rank - 1 ? 1 : cu_pick_lanes(f, lt, vals, 2);
  int64_t items = ir_type_numel(lt) / lanes;
  l->grid[0] = cu_grid_for(items, CU_EW_THREADS);
  if (items == 0) return;
  if (inplace) {
    cu_line(f, "// in place: the result is the state's memory; only the rows named by the indices are written");
    vector_or_scalar(f, scatter_inplace_body, &c, lanes);
  } else {
    cu_line(f, "// the destination is not a state: the result is a new tensor (dst with src's rows at the indices)");
    vector_or_scalar(f, scatter_copy_body, &c, lanes);
  }
}

/* ---- argmax ---- */

typedef struct {
  const Node *n;
  int ax;
  int64_t len;
  const TensorType *kt; /* x with the axis of size 1 */
  const int *epi;
  int nepi;
} ArgmaxCtx;

/* Declares the pair comparator: whether (v2, i2) beats (v1, i1) (i < 0:
 * no element yet; NaN is the largest; ties go to the smaller index). */
static void argmax_better(CuFn *f, const char *ct) {
  cu_line(f, "auto better = [](%s v1, long long i1, %s v2, long long i2) -> bool {", ct, ct);
  cu_line(f, "  if (i2 < 0) return false;");
  cu_line(f, "  if (i1 < 0) return true;");
  cu_line(f, "  const bool n1 = v1 != v1, n2 = v2 != v2;");
  cu_line(f, "  if (n1 || n2) return n2 && (!n1 || i2 < i1);");
  cu_line(f, "  return v2 > v1 || (v2 == v1 && i2 < i1);");
  cu_line(f, "};");
}

/* One block per row: the threads stride over the row, `lanes` elements
 * per load. */
static void argmax_row_body(CuFn *f, const void *vctx, int lanes) {
  const ArgmaxCtx *c = vctx;
  const Graph *g = f->g;
  const Node *n = c->n;
  int xv = n->in[0];
  DType dt = g->val[xv].type.dt;
  const char *ct = cu_ctype(dt);
  cu_open(f, "%s", "");
  cu_line(f, "const %s row = (%s)blockIdx.x;", f->idx, f->idx);
  /* ranged dims: a row past this run leaves before the block's barriers,
   * all its threads alike */
  const char *live = cu_live(f, c->kt, "row");
  if (live) cu_line(f, "if (!%s) return;  // ranged dims: a row past this run", live);
  CuCoords co;
  cu_delinearize(f, "row", c->kt, &co);
  cu_line(f, "%s best = 0;", ct);
  cu_line(f, "long long bi = -1;");
  const char *t = cu_tmp(f);
  cu_line(f, "#pragma unroll 4");
  cu_open(f, "for (%s %s = threadIdx.x; %s < %lld; %s += blockDim.x)", f->idx, t, t, (long long)(c->len / lanes), t);
  const char *e = lanes > 1 ? cu_tmp(f) : t;
  if (lanes > 1) cu_line(f, "const %s %s = %s * %d;", f->idx, e, t, lanes);
  CuCoords xc = co;
  xc.c[c->ax] = e;
  xc.lanes = lanes;
  if (lanes > 1) xc.step[c->ax] = 1;
  CuVal x;
  cu_emit(f, xv, &xc, &x);
  for (int j = 0; j < lanes; j++) {
    const char *ij = j ? cu_fmt(f, "(long long)%s + %d", e, j) : cu_fmt(f, "(long long)%s", e);
    cu_line(f, "if (better(best, bi, %s, %s)) best = %s, bi = %s;", x.l[j], ij, x.l[j], ij);
  }
  cu_close(f);
  cu_line(f, "// the block's best pair: shuffles within each warp, then one pair per warp");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int o = 16; o > 0; o >>= 1)");
  cu_line(f, "const %s ov = __shfl_xor_sync(0xffffffffu, best, o);", ct);
  cu_line(f, "const long long oi = __shfl_xor_sync(0xffffffffu, bi, o);");
  cu_line(f, "if (better(best, bi, ov, oi)) best = ov, bi = oi;");
  cu_close(f);
  cu_line(f, "__shared__ %s wv[%d];", ct, ARGMAX_MAX_THREADS / 32);
  cu_line(f, "__shared__ long long wi[%d];", ARGMAX_MAX_THREADS / 32);
  cu_line(f, "if (threadIdx.x %% 32 == 0) wv[threadIdx.x / 32] = best, wi[threadIdx.x / 32] = bi;");
  cu_line(f, "__syncthreads();");
  cu_open(f, "if (threadIdx.x == 0)");
  cu_line(f, "for (int w = 1; w < (int)(blockDim.x / 32); w++)");
  cu_line(f, "  if (better(best, bi, wv[w], wi[w])) best = wv[w], bi = wi[w];");
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const long long %s = bi < 0 ? 0 : bi;  // %s (argmax)", y.l[0], g->val[n->out[0]].name);
  CuCoords oc;
  cu_delinearize(f, "row", &g->val[n->out[0]].type, &oc);
  cu_store_epilogue(f, c->epi, c->nepi, &oc, &y);
  cu_close(f);
  cu_close(f);
}

static void emit_argmax(CuFn *f, CuLaunch *l, const int *epi, int nepi) {
  const Graph *g = f->g;
  const Node *n = &g->node[f->anchor];
  int xv = n->in[0], out = n->out[0];
  const TensorType *xt = &g->val[xv].type, *yt = &g->val[out].type;
  DType dt = xt->dt;
  const char *ct = cu_ctype(dt);
  ArgmaxCtx c = {n, norm_axis(ir_attr_int(n, "axis"), xt->rank), 0, NULL, epi, nepi};
  if (c.ax < 0) {
    cu_fail(f, ST_INTERNAL, "argmax '%s': axis out of range", g->val[out].name);
    return;
  }
  if (!only_result(f, epi, nepi)) return;
  int64_t outer, inner;
  around_axis(xt, c.ax, &outer, &c.len, &inner);
  TensorType *kt = arena_alloc(&f->arena, sizeof *kt);
  if (!kt) {
    cu_fail(f, ST_NO_MEMORY, "out of memory");
    return;
  }
  *kt = *xt;
  kt->dim[c.ax] = 1;
  c.kt = kt;
  l->kind = "reduction";
  if (outer * inner == 0 || c.len == 0) return;
  if (inner == 1) {
    if (outer > 0x7fffffffLL) {
      cu_fail(f, ST_UNSUPPORTED, "argmax '%s': %lld rows exceed the grid", g->val[out].name, (long long)outer);
      return;
    }
    int lanes = c.ax == xt->rank - 1 ? cu_pick_lanes(f, xt, &xv, 1) : 1;
    int64_t chunks = c.len / lanes;
    int threads = 32;
    while (threads < ARGMAX_MAX_THREADS && threads < chunks) threads *= 2;
    l->block[0] = (unsigned)threads;
    l->grid[0] = (unsigned)outer;
    cu_line(f, "// one block per row of %lld: %d threads, %d element(s) per load", (long long)c.len, threads, lanes);
    argmax_better(f, ct);
    vector_or_scalar(f, argmax_row_body, &c, lanes);
    return;
  }
  /* the axis is not innermost: a thread per result element walks it */
  int64_t items = outer * inner;
  l->block[0] = CU_EW_THREADS;
  l->grid[0] = cu_grid_for(items, CU_EW_THREADS);
  argmax_better(f, ct);
  const char *i = cu_tmp(f);
  cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (%s)gridDim.x * blockDim.x)", f->idx,
          i, f->idx, i, (long long)items, i, f->idx);
  const char *live = cu_live(f, kt, i);
  if (live) cu_line(f, "if (!%s) continue;  // ranged dims: a result past this run", live);
  CuCoords co;
  cu_delinearize(f, i, kt, &co);
  cu_line(f, "%s best = 0;", ct);
  cu_line(f, "long long bi = -1;");
  const char *k = cu_tmp(f);
  cu_open(f, "for (%s %s = 0; %s < %lld; %s++)", f->idx, k, k, (long long)c.len, k);
  CuCoords xc = co;
  xc.c[c.ax] = k;
  CuVal x;
  cu_emit(f, xv, &xc, &x);
  cu_line(f, "if (better(best, bi, %s, (long long)%s)) best = %s, bi = %s;", x.l[0], k, x.l[0], k);
  cu_close(f);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const long long %s = bi < 0 ? 0 : bi;  // %s (argmax)", y.l[0], g->val[out].name);
  CuCoords oc;
  cu_delinearize(f, i, yt, &oc);
  cu_store_epilogue(f, epi, nepi, &oc, &y);
  cu_close(f);
}

/* ---- topk ---- */

#define CU_TOPK_MAX_K 64
#define CU_TOPK_MAX_THREADS 256

/* Declares the pair comparator: whether (v2, i2) beats (v1, i1) (i < 0: no
 * element; NaN is the largest; equal values go to the smaller index). */
static void topk_beats(CuFn *f, const char *ct, bool largest) {
  cu_line(f, "auto beats = [](%s v1, int i1, %s v2, int i2) -> bool {", ct, ct);
  cu_line(f, "  if (i2 < 0) return false;");
  cu_line(f, "  if (i1 < 0) return true;");
  cu_line(f, "  const bool n1 = v1 != v1, n2 = v2 != v2;");
  if (largest) {
    cu_line(f, "  if (n1 || n2) return n2 && (!n1 || i2 < i1);");
    cu_line(f, "  return v2 > v1 || (v2 == v1 && i2 < i1);");
  } else {
    cu_line(f, "  if (n1 || n2) return n1 && (!n2 || i2 < i1);");
    cu_line(f, "  return v2 < v1 || (v2 == v1 && i2 < i1);");
  }
  cu_line(f, "};");
}

static void emit_topk(CuFn *f, CuLaunch *l, const int *epi, int nepi) {
  const Graph *g = f->g;
  const Node *n = &g->node[f->anchor];
  int xv = n->in[0], vout = n->out[0], iout = n->out[1];
  const TensorType *xt = &g->val[xv].type;
  const char *ct = cu_ctype(xt->dt);
  int ax = norm_axis(ir_attr_int(n, "axis"), xt->rank);
  int64_t k = ir_attr_int(n, "k");
  if (ax < 0) {
    cu_fail(f, ST_INTERNAL, "topk '%s': axis out of range", g->val[vout].name);
    return;
  }
  for (int i = 0; i < nepi; i++)
    if (epi[i] != vout && epi[i] != iout) {
      cu_fail(f, ST_UNSUPPORTED, "topk '%s': no CUDA lowering with an epilogue fused behind it", g->val[vout].name);
      return;
    }
  if (k > CU_TOPK_MAX_K) {
    cu_fail(f, ST_UNSUPPORTED, "topk '%s': k = %lld; the CUDA kernel keeps at most %d per row (per-thread lists)",
            g->val[vout].name, (long long)k, CU_TOPK_MAX_K);
    return;
  }
  int64_t outer, len, inner;
  around_axis(xt, ax, &outer, &len, &inner);
  TensorType *kt = arena_alloc(&f->arena, sizeof *kt);
  if (!kt) {
    cu_fail(f, ST_NO_MEMORY, "out of memory");
    return;
  }
  *kt = *xt;
  kt->dim[ax] = 1;
  l->kind = "reduction";
  int64_t rows = outer * inner;
  if (rows == 0 || len == 0) return;
  if (rows > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "topk '%s': %lld rows exceed the grid", g->val[vout].name, (long long)rows);
    return;
  }
  int threads = 32;
  while (threads < CU_TOPK_MAX_THREADS && threads < len) threads *= 2;
  l->block[0] = (unsigned)threads;
  l->grid[0] = (unsigned)rows;
  bool largest = ir_attr_int(n, "largest") != 0;
  cu_line(f, "// topk: one block per row of %lld, %d threads, k = %lld (%s first)", (long long)len, threads, (long long)k,
          largest ? "largest" : "smallest");
  topk_beats(f, ct, largest);
  cu_open(f, "%s", "");
  cu_line(f, "const %s row = (%s)blockIdx.x;", f->idx, f->idx);
  const char *live = cu_live(f, kt, "row"); /* as in argmax */
  if (live) cu_line(f, "if (!%s) return;  // ranged dims: a row past this run", live);
  CuCoords co;
  cu_delinearize(f, "row", kt, &co);
  cu_line(f, "%s tv[%lld];  // this thread's best k so far, best first", ct, (long long)k);
  cu_line(f, "int ti[%lld];", (long long)k);
  cu_line(f, "int cnt = 0;");
  const char *e = cu_tmp(f);
  cu_open(f, "for (%s %s = threadIdx.x; %s < %lld; %s += blockDim.x)", f->idx, e, e, (long long)len, e);
  CuCoords xc = co;
  xc.c[ax] = e;
  CuVal x;
  cu_emit(f, xv, &xc, &x);
  const char *xe = cu_tmp(f);
  cu_line(f, "const %s %s = %s;", ct, xe, x.l[0]);
  cu_open(f, "if (cnt < %lld || beats(tv[%lld], ti[%lld], %s, (int)%s))", (long long)k, (long long)k - 1, (long long)k - 1,
          xe, e);
  cu_line(f, "int p = cnt < %lld ? cnt++ : %lld;", (long long)k, (long long)k - 1);
  cu_line(f, "for (; p > 0 && beats(tv[p - 1], ti[p - 1], %s, (int)%s); p--) tv[p] = tv[p - 1], ti[p] = ti[p - 1];", xe,
          e);
  cu_line(f, "tv[p] = %s, ti[p] = (int)%s;", xe, e);
  cu_close(f);
  cu_close(f);
  cu_line(f, "// k rounds: the best head of the threads' lists, popped by its thread");
  cu_line(f, "__shared__ %s wv[%d];", ct, CU_TOPK_MAX_THREADS / 32);
  cu_line(f, "__shared__ int wi[%d];", CU_TOPK_MAX_THREADS / 32);
  cu_line(f, "int h = 0;");
  cu_open(f, "for (int r = 0; r < %lld; r++)", (long long)k);
  cu_line(f, "%s bv = h < cnt ? tv[h] : (%s)0;", ct, ct);
  cu_line(f, "int bi = h < cnt ? ti[h] : -1;");
  cu_line(f, "#pragma unroll");
  cu_open(f, "for (int o = 16; o > 0; o >>= 1)");
  cu_line(f, "const %s ov = __shfl_xor_sync(0xffffffffu, bv, o);", ct);
  cu_line(f, "const int oi = __shfl_xor_sync(0xffffffffu, bi, o);");
  cu_line(f, "if (beats(bv, bi, ov, oi)) bv = ov, bi = oi;");
  cu_close(f);
  cu_line(f, "if (threadIdx.x %% 32 == 0) wv[threadIdx.x / 32] = bv, wi[threadIdx.x / 32] = bi;");
  cu_line(f, "__syncthreads();");
  cu_line(f, "bv = wv[0], bi = wi[0];");
  cu_line(f, "for (int w = 1; w < (int)(blockDim.x / 32); w++)");
  cu_line(f, "  if (beats(bv, bi, wv[w], wi[w])) bv = wv[w], bi = wi[w];");
  cu_line(f, "__syncthreads();  // every thread has read wv before the next round writes it");
  cu_line(f, "if (h < cnt && ti[h] == bi) h++;");
  cu_open(f, "if (threadIdx.x == 0)");
  CuCoords oc = co;
  oc.c[ax] = "r";
  if (cu_is_output(f, vout)) {
    CuVal v = {{"bv"}};
    cu_store(f, vout, &oc, &v);
  }
  if (cu_is_output(f, iout)) {
    CuVal v = {{"(long long)bi"}};
    cu_store(f, iout, &oc, &v);
  }
  cu_close(f);
  cu_close(f);
  cu_close(f);
}

/* ---- arange ---- */

static void emit_arange(CuFn *f, CuLaunch *l, const int *epi, int nepi) {
  const Graph *g = f->g;
  const Node *n = &g->node[f->anchor];
  int out = n->out[0];
  const TensorType *yt = &g->val[out].type, *st = &g->val[n->in[0]].type;
  int64_t items = ir_type_numel(yt);
  l->kind = "elementwise";
  l->block[0] = CU_EW_THREADS;
  l->grid[0] = cu_grid_for(items, CU_EW_THREADS);
  if (items == 0) return;
  const char *s0 = cu_tmp(f);
  {
    /* start's one element, at coordinates 0 */
    const char *zeros[IR_MAX_RANK];
    for (int d = 0; d < st->rank; d++) zeros[d] = "0";
    CuCoords sc;
    cu_coords_scalar(&sc, st->rank, zeros);
    CuVal s;
    cu_emit(f, n->in[0], &sc, &s);
    cu_line(f, "const long long %s = (long long)(%s);  // start", s0, s.l[0]);
  }
  const char *i = cu_tmp(f);
  cu_open(f, "for (%s %s = (%s)blockIdx.x * blockDim.x + threadIdx.x; %s < %lld; %s += (%s)gridDim.x * blockDim.x)", f->idx,
          i, f->idx, i, (long long)items, i, f->idx);
  CuVal y = {{0}};
  y.l[0] = cu_tmp(f);
  cu_line(f, "const long long %s = %s;  // %s (arange)", y.l[0], cu_normalise(f, yt->dt, cu_fmt(f, "%s + (long long)%s", s0, i)),
          g->val[out].name);
  const char *c[1] = {i};
  CuCoords co;
  cu_coords_scalar(&co, 1, c);
  cu_store_epilogue(f, epi, nepi, &co, &y);
  cu_close(f);
}

/* ---- entry ---- */

void cu_emit_state_op(CuFn *f, CuLaunch *l) {
  int *epi, nepi, *side, nside;
  cu_split_outputs(f, &epi, &nepi, &side, &nside);
  if (nside) cu_store_loops(f, side, nside);
  switch (f->g->node[f->anchor].op) {
  case OP_SCATTER: emit_scatter(f, l, epi, nepi); break;
  case OP_ARGMAX: emit_argmax(f, l, epi, nepi); break;
  case OP_TOPK: emit_topk(f, l, epi, nepi); break;
  case OP_ARANGE: emit_arange(f, l, epi, nepi); break;
  default: cu_fail(f, ST_INTERNAL, "cu_emit_state_op: %s", ir_op_name(f->g->node[f->anchor].op)); break;
  }
}
