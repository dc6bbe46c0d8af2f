/* Lowering with ranged dims (SPEC §2; ir.h: TensorType.dyn).
 *
 * Memory is laid out at each range's max; a run at a smaller value d uses
 * the leading a * d + b entries of every ranged axis.  Kernels stay
 * exact-shape code compiled at the max, and a run at d does less work in
 * two ways:
 *   - the runtime runs only the tasks whose rows exist (Kernel.rg): every
 *     kernel's tasks are laid out over its iteration space (lower.h), so
 *     the tasks along a ranged axis are a block per outer index;
 *   - the few loops inside a task that run along a ranged axis read d
 *     (args[nargs], format/kernel.h): the indices a scatter writes, the
 *     start of a slice counted from the end.
 * That is exact only where no result depends on the entries beyond the
 * valid ones, which is checked here node by node: nothing reduces,
 * contracts, concatenates or splits along a ranged axis, a reshape keeps
 * the ranged axis outermost of what it regroups, and so on.  What is
 * refused names the node and says why.
 */
#include <string.h>

#include "codegen/lower.h"

static int dyn_axis(const TensorType *t) {
  for (int a = 0; a < t->rank; a++)
    if (t->dyn[a]) return a;
  return -1;
}

static smelt_status refuse(const Graph *g, const Node *n, const char *why, int v) {
  char ty[128];
  const Value *x = &g->val[v];
  const char *range = "";
  int a = dyn_axis(&x->type);
  if (a >= 0) range = g->ranges[x->type.dyn[a] - 1].name;
  return st_at(n->loc, "node '%s' (%s): %s ('%s' is %s along ranged dim '%s'); compile exact values of the dim "
               "instead (--dim %s=A,B,...)",
               ir_node_name(g, n), ir_op_name(n->op), why, x->name, ir_type_str(&x->type, ty, sizeof ty), range, range);
}

/* Products of the extents before and after axis a. */
static void around(const TensorType *t, int a, int64_t *before, int64_t *after) {
  *before = *after = 1;
  for (int i = 0; i < a; i++) *before *= t->dim[i];
  for (int i = a + 1; i < t->rank; i++) *after *= t->dim[i];
}

static int ranged_axes(const TensorType *t) {
  int n = 0;
  for (int a = 0; a < t->rank; a++) n += t->dyn[a] != 0;
  return n;
}

static smelt_status check_node(const Graph *g, const Node *n) {
  for (int i = 0; i < n->nin + n->nout; i++) {
    int v = i < n->nin ? n->in[i] : n->out[i - n->nin];
    if (v >= 0 && ranged_axes(&g->val[v].type) > 1) return refuse(g, n, "a tensor may have one ranged axis", v);
  }
  if (n->nin == 0) return NULL;
  int x = n->in[0], y = n->out[0];
  const TensorType *xt = &g->val[x].type, *yt = &g->val[y].type;
  int xa = dyn_axis(xt), ya = dyn_axis(yt);
  bool red[IR_MAX_RANK];
  if (cg_reduced_axes(g, n, red)) {
    if (xa >= 0 && red[xa]) return refuse(g, n, "it reduces along a ranged axis", x);
    return NULL;
  }
  switch (n->op) {
  case OP_MATMUL: {
    const TensorType *bt = &g->val[n->in[1]].type;
    bool ta = ir_attr_int(n, "transpose_a") != 0, tb = ir_attr_int(n, "transpose_b") != 0;
    int ka = xt->rank == 1 ? 0 : ta ? xt->rank - 2 : xt->rank - 1;
    int kb = bt->rank == 1 ? 0 : tb ? bt->rank - 1 : bt->rank - 2;
    if (xt->dyn[ka]) return refuse(g, n, "it contracts along a ranged axis", x);
    if (bt->dyn[kb]) return refuse(g, n, "it contracts along a ranged axis", n->in[1]);
    if (bt->rank > 1 && yt->dyn[yt->rank - 1]) return refuse(g, n, "its columns follow a ranged dim", y);
    return NULL;
  }
  case OP_CONV2D: case OP_MAX_POOL2D: case OP_AVG_POOL2D:
    for (int i = 0; i < n->nin; i++)
      for (int a = 2; a < g->val[n->in[i]].type.rank; a++)
        if (g->val[n->in[i]].type.dyn[a]) return refuse(g, n, "its window slides along a ranged axis", n->in[i]);
    if (n->nin > 1 && dyn_axis(&g->val[n->in[1]].type) >= 0) return refuse(g, n, "its weights are ranged", n->in[1]);
    return NULL;
  case OP_ATTENTION: {
    const TensorType *kt = &g->val[n->in[1]].type, *vt = &g->val[n->in[2]].type;
    bool cache = ir_attr_int(n, "cache") != 0, causal = ir_attr_int(n, "causal") != 0;
    if (xt->dyn[0] || xt->dyn[1] || xt->dyn[3]) return refuse(g, n, "only its query rows may follow a ranged dim", x);
    for (int i = 1; i < 3; i++) {
      const TensorType *t = i == 1 ? kt : vt;
      if (t->dyn[0] || t->dyn[1] || t->dyn[3]) return refuse(g, n, "only its key rows may follow a ranged dim", n->in[i]);
      /* keys along the range: causal self-attention over the same rows
       * never reads a key beyond its query, the others would */
      if (t->dyn[2] && (cache || !causal || t->dyn[2] != xt->dyn[2] || t->dyn_a[2] != xt->dyn_a[2] ||
                        t->dyn_b[2] != xt->dyn_b[2]))
        return refuse(g, n, "its keys follow a ranged dim (only causal self-attention over the query rows may)", n->in[i]);
    }
    if (!cache && n->nin > 3 && n->in[3] >= 0 && dyn_axis(&g->val[n->in[3]].type) >= 0)
      return refuse(g, n, "its mask is ranged", n->in[3]);
    return NULL;
  }
  case OP_CONCAT: case OP_SPLIT: {
    int ax = ir_norm_axis(ir_attr_int(n, "axis"), xt->rank);
    for (int i = 0; i < n->nin; i++)
      if (ax >= 0 && g->val[n->in[i]].type.dyn[ax]) return refuse(g, n, "it joins or splits along a ranged axis", n->in[i]);
    for (int i = 0; i < n->nout; i++)
      if (ax >= 0 && g->val[n->out[i]].type.dyn[ax]) return refuse(g, n, "it joins or splits along a ranged axis", n->out[i]);
    return NULL;
  }
  case OP_SLICE: {
    int ax = ir_norm_axis(ir_attr_int(n, "axis"), xt->rank);
    if (ax >= 0 && xt->dyn[ax] && ir_attr_int(n, "step") != 1)
      return refuse(g, n, "it steps along a ranged axis (only step 1 is supported there)", x);
    /* an end counted from the end of a ranged axis would move with it */
    if (ax >= 0 && xt->dyn[ax] && ir_attr_int(n, "end") < 0) return refuse(g, n, "its end counts from the end of a ranged axis", x);
    return NULL;
  }
  case OP_GATHER: {
    int ax = ir_norm_axis(ir_attr_int(n, "axis"), xt->rank);
    if (ax >= 0 && xt->dyn[ax]) return refuse(g, n, "it picks along a ranged axis", x);
    return NULL;
  }
  case OP_SCATTER: {
    if (dyn_axis(xt) >= 0) return refuse(g, n, "it writes into a ranged tensor", x);
    return NULL;
  }
  case OP_RESHAPE: case OP_SQUEEZE: case OP_UNSQUEEZE: {
    /* laid out at the max, the valid entries of x and y must be the same
     * bytes: the same blocks before the ranged axis and the same entries
     * in each row of it */
    if (xa < 0 && ya < 0) return NULL;
    if (xa < 0 || ya < 0) return refuse(g, n, "it moves a ranged axis into a fixed one", xa < 0 ? y : x);
    int64_t xb, xq, yb, yq;
    around(xt, xa, &xb, &xq);
    around(yt, ya, &yb, &yq);
    if (xb != yb || xt->dyn[xa] != yt->dyn[ya] || (int64_t)xt->dyn_a[xa] * xq != (int64_t)yt->dyn_a[ya] * yq ||
        (int64_t)xt->dyn_b[xa] * xq != (int64_t)yt->dyn_b[ya] * yq)
      return refuse(g, n, "it regroups a ranged axis with the axes outside it", x);
    return NULL;
  }
  default: return NULL;
  }
}

smelt_status cg_check_ranged(const Graph *g) {
  if (!g->nranges) return NULL;
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_CONST && dyn_axis(&g->val[v].type) >= 0) {
      char ty[128];
      return st_at(g->val[v].loc, "constant '%s' %s depends on a ranged dim; it is computed at compile time, so a "
                   "range cannot change it (make it an input, or compile exact values of the dim)",
                   g->val[v].name, ir_type_str(&g->val[v].type, ty, sizeof ty));
    }
  for (int i = 0; i < g->nnode; i++)
    if (!g->node[i].dead) RETURN_IF_ERROR(check_node(g, &g->node[i]));
  return NULL;
}

/* The KernelRange of a task space ts[0..n) (row-major) whose axis i runs
 * along axis ax[i] of tensor tt[i] (tt[i] NULL: along no tensor axis). */
static smelt_status space_range(const Kernel *k, int n, const int64_t *ts, const TensorType *const *tt, const int *ax,
                                KernelRange *out) {
  memset(out, 0, sizeof *out);
  int at = -1;
  for (int i = 0; i < n; i++) {
    if (!tt[i] || !tt[i]->dyn[ax[i]]) continue;
    if (at >= 0)
      return st_error(ST_UNSUPPORTED, "kernel %s: its tasks run along two ranged axes; compile exact values instead",
                      k->name);
    at = i;
  }
  if (at < 0) return NULL;
  out->range = tt[at]->dyn[ax[at]];
  out->a = tt[at]->dyn_a[ax[at]];
  out->b = tt[at]->dyn_b[ax[at]];
  out->outer = out->inner = 1;
  for (int i = 0; i < at; i++) out->outer *= ts[i];
  for (int i = at + 1; i < n; i++) out->inner *= ts[i];
  out->mid = ts[at];
  return NULL;
}

/* The elementwise space of t (lower.h: CgSpace) as a task space. */
static int elemwise_space(const TensorType *t, int64_t *ts, const TensorType **tt, int *ax) {
  CgSpace s;
  int n = 0;
  cg_elemwise_space(t, &s);
  for (int i = 0; i + 1 < t->rank; i++) ts[n] = t->dim[i], tt[n] = t, ax[n++] = i;
  /* a ranged last axis is cut into chunks of one element (lower.c) */
  ts[n] = s.nchunks, tt[n] = t->rank && t->dyn[t->rank - 1] ? t : NULL, ax[n++] = t->rank ? t->rank - 1 : 0;
  return n;
}

bool cg_same_task_rows(const Kernel *k, const TensorType *t) {
  int64_t ts[IR_MAX_RANK + 1];
  const TensorType *tt[IR_MAX_RANK + 1];
  int ax[IR_MAX_RANK + 1];
  int n = elemwise_space(t, ts, tt, ax);
  int64_t total = 1;
  for (int i = 0; i < n; i++) total *= ts[i];
  Kernel pk = {.ntasks = total};
  KernelRange r;
  smelt_status st = space_range(&pk, n, ts, tt, ax, &r);
  if (st) {
    st_free(st);
    return false;
  }
  if (!r.range && !k->rg.range) return true;
  /* task t covers the rows [t * total / ntasks, (t + 1) * total / ntasks) */
  return r.range == k->rg.range && r.a == k->rg.a && r.b == k->rg.b && r.outer == k->rg.outer &&
         r.mid == k->rg.mid && k->ntasks > 0 && total % k->ntasks == 0 && r.inner == k->rg.inner * (total / k->ntasks);
}

smelt_status cg_kernel_range(const Graph *g, int anchor, const TensorType *main_out, Kernel *k) {
  memset(&k->rg, 0, sizeof k->rg);
  if (!g->nranges || k->ntasks <= 1) return NULL;
  int64_t ts[IR_MAX_RANK + 1];
  const TensorType *tt[IR_MAX_RANK + 1];
  int ax[IR_MAX_RANK + 1], n = 0;
  if (anchor < 0) {
    /* [rows..., chunks] over the largest result (lower.h: CgSpace) */
    if (!main_out) return NULL;
    n = elemwise_space(main_out, ts, tt, ax);
  } else {
    const Node *nd = &g->node[anchor];
    const TensorType *x = &g->val[nd->in[0]].type, *y = &g->val[nd->out[0]].type;
    bool red[IR_MAX_RANK];
    if (cg_reduced_axes(g, nd, red)) {
      for (int i = 0; i < x->rank; i++)
        if (!red[i]) ts[n] = x->dim[i], tt[n] = x, ax[n++] = i;
    } else if (nd->op == OP_MATMUL) {
      int64_t rows, ncb;
      cg_matmul_space(g, nd, &rows, &ncb);
      bool b1 = g->val[nd->in[1]].type.rank == 1;
      ts[n] = ncb, tt[n] = NULL, ax[n++] = 0;
      for (int i = 0; i < y->rank - (b1 ? 0 : 1); i++) ts[n] = y->dim[i], tt[n] = y, ax[n++] = i;
    } else if (nd->op == OP_CONV2D || nd->op == OP_MAX_POOL2D || nd->op == OP_AVG_POOL2D || nd->op == OP_ATTENTION) {
      for (int i = 0; i < 3; i++) ts[n] = y->dim[i], tt[n] = y, ax[n++] = i;
    } else {
      return NULL; /* one task (scatter, argmax, arange): bounded inside */
    }
  }
  int64_t prod = 1;
  for (int i = 0; i < n; i++) prod *= ts[i];
  if (prod != k->ntasks)
    return st_error(ST_INTERNAL, "kernel %s: %lld tasks, its space has %lld", k->name, (long long)k->ntasks, (long long)prod);
  return space_range(k, n, ts, tt, ax, &k->rg);
}
