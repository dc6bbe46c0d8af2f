/* simplify: algebraic identities that remove work without changing a result.
 *
 * Each live node is matched against a short list of local rules; a rule
 * either forwards the node's result to an existing value (the node dies) or
 * rewrites the node in place to read from further up the chain (the skipped
 * producer dies later in dce if nothing else reads it).  The sweep repeats
 * until a sweep changes nothing, so chains of three transposes collapse too.
 *
 *   x*1, 1*x, x+0, 0+x, x-0, x/1  -> x   only when the result type equals x's
 *       type (a broadcasting constant would change the shape) and every
 *       element of the constant is the identity;
 *   neg(neg(x))                   -> x
 *   transpose(transpose(x,p),q)   -> transpose(x, p∘q), or x if that is the
 *                                    identity; a lone identity transpose -> x
 *   reshape(reshape(x))           -> reshape(x); reshape to x's shape -> x
 *   cast(x) to x's dtype          -> x
 *   cast(cast(x,A),B)             -> cast(x,B) when x -> A is exact (every
 *       value of x's dtype is representable in A), since then the direct
 *       cast sees the same value the second cast did
 *   expand(x) to x's shape        -> x
 *   x * 0.5 * (1 + erf(x / sqrt 2)) -> gelu(x) (approximate none), the erf
 *       GELU as exporters spell it: (x * (1 + erf(x / c))) * 0.5 or
 *       (x * 0.5) * (1 + erf(x / c)), x / c or x * (1 / c), c within 1e-6
 *       of sqrt 2; one node computes what five did (the kernels' gelu, so a
 *       matmul takes it as its epilogue: x is used twice in the spelled-out
 *       form, which no epilogue absorbs); the result is the same function,
 *       rounded once less
 *
 * A result that is a graph output is never forwarded to a value of another
 * name (see pass_forward): the model's outputs keep their names.
 *
 * Requires: canonicalize has made transpose perms explicit (an absent perm
 * is read as reversed anyway).
 */
#include <math.h>
#include <string.h>

#include "passes.h"
#include "rewrite.h"

static bool same_type(const Graph *g, int a, int b) { return ir_type_equal(&g->val[a].type, &g->val[b].type); }

/* The binary identities: returns the operand the result equals, or -1. */
static int binary_identity(const Graph *g, const Node *n) {
  int a = n->in[0], b = n->in[1], out = n->out[0];
  double c;
  switch (n->op) {
  case OP_MUL:
    if (pass_const_uniform(g, b, &c) && c == 1 && same_type(g, a, out)) return a;
    if (pass_const_uniform(g, a, &c) && c == 1 && same_type(g, b, out)) return b;
    return -1;
  case OP_ADD:
    if (pass_const_uniform(g, b, &c) && c == 0 && same_type(g, a, out)) return a;
    if (pass_const_uniform(g, a, &c) && c == 0 && same_type(g, b, out)) return b;
    return -1;
  case OP_SUB:
    if (pass_const_uniform(g, b, &c) && c == 0 && same_type(g, a, out)) return a;
    return -1;
  case OP_DIV:
    if (pass_const_uniform(g, b, &c) && c == 1 && same_type(g, a, out)) return a;
    return -1;
  default:
    return -1;
  }
}

static void read_perm(const Graph *g, const Node *n, int64_t *p) {
  int rank = g->val[n->in[0]].type.rank;
  const Attr *a = ir_attr(n, "perm");
  for (int i = 0; i < rank; i++) p[i] = a ? ir_norm_axis(a->ints[i], rank) : rank - 1 - i;
}

static bool is_identity_perm(const int64_t *p, int rank) {
  for (int i = 0; i < rank; i++)
    if (p[i] != i) return false;
  return true;
}

/* Whether every value of dtype `from` survives conversion to `to` exactly. */
static bool cast_is_exact(DType from, DType to) {
  if (from == to || from == DT_BOOL) return true;
  switch (to) {
  case DT_F64: return from != DT_I64;
  case DT_F32: return from == DT_F16 || from == DT_BF16 || from == DT_I8 || from == DT_U8;
  case DT_F16: return from == DT_I8 || from == DT_U8;
  case DT_BF16: return from == DT_I8 || from == DT_U8;
  case DT_I64: return from == DT_I32 || from == DT_I8 || from == DT_U8;
  case DT_I32: return from == DT_I8 || from == DT_U8;
  default: return false;
  }
}

/* Whether v is a uniform constant within rel of want. */
static bool const_near(const Graph *g, int v, double want, double rel) {
  double c;
  return pass_const_uniform(g, v, &c) && fabs(c - want) <= rel * fabs(want);
}

/* The operand of a live binary node `op` other than a uniform constant
 * near want (canonicalize puts constants second), or -1. */
static int with_const(Graph *g, int v, Op op, double want) {
  Node *p = pass_producer(g, v);
  return p && p->op == op && p->nin == 2 && const_near(g, p->in[1], want, 1e-6) ? p->in[0] : -1;
}

/* a = 1 + erf(x / sqrt 2) for the given x: true when it is. */
static bool erf_term(Graph *g, int a, int x) {
  int e = with_const(g, a, OP_ADD, 1.0);
  Node *pe = e >= 0 ? pass_producer(g, e) : NULL;
  if (!pe || pe->op != OP_ERF) return false;
  int d = pe->in[0];
  return with_const(g, d, OP_DIV, sqrt(2.0)) == x || with_const(g, d, OP_MUL, sqrt(0.5)) == x;
}

/* x when node n computes x * 0.5 * (1 + erf(x / sqrt 2)) (see the top), else -1. */
static int erf_gelu_input(Graph *g, const Node *n) {
  if (n->op != OP_MUL || n->nin != 2) return -1;
  int out = n->out[0];
  /* (x * (1 + erf)) * 0.5 */
  if (const_near(g, n->in[1], 0.5, 0)) {
    Node *pm = pass_producer(g, n->in[0]);
    if (pm && pm->op == OP_MUL && pm->nin == 2)
      for (int i = 0; i < 2; i++)
        if (erf_term(g, pm->in[1 - i], pm->in[i]) && same_type(g, pm->in[i], out)) return pm->in[i];
    return -1;
  }
  /* (x * 0.5) * (1 + erf) */
  for (int i = 0; i < 2; i++) {
    int x = with_const(g, n->in[i], OP_MUL, 0.5);
    if (x >= 0 && erf_term(g, n->in[1 - i], x) && same_type(g, x, out)) return x;
  }
  return -1;
}

/* One rule application on node id; returns true when the graph changed. */
static bool simplify_node(Graph *g, int id) {
  Node *n = &g->node[id];
  int x = n->in[0], out = n->out[0];
  Node *p = pass_producer(g, x);
  switch (n->op) {
  case OP_MUL:
  case OP_ADD:
  case OP_SUB:
  case OP_DIV: {
    int keep = binary_identity(g, n);
    if (keep >= 0) return pass_forward(g, out, keep);
    int gx = dt_is_float(g->val[out].type.dt) ? erf_gelu_input(g, n) : -1;
    if (gx < 0) return false;
    n->op = OP_GELU;
    n->nin = 1;
    n->in[0] = gx;
    n->nattr = 0;
    ir_set_attr_enum(g, id, "approximate", "none");
    return true;
  }
  case OP_NEG:
    return p && p->op == OP_NEG && pass_forward(g, out, p->in[0]);
  case OP_TRANSPOSE: {
    int rank = g->val[x].type.rank;
    int64_t q[IR_MAX_RANK];
    read_perm(g, n, q);
    if (p && p->op == OP_TRANSPOSE) {
      int64_t pp[IR_MAX_RANK], r[IR_MAX_RANK];
      read_perm(g, p, pp);
      /* out[i] = mid[q[i]] and mid[j] = x[pp[j]], so out[i] = x[pp[q[i]]] */
      for (int i = 0; i < rank; i++) r[i] = pp[q[i]];
      int src = p->in[0];
      if (is_identity_perm(r, rank)) return pass_forward(g, out, src);
      n->in[0] = src;
      ir_set_attr_ints(g, id, "perm", r, rank);
      return true;
    }
    return is_identity_perm(q, rank) && pass_forward(g, out, x);
  }
  case OP_RESHAPE:
    if (same_type(g, x, out)) return pass_forward(g, out, x);
    if (p && p->op == OP_RESHAPE) {
      int src = p->in[0];
      if (same_type(g, src, out)) return pass_forward(g, out, src);
      n->in[0] = src;
      return true;
    }
    return false;
  case OP_CAST:
    if (same_type(g, x, out)) return pass_forward(g, out, x);
    if (p && p->op == OP_CAST && cast_is_exact(g->val[p->in[0]].type.dt, g->val[x].type.dt)) {
      int src = p->in[0];
      if (same_type(g, src, out)) return pass_forward(g, out, src);
      n->in[0] = src;
      return true;
    }
    return false;
  case OP_EXPAND:
    return same_type(g, x, out) && pass_forward(g, out, x);
  default:
    return false;
  }
}

smelt_status pass_simplify(Graph *g, PassCtx *ctx, bool *changed) {
  (void)ctx;
  *changed = false;
  for (bool again = true; again;) {
    again = false;
    for (int id = 0; id < g->nnode; id++) {
      if (g->node[id].dead) continue;
      if (simplify_node(g, id)) again = *changed = true;
    }
  }
  return NULL;
}
