/* const-fold: compute at compile time what does not depend on the inputs.
 *
 * Two rewrites, in this order:
 *
 * 1. batch_norm after conv2d or matmul.  Inference-form batch norm is a
 *    per-channel affine map y = (x - mean) * s + bias with
 *    s = scale / sqrt(var + eps), so when x comes from a contraction with a
 *    constant weight the factor can move into the weight:
 *      conv2d:  w'[o,...] = w[o,...] * s[o],  b'[o] = (b[o] - mean[o]) * s[o] + bias[o]
 *               (a conv without bias gets one);
 *      matmul:  x @ W with W [K,N] constant and a rank-2 result [M,N] whose
 *               channel axis 1 is N: W'[:,n] = W[:,n] * s[n], followed by a new
 *               add of b' = bias - mean * s.
 *    Only when the contraction's result has no other user (else the unscaled
 *    result would still be needed) and every weight and bn parameter is a
 *    constant.  The arithmetic is done in double and stored once in the
 *    weights' dtype.
 *
 * 2. Every live node whose operands are all constants is evaluated with the
 *    reference kernels (ir_eval_node) and each result becomes a constant with
 *    the result's name and init "folded".  Nodes are visited in topological
 *    order, so a chain of such nodes folds in one sweep.  A result that would
 *    exceed 16 MiB and is bigger than its operands together (an expand or
 *    broadcast of a small constant) stays a node: folding it would bloat the
 *    bundle to save a trivial kernel.
 *
 * A dequantize of constant weights is never folded: the quantised bytes are
 * what the kernels read (codegen dequantises inside the matmul), and
 * folding would store the weights in float again, 2-8x the bytes.
 *
 * Every fold is noted in the pass log.
 *
 * Requires: topological order (the pipeline compacts before each pass).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../ir/interp.h"
#include "passes.h"
#include "rewrite.h"

#define FOLD_GROWTH_LIMIT ((size_t)16 << 20)

/* ---- batch_norm into the preceding contraction ---- */

typedef struct {
  int64_t C;
  double *s;     /* scale / sqrt(var + eps), per channel */
  double *shift; /* bias - mean * s, per channel */
} BnAffine;

static bool all_const(const Graph *g, const Node *n, int from) {
  for (int i = from; i < n->nin; i++)
    if (!ir_is_const(g, n->in[i])) return false;
  return true;
}

/* Reads the bn parameters as one affine map per channel (malloc'd arrays). */
static bool bn_affine(const Graph *g, const Node *bn, BnAffine *out) {
  const Value *scale = &g->val[bn->in[1]], *bias = &g->val[bn->in[2]], *mean = &g->val[bn->in[3]],
              *var = &g->val[bn->in[4]];
  int64_t C = ir_type_numel(&scale->type);
  double eps = ir_attr_float(bn, "eps");
  out->C = C;
  out->s = malloc(sizeof(double) * (size_t)(C ? C : 1));
  out->shift = malloc(sizeof(double) * (size_t)(C ? C : 1));
  if (!out->s || !out->shift) {
    free(out->s);
    free(out->shift);
    return false;
  }
  for (int64_t c = 0; c < C; c++) {
    double s = dt_load(scale->type.dt, scale->data, (size_t)c) /
               sqrt(dt_load(var->type.dt, var->data, (size_t)c) + eps);
    out->s[c] = s;
    out->shift[c] = dt_load(bias->type.dt, bias->data, (size_t)c) -
                    dt_load(mean->type.dt, mean->data, (size_t)c) * s;
  }
  return true;
}

static void bn_affine_free(BnAffine *a) {
  free(a->s);
  free(a->shift);
}

/* A constant derived from value `like` (same type), data filled by caller. */
static int new_const_like(Graph *g, int like, const char *base, SrcLoc loc) {
  TensorType t = g->val[like].type;
  int c = ir_add_const(g, pass_fresh_name(g, base), t, NULL, loc);
  g->val[c].init = "folded";
  return c;
}

static smelt_status fold_bn_into_conv(Graph *g, PassCtx *ctx, int bn_id, int conv_id, bool *done) {
  Node *bn = &g->node[bn_id];
  Node *conv = &g->node[conv_id];
  int x = conv->in[0], w = conv->in[1], b = conv->nin > 2 ? conv->in[2] : -1, y = bn->out[0];
  BnAffine aff;
  if (!bn_affine(g, bn, &aff)) return st_error(ST_NO_MEMORY, "out of memory folding batch_norm");
  const TensorType wt = g->val[w].type;
  if (aff.C != wt.dim[0]) { /* inference guarantees it; be safe, not sorry */
    bn_affine_free(&aff);
    return NULL;
  }
  char base[512];
  snprintf(base, sizeof base, "%s.bn", g->val[w].name);
  SrcLoc loc = bn->loc;
  int w2 = new_const_like(g, w, base, loc);
  if (g->oom) { /* the new constants have no storage */
    bn_affine_free(&aff);
    return ir_graph_status(g);
  }
  int64_t per_o = wt.dim[0] ? ir_type_numel(&wt) / wt.dim[0] : 0;
  for (int64_t o = 0; o < wt.dim[0]; o++)
    for (int64_t k = 0; k < per_o; k++) {
      size_t i = (size_t)(o * per_o + k);
      dt_store(wt.dt, g->val[w2].data, i, dt_load(wt.dt, g->val[w].data, i) * aff.s[o]);
    }
  snprintf(base, sizeof base, "%s.bias", g->val[y].name);
  TensorType bt = {.dt = wt.dt, .rank = 1, .dim = {wt.dim[0]}};
  int b2 = ir_add_const(g, pass_fresh_name(g, base), bt, NULL, loc);
  g->val[b2].init = "folded";
  if (g->oom) {
    bn_affine_free(&aff);
    return ir_graph_status(g);
  }
  for (int64_t o = 0; o < wt.dim[0]; o++) {
    double bo = b >= 0 ? dt_load(g->val[b].type.dt, g->val[b].data, (size_t)o) : 0.0;
    dt_store(wt.dt, g->val[b2].data, (size_t)o, bo * aff.s[o] + aff.shift[o]);
  }
  bn_affine_free(&aff);

  const char *yname = g->val[y].name;
  int in[3] = {x, w2, b2};
  int nc = ir_add_node(g, OP_CONV2D, 3, in, 1, &yname, g->node[conv_id].loc);
  pass_copy_attrs(g, nc, conv_id);
  RETURN_IF_ERROR(ir_infer_node(g, nc));
  g->node[conv_id].dead = true;
  g->node[bn_id].dead = true;
  ir_replace_all_uses(g, y, g->node[nc].out[0]);
  pass_ctx_logf(ctx, "const-fold: folded batch_norm '%s' into conv2d '%s' (weight '%s', bias '%s')", yname,
                g->val[g->node[conv_id].out[0]].name, g->val[w2].name, g->val[b2].name);
  *done = true;
  return NULL;
}

static smelt_status fold_bn_into_matmul(Graph *g, PassCtx *ctx, int bn_id, int mm_id, bool *done) {
  Node *bn = &g->node[bn_id];
  Node *mm = &g->node[mm_id];
  int x = mm->in[0], w = mm->in[1], y = bn->out[0], mo = mm->out[0];
  const TensorType wt = g->val[w].type;
  bool tb = ir_attr_int(mm, "transpose_b") != 0;
  int64_t K = tb ? wt.dim[1] : wt.dim[0], N = tb ? wt.dim[0] : wt.dim[1];
  BnAffine aff;
  if (!bn_affine(g, bn, &aff)) return st_error(ST_NO_MEMORY, "out of memory folding batch_norm");
  if (aff.C != N) {
    bn_affine_free(&aff);
    return NULL;
  }
  char base[512];
  snprintf(base, sizeof base, "%s.bn", g->val[w].name);
  SrcLoc loc = bn->loc;
  int w2 = new_const_like(g, w, base, loc);
  if (g->oom) {
    bn_affine_free(&aff);
    return ir_graph_status(g);
  }
  for (int64_t k = 0; k < K; k++)
    for (int64_t n = 0; n < N; n++) {
      size_t i = (size_t)(tb ? n * K + k : k * N + n);
      dt_store(wt.dt, g->val[w2].data, i, dt_load(wt.dt, g->val[w].data, i) * aff.s[n]);
    }
  snprintf(base, sizeof base, "%s.bias", g->val[y].name);
  TensorType bt = {.dt = wt.dt, .rank = 1, .dim = {N}};
  int b2 = ir_add_const(g, pass_fresh_name(g, base), bt, NULL, loc);
  g->val[b2].init = "folded";
  if (g->oom) {
    bn_affine_free(&aff);
    return ir_graph_status(g);
  }
  for (int64_t n = 0; n < N; n++) dt_store(wt.dt, g->val[b2].data, (size_t)n, aff.shift[n]);
  bn_affine_free(&aff);

  /* the new matmul takes over the old one's name (that node dies), the add
   * the batch_norm's, so every surviving value keeps its YAML name */
  const char *mname = g->val[mo].name, *yname = g->val[y].name;
  int in[2] = {x, w2};
  int nm = ir_add_node(g, OP_MATMUL, 2, in, 1, &mname, g->node[mm_id].loc);
  pass_copy_attrs(g, nm, mm_id);
  RETURN_IF_ERROR(ir_infer_node(g, nm));
  int ain[2] = {g->node[nm].out[0], b2};
  int na = ir_add_node(g, OP_ADD, 2, ain, 1, &yname, loc);
  RETURN_IF_ERROR(ir_infer_node(g, na));
  g->node[mm_id].dead = true;
  g->node[bn_id].dead = true;
  ir_replace_all_uses(g, y, g->node[na].out[0]);
  pass_ctx_logf(ctx, "const-fold: folded batch_norm '%s' into matmul '%s' (weight '%s', bias add of '%s')", yname,
                mname, g->val[w2].name, g->val[b2].name);
  *done = true;
  return NULL;
}

/* Folds bn node `id` into its producer when the pattern applies. */
static smelt_status try_fold_bn(Graph *g, PassCtx *ctx, int id, const int *uses, bool *done) {
  Node *bn = &g->node[id];
  if (!all_const(g, bn, 1)) return NULL;
  int xv = bn->in[0];
  Node *p = pass_producer(g, xv);
  if (!p || uses[xv] != 1 || pass_is_output(g, xv)) return NULL;
  int pid = (int)(p - g->node);
  if (p->op == OP_CONV2D && all_const(g, p, 1)) return fold_bn_into_conv(g, ctx, id, pid, done);
  if (p->op == OP_MATMUL && ir_is_const(g, p->in[1]) && g->val[p->in[1]].type.rank == 2 &&
      g->val[xv].type.rank == 2)
    return fold_bn_into_matmul(g, ctx, id, pid, done);
  return NULL;
}

/* ---- evaluating all-constant nodes ---- */

static smelt_status fold_node(Graph *g, PassCtx *ctx, int id, bool *done) {
  Node *n = &g->node[id];
  size_t in_bytes = 0, out_bytes = 0;
  for (int i = 0; i < n->nin; i++) in_bytes += ir_type_bytes(&g->val[n->in[i]].type);
  for (int i = 0; i < n->nout; i++) out_bytes += ir_type_bytes(&g->val[n->out[i]].type);
  if (out_bytes > FOLD_GROWTH_LIMIT && out_bytes > in_bytes) {
    pass_ctx_logf(ctx, "const-fold: kept '%s' (%s): its result (%zu bytes) would grow the constants past %zu bytes",
                  ir_node_name(g, n), ir_op_name(n->op), out_bytes, FOLD_GROWTH_LIMIT);
    return NULL;
  }
  const void *in[64];
  void *out[64];
  if (n->nin > 64 || n->nout > 64) return NULL;
  for (int i = 0; i < n->nin; i++) in[i] = g->val[n->in[i]].data;
  /* results go straight into new constants: allocate them first, then
   * evaluate into their arena storage */
  int nout = n->nout;
  int consts[64];
  for (int i = 0; i < nout; i++) {
    int v = g->node[id].out[i];
    consts[i] = ir_add_const(g, g->val[v].name, g->val[v].type, NULL, g->val[v].loc);
    g->val[consts[i]].init = "folded";
  }
  if (g->oom) return ir_graph_status(g); /* the constants have no storage */
  n = &g->node[id];
  for (int i = 0; i < n->nin; i++) in[i] = g->val[n->in[i]].data; /* g->val may have moved */
  for (int i = 0; i < nout; i++) out[i] = g->val[consts[i]].data;
  smelt_status st = ir_eval_node(g, n, in, out);
  if (st) {
    /* A kernel that fails at compile time fails at run time too (e.g. a
     * gather index out of range): say where, as the run would. */
    for (int i = 0; i < nout; i++) g->val[consts[i]].kind = VK_DEAD;
    return st;
  }
  n->dead = true;
  for (int i = 0; i < nout; i++) ir_replace_all_uses(g, n->out[i], consts[i]);
  pass_ctx_logf(ctx, "const-fold: folded '%s' (%s) into a constant", ir_node_name(g, n), ir_op_name(n->op));
  *done = true;
  return NULL;
}

smelt_status pass_const_fold(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  int *uses = ir_use_counts(g);
  if (!uses) return st_error(ST_NO_MEMORY, "out of memory");
  bool bn_folded = false;
  int nnode = g->nnode; /* nodes added by the bn folds need no second look */
  smelt_status st = NULL;
  for (int id = 0; id < nnode && !st; id++)
    if (!g->node[id].dead && g->node[id].op == OP_BATCH_NORM) st = try_fold_bn(g, ctx, id, uses, &bn_folded);
  free(uses);
  RETURN_IF_ERROR(st);
  if (bn_folded) {
    *changed = true;
    /* the new nodes sit at the end: restore topological order so that the
     * sweep below sees producers before consumers */
    RETURN_IF_ERROR(ir_graph_compact(g));
  }
  for (int id = 0; id < g->nnode; id++) {
    Node *n = &g->node[id];
    if (n->dead || n->nin == 0 || !all_const(g, n, 0)) continue;
    if (ir_op_is_collective(n->op)) continue; /* across ranks: never one rank's constant */
    if (n->op == OP_DEQUANTIZE) {
      pass_ctx_logf(ctx, "const-fold: kept '%s' (dequantize): its weights stay quantised", ir_node_name(g, n));
      continue;
    }
    RETURN_IF_ERROR(fold_node(g, ctx, id, changed));
  }
  return NULL;
}
