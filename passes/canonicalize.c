/* canonicalize: one spelling for each computation, so that later passes (and
 * the kernels) match one form instead of many.
 *
 * Each live node is visited once and rewritten in place; the node keeps its
 * output values, so names and users are untouched:
 *   - axes become non-negative (softmax, log_softmax, norms, concat, split,
 *     gather, slice, transpose perms) and reduction axes are sorted;
 *   - optional attributes whose absence implies a value get that value:
 *     reduction axes (all), transpose perm (reversed), pool strides (the
 *     kernel), attention scale (1/sqrt(D)), rope rotary_dim (D), split sizes
 *     (equal parts);
 *   - squeeze and unsqueeze become reshape to their (inferred) result shape,
 *     and a reshape's -1 is replaced by the size it stands for;
 *   - a commutative binary op (add, mul, maximum, minimum, equal) with a
 *     constant first operand gets it second, so matchers look in one place.
 * None of this changes a value's type, so no inference is re-run.
 *
 * Requires: types inferred for every value.
 */
#include <math.h>
#include <stdlib.h>

#include "passes.h"
#include "rewrite.h"

static int in_rank(const Graph *g, const Node *n) { return g->val[n->in[0]].type.rank; }

/* Sets an int attribute to the non-negative form of its axis. */
static bool norm_axis_attr(Graph *g, int id, const char *name, int rank) {
  const Attr *a = ir_attr(&g->node[id], name);
  if (!a || a->i >= 0) return false;
  int ax = ir_norm_axis(a->i, rank);
  if (ax < 0) return false; /* inference already rejected it; leave it be */
  ir_set_attr_int(g, id, name, ax);
  return true;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static bool ints_equal(const int64_t *a, const int64_t *b, int n) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i]) return false;
  return true;
}

/* Reduction axes: absent means all; otherwise non-negative and sorted. */
static bool canon_reduce_axes(Graph *g, int id) {
  int rank = in_rank(g, &g->node[id]);
  const Attr *a = ir_attr(&g->node[id], "axes");
  int64_t ax[IR_MAX_RANK];
  int n = 0;
  if (!a) {
    for (int i = 0; i < rank; i++) ax[n++] = i;
  } else {
    if (a->n > IR_MAX_RANK) return false;
    for (int i = 0; i < a->n; i++) {
      int v = ir_norm_axis(a->ints[i], rank);
      if (v < 0) return false;
      ax[n++] = v;
    }
    qsort(ax, (size_t)n, sizeof ax[0], cmp_i64);
    if (ints_equal(ax, a->ints, n)) return false;
  }
  ir_set_attr_ints(g, id, "axes", ax, n);
  return true;
}

/* Transpose perm: absent means reversed axes; entries made non-negative. */
static bool canon_perm(Graph *g, int id) {
  int rank = in_rank(g, &g->node[id]);
  const Attr *a = ir_attr(&g->node[id], "perm");
  int64_t p[IR_MAX_RANK];
  for (int i = 0; i < rank; i++) {
    int v = a ? ir_norm_axis(a->ints[i], rank) : rank - 1 - i;
    if (v < 0) return false;
    p[i] = v;
  }
  if (a && ints_equal(p, a->ints, rank)) return false;
  ir_set_attr_ints(g, id, "perm", p, rank);
  return true;
}

/* squeeze/unsqueeze -> reshape, and reshape with -1 -> explicit shape: the
 * result type already holds the shape we want. */
static bool canon_to_reshape(Graph *g, int id) {
  Node *n = &g->node[id];
  const TensorType *t = &g->val[n->out[0]].type;
  if (n->op == OP_RESHAPE) {
    const Attr *s = ir_attr(n, "shape");
    if (s && s->n == t->rank && ints_equal(s->ints, t->dim, t->rank)) return false;
  }
  n->op = OP_RESHAPE;
  n->nattr = 0; /* squeeze/unsqueeze axes mean nothing to reshape */
  ir_set_attr_ints(g, id, "shape", t->dim, t->rank);
  return true;
}

static bool is_commutative(Op op) {
  return op == OP_ADD || op == OP_MUL || op == OP_MAXIMUM || op == OP_MINIMUM || op == OP_EQUAL;
}

static bool canon_node(Graph *g, int id) {
  Node *n = &g->node[id];
  bool ch = false;
  switch (n->op) {
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
  case OP_LAYER_NORM:
  case OP_RMS_NORM:
  case OP_CONCAT:
  case OP_SPLIT:
  case OP_GATHER:
  case OP_SLICE:
    ch = norm_axis_attr(g, id, "axis", in_rank(g, n));
    if (n->op == OP_SPLIT && !ir_attr(&g->node[id], "sizes")) {
      int ax = ir_norm_axis(ir_attr_int(&g->node[id], "axis"), in_rank(g, &g->node[id]));
      int64_t sizes[64];
      int k = g->node[id].nout;
      if (ax >= 0 && k <= 64) {
        for (int i = 0; i < k; i++) sizes[i] = g->val[g->node[id].out[i]].type.dim[ax];
        ir_set_attr_ints(g, id, "sizes", sizes, k);
        ch = true;
      }
    }
    return ch;
  case OP_SUM:
  case OP_MEAN:
  case OP_MAX:
  case OP_MIN:
    return canon_reduce_axes(g, id);
  case OP_TRANSPOSE:
    return canon_perm(g, id);
  case OP_SQUEEZE:
  case OP_UNSQUEEZE:
  case OP_RESHAPE:
    return canon_to_reshape(g, id);
  case OP_MAX_POOL2D:
  case OP_AVG_POOL2D:
    if (ir_attr(n, "strides")) return false;
    {
      const Attr *k = ir_attr(n, "kernel");
      ir_set_attr_ints(g, id, "strides", k->ints, k->n);
    }
    return true;
  case OP_ATTENTION:
    if (ir_attr(n, "scale")) return false;
    ir_set_attr_float(g, id, "scale", 1.0 / sqrt((double)g->val[n->in[0]].type.dim[3]));
    return true;
  case OP_ROPE:
    if (ir_attr(n, "rotary_dim")) return false;
    {
      const TensorType *x = &g->val[n->in[0]].type;
      ir_set_attr_int(g, id, "rotary_dim", x->dim[x->rank - 1]);
    }
    return true;
  default:
    break;
  }
  if (is_commutative(n->op) && ir_is_const(g, n->in[0]) && !ir_is_const(g, n->in[1])) {
    int t = n->in[0];
    n->in[0] = n->in[1];
    n->in[1] = t;
    return true;
  }
  return false;
}

smelt_status pass_canonicalize(Graph *g, PassCtx *ctx, bool *changed) {
  (void)ctx;
  *changed = false;
  for (int id = 0; id < g->nnode; id++) {
    if (g->node[id].dead) continue;
    if (canon_node(g, id)) *changed = true;
  }
  return NULL;
}
