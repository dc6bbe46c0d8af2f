/* Row-reduction kernels: sum, mean, max, min (over any set of axes),
 * softmax, log_softmax, layer_norm, rms_norm (over one axis) and
 * global_avg_pool, each with its fused elementwise prologue (whatever
 * computes the reduced input: residual adds, casts, ...) and epilogue.
 *
 * The reduced input X is seen as rows (every combination of the kept axes)
 * of L elements (every combination of the reduced axes).  Short rows get a
 * warp each (four rows per 128-thread block); long rows a block of up to
 * 1024 threads.  Each thread takes `items` strided chunks of `lanes`
 * consecutive elements and, when the row fits (items * lanes <= 64 values
 * per thread), keeps its X values in registers across the passes:
 *   pass 1   X computed once (prologue values of X's shape that escape,
 *            e.g. the residual sum, are stored here), partial sum/max
 *   reduce   warp shuffles (__shfl_xor_sync), then shared memory across
 *            warps; every thread ends with the row's value
 *   pass 2   (layer_norm: squared deviations from the mean, two-pass as
 *            the reference; softmax: sum of exp(x - max))
 *   final    softmax/norms: each element's result and the epilogue at its
 *            coordinates; sum/mean/max/min: thread 0 of the row computes the
 *            row's one result and its epilogue.
 * A row too long for registers computes X again in each pass (the
 * prologue is recomputed, memory is read again): correct and simple.
 *
 * Lanes (16-byte loads) are used when the innermost dim of X is reduced
 * and divisible; without the alignment guarantee the kernel body is
 * generated twice, vector and scalar, and a block-uniform test of the
 * pointers picks one at run time.
 */
#include <math.h>
#include <string.h>

#include "codegen/cuda/cu_kernels.h"

/* Most X values one thread keeps in registers. */
#define CU_ROW_REGS 64
/* Rows of at most this many items (chunks of lanes) get a warp. */
#define CU_WARP_ROW_ITEMS 128
#define CU_WARP_ROWS_PER_BLOCK 4
/* Threads the GPU should get from a block-per-row kernel before a thread
 * takes more than one item of its row (132 SMs x 1024 threads: an H200
 * full at 50% occupancy is ~68k; fewer rows than that share out less). */
#define CU_ROW_TARGET_THREADS (132 * 1024)

typedef struct {
  const Node *an;
  int x;                 /* the reduced input value */
  const TensorType *xt;
  bool red[IR_MAX_RANK];
  TensorType kt, rt;     /* kept dims, reduced dims (as shapes) */
  int64_t rows, len;
  bool warp_mode;
  int threads;           /* per row */
  int *epi, nepi, *side_x, nside_x;
} Red;

static bool row_op(Op op) { return op == OP_SOFTMAX || op == OP_LOG_SOFTMAX || op == OP_LAYER_NORM || op == OP_RMS_NORM; }

/* X's coordinates for kept coordinates kc and reduced linear index k
 * (lanes consecutive elements when lanes > 1). */
static void x_coords(CuFn *f, const Red *r, const CuCoords *kc, const char *k, int lanes, CuCoords *out) {
  CuCoords rc;
  cu_delinearize(f, k, &r->rt, &rc);
  memset(out, 0, sizeof *out);
  out->rank = r->xt->rank;
  out->lanes = lanes;
  out->aligned = true;
  for (int d = 0, ik = 0, ir = 0; d < r->xt->rank; d++) out->c[d] = r->red[d] ? rc.c[ir++] : kc->c[ik++];
  if (lanes > 1) out->step[r->xt->rank - 1] = 1;
}

/* The reduced position's coordinates for a norm's gamma/beta ([len]). */
static void param_coords(const CuCoords *xc, int axis, CuCoords *out) {
  memset(out, 0, sizeof *out);
  out->rank = 1;
  out->lanes = xc->lanes;
  out->aligned = xc->aligned;
  out->c[0] = xc->c[axis];
  out->step[0] = xc->step[axis];
}

/* Opens the loop over this thread's items of a row; sets *k to the first
 * element's index.  `cached`: a fixed count, unrolled, index `it`. */
static void open_items(CuFn *f, const Red *r, int lanes, int items, bool cached, const char *tid, const char **k,
                       const char **it) {
  int T = r->threads;
  *k = cu_tmp(f);
  if (cached) {
    *it = cu_tmp(f);
    cu_line(f, "#pragma unroll");
    cu_open(f, "for (int %s = 0; %s < %d; %s++)", *it, *it, items, *it);
    cu_line(f, "const %s %s = (%s + %s * %d) * %d;", f->idx, *k, tid, *it, T, lanes);
    cu_open(f, "if (%s < %lld)", *k, (long long)r->len);
  } else {
    *it = NULL;
    cu_open(f, "for (%s %s = %s * %d; %s < %lld; %s += %d)", f->idx, *k, tid, lanes, *k, (long long)r->len, *k,
            T * lanes);
  }
}

static void close_items(CuFn *f, bool cached) {
  cu_close(f);
  if (cached) cu_close(f);
}

/* X at this item: from the registers (and then known to the memo, so an
 * epilogue that reads X again reads the registers) or computed again. */
static void x_at(CuFn *f, const Red *r, const CuCoords *xc, const char *xr, const char *it, int lanes, CuVal *x) {
  if (!xr) {
    cu_emit(f, r->x, xc, x);
    return;
  }
  for (int j = 0; j < lanes; j++) x->l[j] = cu_fmt(f, "%s[%s * %d + %d]", xr, it, lanes, j);
  cu_memo_put(f, r->x, xc, x);
}

static const char *reduce_call(CuFn *f, const Red *r, const char *opname, const char *v, const char *scratch) {
  if (r->warp_mode) return cu_fmt(f, "smelt_warp_reduce(%s, %s())", v, opname);
  return cu_fmt(f, "smelt_block_reduce(%s, %s(), %s)", v, opname, scratch);
}

/* One variant of the kernel body: lanes 1 or the vector width. */
static void body(CuFn *f, const Red *r, int lanes) {
  const Graph *g = f->g;
  Op op = r->an->op;
  DType xdt = r->xt->dt;
  const char *ct = cu_ctype(xdt);
  int T = r->threads;
  int64_t items_total = r->len / lanes;
  int items = (int)((items_total + T - 1) / T);
  bool cached = (int64_t)items * lanes <= CU_ROW_REGS && items > 0;
  const char *tid = cu_tmp(f), *row = cu_tmp(f);
  /* With a ranged kept axis, the rows past this run's extent are left
   * alone: a warp (warp mode) or the whole block (the test is the same in
   * all its threads, so no barrier inside is skipped by some) */
  TensorType kr = {.dt = r->xt->dt};
  for (int d = 0; d < r->xt->rank; d++)
    if (!r->red[d]) {
      kr.dim[kr.rank] = r->xt->dim[d], kr.dyn[kr.rank] = r->xt->dyn[d];
      kr.dyn_a[kr.rank] = r->xt->dyn_a[d], kr.dyn_b[kr.rank++] = r->xt->dyn_b[d];
    }
  const char *live = cu_live(f, &kr, row);
  if (r->warp_mode) {
    cu_line(f, "const int %s = threadIdx.x %% 32;", tid);
    cu_line(f, "const %s %s = (%s)blockIdx.x * %d + threadIdx.x / 32;", f->idx, row, f->idx, CU_WARP_ROWS_PER_BLOCK);
    /* a whole warp shares a row, so the test keeps warps converged */
    if (live) cu_open(f, "if (%s < %lld && %s)", row, (long long)r->rows, live);
    else cu_open(f, "if (%s < %lld)", row, (long long)r->rows);
  } else {
    cu_line(f, "const int %s = threadIdx.x;", tid);
    cu_line(f, "const %s %s = blockIdx.x;", f->idx, row);
    if (live) cu_open(f, "if (%s)", live);
    else cu_open(f, "%s", "");
  }
  CuCoords kc;
  cu_delinearize(f, row, &r->kt, &kc);
  const char *scratch = "smelt_red";
  const char *xr = NULL;
  if (cached) {
    xr = cu_tmp(f);
    cu_line(f, "%s %s[%d];  // this thread's elements of %s", ct, xr, items * lanes, g->val[r->x].name);
  }
  /* pass 1 */
  const char *acc = cu_tmp(f);
  const char *init = "0";
  if (op == OP_MAX || op == OP_SOFTMAX || op == OP_LOG_SOFTMAX) init = dt_is_float(xdt) ? cu_const(f, xdt, -INFINITY) : "(-0x7fffffffffffffffLL - 1)";
  if (op == OP_MIN) init = dt_is_float(xdt) ? cu_const(f, xdt, INFINITY) : "0x7fffffffffffffffLL";
  cu_line(f, "%s %s = %s;", ct, acc, init);
  const char *k, *it;
  open_items(f, r, lanes, items, cached, tid, &k, &it);
  {
    CuCoords xc;
    x_coords(f, r, &kc, k, lanes, &xc);
    CuVal x;
    cu_emit(f, r->x, &xc, &x);
    for (int j = 0; j < lanes; j++) {
      if (xr) cu_line(f, "%s[%s * %d + %d] = %s;", xr, it, lanes, j, x.l[j]);
      switch (op) {
      case OP_MAX: case OP_SOFTMAX: case OP_LOG_SOFTMAX: cu_line(f, "%s = %s;", acc, cu_max_nan(f, xdt, acc, x.l[j])); break;
      case OP_MIN: cu_line(f, "%s = %s;", acc, cu_min_nan(f, xdt, acc, x.l[j])); break;
      case OP_RMS_NORM: cu_line(f, "%s += %s * %s;", acc, x.l[j], x.l[j]); break;
      default: cu_line(f, "%s += %s;", acc, x.l[j]); break;
      }
    }
    for (int i = 0; i < r->nside_x; i++) {
      CuVal s;
      cu_emit(f, r->side_x[i], &xc, &s);
      cu_store(f, r->side_x[i], &xc, &s);
    }
  }
  close_items(f, cached);
  const char *opname = op == OP_MAX || op == OP_SOFTMAX || op == OP_LOG_SOFTMAX ? "smelt_max_op"
                       : op == OP_MIN                                          ? "smelt_min_op"
                                                                               : "smelt_sum_op";
  cu_line(f, "%s = %s;", acc, reduce_call(f, r, opname, acc, scratch));

  if (!row_op(op)) {
    /* One result per row.  Epilogue values of the result's shape are
     * computed by thread 0 of the row; values of X's shape that read the
     * result broadcast back over the row (x - mean(x, keepdims)) by every
     * thread in a last pass over the row. */
    const Value *av = &g->val[r->an->out[0]];
    const char *res;
    if (op == OP_MEAN) res = cu_fmt(f, "(%s / %s)", acc, cu_const(f, xdt, (double)r->len));
    else if (op == OP_GLOBAL_AVG_POOL) res = r->len ? cu_fmt(f, "(%s / %s)", acc, cu_const(f, xdt, (double)r->len)) : cu_const(f, xdt, 0);
    else res = cu_normalise(f, av->type.dt, acc);
    CuCoords oc;
    memset(&oc, 0, sizeof oc);
    oc.rank = av->type.rank;
    oc.lanes = 1;
    oc.aligned = true;
    bool keep = av->type.rank == r->xt->rank;
    for (int d = 0, ik = 0, o = 0; d < r->xt->rank; d++) {
      if (!r->red[d]) oc.c[o++] = kc.c[ik++];
      else if (keep) oc.c[o++] = "0";
    }
    CuVal rv = {{0}};
    rv.l[0] = cu_tmp(f);
    cu_line(f, "const %s %s = %s;  // %s (%s)", cu_ctype(av->type.dt), rv.l[0], res, av->name, ir_op_name(op));
    int *row_epi = arena_alloc(&f->arena, sizeof(int) * (size_t)(r->nepi + 1));
    int *out_epi = arena_alloc(&f->arena, sizeof(int) * (size_t)(r->nepi + 1));
    int nrow = 0, nout = 0;
    if (!row_epi || !out_epi) cu_fail(f, ST_NO_MEMORY, "out of memory"); /* and no epilogue */
    for (int i = 0; row_epi && out_epi && i < r->nepi; i++) {
      const TensorType *t = &g->val[r->epi[i]].type;
      bool is_out = t->rank == av->type.rank, is_row = t->rank == r->xt->rank;
      for (int d = 0; d < t->rank; d++) {
        is_out = is_out && t->dim[d] == av->type.dim[d];
        is_row = is_row && t->dim[d] == r->xt->dim[d];
      }
      if (is_row && !is_out) row_epi[nrow++] = r->epi[i];
      else out_epi[nout++] = r->epi[i]; /* cu_store_epilogue refuses other shapes */
    }
    if (nout) {
      cu_open(f, "if (%s == 0)", tid);
      cu_store_epilogue(f, out_epi, nout, &oc, &rv);
      cu_close(f);
    }
    if (nrow) {
      open_items(f, r, lanes, items, cached, tid, &k, &it);
      CuCoords xc;
      x_coords(f, r, &kc, k, lanes, &xc);
      CuVal x;
      x_at(f, r, &xc, xr, it, lanes, &x);
      cu_set_override(f, r->an->out[0], &oc, &rv);
      for (int i = 0; i < nrow; i++) {
        CuVal e;
        cu_emit(f, row_epi[i], &xc, &e);
        cu_store(f, row_epi[i], &xc, &e);
      }
      cu_clear_override(f);
      close_items(f, cached);
    }
    cu_close(f);
    return;
  }

  /* the row statistics the final pass needs */
  const char *mean = NULL, *inv = NULL, *sum = NULL;
  const char *sfx = xdt == DT_F64 ? "" : "f";
  if (op == OP_LAYER_NORM) {
    mean = cu_tmp(f);
    cu_line(f, "const %s %s = %s / %s;", ct, mean, acc, cu_const(f, xdt, (double)r->len));
    const char *var = cu_tmp(f);
    cu_line(f, "%s %s = 0;", ct, var);
    open_items(f, r, lanes, items, cached, tid, &k, &it);
    CuCoords xc;
    x_coords(f, r, &kc, k, lanes, &xc);
    CuVal x;
    x_at(f, r, &xc, xr, it, lanes, &x);
    for (int j = 0; j < lanes; j++) cu_line(f, "%s += (%s - %s) * (%s - %s);", var, x.l[j], mean, x.l[j], mean);
    close_items(f, cached);
    cu_line(f, "%s = %s;", var, reduce_call(f, r, "smelt_sum_op", var, scratch));
    inv = cu_tmp(f);
    cu_line(f, "const %s %s = rsqrt%s(%s / %s + %s);", ct, inv, sfx, var, cu_const(f, xdt, (double)r->len),
            cu_const(f, xdt, ir_attr_float(r->an, "eps")));
  } else if (op == OP_RMS_NORM) {
    inv = cu_tmp(f);
    cu_line(f, "const %s %s = rsqrt%s(%s / %s + %s);", ct, inv, sfx, acc, cu_const(f, xdt, (double)r->len),
            cu_const(f, xdt, ir_attr_float(r->an, "eps")));
  } else {
    sum = cu_tmp(f);
    cu_line(f, "%s %s = 0;", ct, sum);
    open_items(f, r, lanes, items, cached, tid, &k, &it);
    CuCoords xc;
    x_coords(f, r, &kc, k, lanes, &xc);
    CuVal x;
    x_at(f, r, &xc, xr, it, lanes, &x);
    for (int j = 0; j < lanes; j++) cu_line(f, "%s += exp%s(%s - %s);", sum, sfx, x.l[j], acc);
    close_items(f, cached);
    cu_line(f, "%s = %s;", sum, reduce_call(f, r, "smelt_sum_op", sum, scratch));
  }

  /* final pass: each element's result, then the epilogue at its coordinates */
  open_items(f, r, lanes, items, cached, tid, &k, &it);
  {
    CuCoords xc;
    x_coords(f, r, &kc, k, lanes, &xc);
    CuVal x, y, gam = {{0}}, bet = {{0}};
    x_at(f, r, &xc, xr, it, lanes, &x);
    int axis = -1;
    for (int d = 0; d < r->xt->rank; d++)
      if (r->red[d]) axis = d;
    if (op == OP_LAYER_NORM || op == OP_RMS_NORM) {
      CuCoords pc;
      param_coords(&xc, axis, &pc);
      cu_emit(f, r->an->in[1], &pc, &gam);
      if (r->an->nin > 2) cu_emit(f, r->an->in[2], &pc, &bet);
    }
    const char *name = g->val[r->an->out[0]].name;
    for (int j = 0; j < lanes; j++) {
      const char *e;
      switch (op) {
      case OP_SOFTMAX: e = cu_fmt(f, "exp%s(%s - %s) / %s", sfx, x.l[j], acc, sum); break;
      case OP_LOG_SOFTMAX: e = cu_fmt(f, "%s - %s - log%s(%s)", x.l[j], acc, sfx, sum); break;
      case OP_LAYER_NORM:
        e = r->an->nin > 2 ? cu_fmt(f, "(%s - %s) * %s * %s + %s", x.l[j], mean, inv, gam.l[j], bet.l[j])
                           : cu_fmt(f, "(%s - %s) * %s * %s", x.l[j], mean, inv, gam.l[j]);
        break;
      default: e = cu_fmt(f, "%s * %s * %s", x.l[j], inv, gam.l[j]); break;
      }
      y.l[j] = cu_tmp(f);
      if (j == 0) cu_line(f, "const %s %s = %s;  // %s (%s)", ct, y.l[j], e, name, ir_op_name(op));
      else cu_line(f, "const %s %s = %s;", ct, y.l[j], e);
    }
    cu_store_epilogue(f, r->epi, r->nepi, &xc, &y);
  }
  close_items(f, cached);
  cu_close(f);
}

void cu_emit_reduction(CuFn *f, CuLaunch *l) {
  const Graph *g = f->g;
  Red r;
  memset(&r, 0, sizeof r);
  r.an = &g->node[f->anchor];
  r.x = r.an->in[0];
  r.xt = &g->val[r.x].type;
  if (!cg_reduced_axes(g, r.an, r.red)) {
    cu_fail(f, ST_INTERNAL, "%s is not a row reduction", ir_op_name(r.an->op));
    return;
  }
  r.kt.dt = r.rt.dt = r.xt->dt;
  r.rows = r.len = 1;
  for (int d = 0; d < r.xt->rank; d++) {
    if (r.red[d]) {
      r.rt.dim[r.rt.rank++] = r.xt->dim[d];
      r.len *= r.xt->dim[d];
    } else {
      r.kt.dim[r.kt.rank++] = r.xt->dim[d];
      r.rows *= r.xt->dim[d];
    }
  }
  int *side, nside;
  cu_split_outputs(f, &r.epi, &r.nepi, &side, &nside);
  /* side results of X's shape are stored while X is computed; others get
   * loops of their own */
  r.side_x = arena_alloc(&f->arena, sizeof(int) * (size_t)(nside ? nside : 1));
  int *other = arena_alloc(&f->arena, sizeof(int) * (size_t)(nside ? nside : 1));
  if (!r.side_x || !other) {
    cu_fail(f, ST_NO_MEMORY, "out of memory");
    return;
  }
  int nother = 0;
  for (int i = 0; i < nside; i++) {
    const TensorType *t = &g->val[side[i]].type;
    bool eq = t->rank == r.xt->rank;
    for (int d = 0; eq && d < t->rank; d++) eq = t->dim[d] == r.xt->dim[d];
    if (eq) r.side_x[r.nside_x++] = side[i];
    else other[nother++] = side[i];
  }

  /* lanes: the innermost dim of X must be reduced and divisible */
  int lanes = 1;
  if (r.xt->rank > 0 && r.red[r.xt->rank - 1] && r.len > 0) {
    int *types = arena_alloc(&f->arena, sizeof(int) * (size_t)(f->k->nargs - f->nin + 1));
    if (!types) {
      cu_fail(f, ST_NO_MEMORY, "out of memory");
      return;
    }
    int nt = 0;
    types[nt++] = r.x;
    for (int i = 0; i < r.nepi; i++)
      if (row_op(r.an->op)) types[nt++] = r.epi[i];
    for (int i = 0; i < r.nside_x; i++) types[nt++] = r.side_x[i];
    lanes = cu_pick_lanes(f, r.xt, types, nt);
  }
  int64_t items = r.len / lanes;
  r.warp_mode = items <= CU_WARP_ROW_ITEMS;
  if (r.warp_mode) {
    r.threads = 32;
  } else {
    /* 4 items a thread, fewer when the rows are too few to give the GPU
     * enough warps that way (512 rows of 2048 f16: 1024 warps at 4 items,
     * 4096 at 1, for 132 SMs x 32): a row's loads then go out in one step */
    int64_t ipt = 4;
    while (ipt > 1 && r.rows * ((items + ipt - 1) / ipt) < (int64_t)CU_ROW_TARGET_THREADS) ipt /= 2;
    int64_t t = (items + ipt - 1) / ipt;
    t = (t + 31) / 32 * 32;
    r.threads = (int)(t > 1024 ? 1024 : t);
  }
  l->kind = "reduction";
  if (r.warp_mode) {
    l->block[0] = 32 * CU_WARP_ROWS_PER_BLOCK;
    int64_t blocks = (r.rows + CU_WARP_ROWS_PER_BLOCK - 1) / CU_WARP_ROWS_PER_BLOCK;
    l->grid[0] = (unsigned)(blocks < 1 ? 1 : blocks);
  } else {
    l->block[0] = (unsigned)r.threads;
    l->grid[0] = (unsigned)(r.rows < 1 ? 1 : r.rows);
  }
  if (r.rows > 0x7fffffffLL) {
    cu_fail(f, ST_UNSUPPORTED, "%lld rows exceed the grid", (long long)r.rows);
    return;
  }

  if (!r.warp_mode) cu_line(f, "__shared__ %s smelt_red[32];  // per-warp partial results", cu_ctype(r.xt->dt));
  if (nother) cu_store_loops(f, other, nother);
  if (r.rows == 0) return;
  if (lanes == 1) {
    body(f, &r, 1);
    return;
  }
  CuBuf vec = {0};
  CuBuf *saved = f->out;
  int saved_indent = f->indent;
  f->out = &vec;
  f->indent = saved_indent + 1;
  memset(f->vec_bytes, 0, sizeof(int) * (size_t)f->k->nargs);
  body(f, &r, lanes);
  f->out = saved;
  f->indent = saved_indent;
  const char *cond = cu_vec_condition(f);
  if (!cond[0] || f->opt->args_aligned) {
    cu_open(f, "%s", "");
    cu_buf_append_buf(f->out, &vec);
    cu_close(f);
  } else {
    /* the test is the same in every thread of the block: no divergence
     * around the __syncthreads inside */
    cu_open(f, "if (%s)", cond);
    cu_buf_append_buf(f->out, &vec);
    f->indent--;
    cu_line(f, "} else {");
    f->indent++;
    body(f, &r, 1);
    cu_close(f);
  }
  cu_buf_free(&vec);
}
