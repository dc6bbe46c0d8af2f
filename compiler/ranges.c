/* Ranged dims (SPEC §2): one program for every value of a dim in a range.
 *
 * The graph is built (frontend and passes) with each range at its max, so
 * that every buffer is laid out for the largest run.  Which axes follow a
 * range is found by building the graph again at two smaller values of the
 * range, max - 1 and max - 2 (the other ranges at their max), and comparing
 * the extents value by value: an axis whose extent changes is ranged, with
 * extent a * d + b fitted on the first two builds and checked on the third
 * (conv strides or integer division of a ranged dim would not fit, and are
 * refused rather than guessed).  Inference and the passes stay exact-shape
 * code; they never see a range.  The builds must agree in structure (the
 * same values, ranks and dtypes), which holds for pass pipelines whose
 * decisions do not depend on the sizes; a model where they do is refused
 * with the value where the graphs part.
 *
 * What the kernels may do along a ranged axis is checked when they are
 * lowered (codegen/lower.c: cg_lower_ranged).
 */
#include <stdlib.h>
#include <string.h>

#include "compiler/driver.h"

/* The dims of a build: every range at its max, range r (if >= 0) at v. */
static void probe_dims(const FeDim *dims, int ndims, const IrRange *ranges, int nranges, int r, int64_t v,
                       FeDim *out, int *out_n) {
  int n = 0;
  for (int i = 0; i < ndims; i++) {
    out[n] = dims[i];
    if (out[n].max > 0) out[n].value = out[n].max;
    out[n].max = 0;
    n++;
  }
  /* the model's own ranges are set by name like the others */
  for (int k = 0; k < nranges; k++) {
    int at = -1;
    for (int i = 0; i < n; i++)
      if (strcmp(out[i].name, ranges[k].name) == 0) at = i;
    if (at < 0) {
      if (k != r) continue; /* left to the model: it loads at the max */
      at = n++;
      out[at].name = ranges[k].name;
    }
    out[at].value = k == r ? v : ranges[k].max;
    out[at].max = 0;
  }
  *out_n = n;
}

/* Marks the axes of g whose extent follows range r, from the builds at
 * max (g), p1 and p2. */
static smelt_status compare(Graph *g, const Graph *g1, const Graph *g2, int r, int64_t p1, int64_t p2) {
  const IrRange *rg = &g->ranges[r];
  if (g1->nval != g->nval || (g2 && g2->nval != g->nval))
    return st_error(ST_UNSUPPORTED,
                    "ranged dim '%s': the model's graph has %d values at %s=%lld but %d at %s=%lld; a range needs "
                    "the same graph at every value (compile exact values instead: --dim %s=A,B,...)",
                    rg->name, g->nval, rg->name, (long long)rg->max, g1->nval, rg->name, (long long)p1, rg->name);
  for (int v = 0; v < g->nval; v++) {
    Value *x = &g->val[v];
    const Value *y = &g1->val[v], *z = g2 ? &g2->val[v] : NULL;
    if (x->kind == VK_DEAD) continue;
    if (y->kind != x->kind || y->type.rank != x->type.rank || y->type.dt != x->type.dt ||
        (z && (z->kind != x->kind || z->type.rank != x->type.rank)))
      return st_error(ST_UNSUPPORTED, "ranged dim '%s': value '%s' differs between %s=%lld and %s=%lld",
                      rg->name, x->name, rg->name, (long long)rg->max, rg->name, (long long)p1);
    for (int a = 0; a < x->type.rank; a++) {
      int64_t e = x->type.dim[a], e1 = y->type.dim[a];
      if (e == e1 && (!z || z->type.dim[a] == e)) continue;
      int64_t ka = e - e1, kb = e - ka * rg->max;
      char ty[128];
      if (ka <= 0 || ka > INT32_MAX || kb < INT32_MIN || kb > INT32_MAX || (z && z->type.dim[a] != ka * p2 + kb) ||
          ka * rg->min + kb < 0)
        return st_at(x->loc,
                     "value '%s' %s: its axis %d is %lld at %s=%lld and %lld at %s=%lld, not a*%s+b; a ranged dim "
                     "may only scale extents (compile exact values instead: --dim %s=A,B,...)",
                     x->name, ir_type_str(&x->type, ty, sizeof ty), a, (long long)e, rg->name, (long long)rg->max,
                     (long long)e1, rg->name, (long long)p1, rg->name, rg->name);
      if (x->type.dyn[a])
        return st_at(x->loc, "value '%s': its axis %d follows both ranged dims '%s' and '%s'; one axis may follow one",
                     x->name, a, g->ranges[x->type.dyn[a] - 1].name, rg->name);
      x->type.dyn[a] = (int8_t)(r + 1);
      x->type.dyn_a[a] = (int32_t)ka;
      x->type.dyn_b[a] = (int32_t)kb;
    }
  }
  return NULL;
}

smelt_status sc_build_ranged(ScBuildFn build, void *ctx, const FeDim *dims, int ndims, Graph **out) {
  *out = NULL;
  IrRange cli[IR_MAX_RANGES];
  int ncli = 0;
  for (int i = 0; i < ndims; i++) {
    if (dims[i].max <= 0) continue;
    if (ncli == IR_MAX_RANGES) return st_error(ST_INVALID_INPUT, "dims: more than %d ranges", IR_MAX_RANGES);
    cli[ncli++] = (IrRange){.name = dims[i].name, .min = dims[i].value, .max = dims[i].max};
  }
  FeDim pd[SC_MAX_DIMS + IR_MAX_RANGES];
  int npd;
  probe_dims(dims, ndims, NULL, 0, -1, 0, pd, &npd);
  Graph *g = NULL;
  RETURN_IF_ERROR(build(ctx, pd, npd, false, &g));
  /* the model's own ranges (those dims did not set) after the given ones */
  IrRange all[IR_MAX_RANGES];
  int n = 0;
  for (int i = 0; i < ncli; i++) all[n++] = cli[i];
  for (int i = 0; i < g->nranges; i++) {
    if (n == IR_MAX_RANGES) {
      ir_graph_destroy(g);
      return st_error(ST_INVALID_INPUT, "%s: more than %d ranged dims", g->file ? g->file : "model", IR_MAX_RANGES);
    }
    all[n++] = g->ranges[i];
  }
  g->nranges = n;
  for (int i = 0; i < n; i++) g->ranges[i] = (IrRange){ir_graph_strdup(g, all[i].name), all[i].min, all[i].max};
  smelt_status st = NULL;
  for (int r = 0; r < n && !st; r++) {
    const IrRange *rg = &g->ranges[r];
    int64_t p1 = rg->max - 1, p2 = rg->max - 2 >= rg->min ? rg->max - 2 : 0;
    Graph *g1 = NULL, *g2 = NULL;
    probe_dims(dims, ndims, g->ranges, n, r, p1, pd, &npd);
    st = build(ctx, pd, npd, true, &g1);
    if (!st && p2) {
      probe_dims(dims, ndims, g->ranges, n, r, p2, pd, &npd);
      st = build(ctx, pd, npd, true, &g2);
    }
    if (st) st = st_prefix(st, "ranged dim '%s' at %lld", rg->name, (long long)(g1 ? p2 : p1));
    if (!st) st = compare(g, g1, g2, r, p1, p2);
    ir_graph_destroy(g1);
    ir_graph_destroy(g2);
  }
  if (st) {
    ir_graph_destroy(g);
    return st;
  }
  *out = g;
  return NULL;
}
