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
 *
 * A result that is a graph output is never forwarded to a value of another
 * name (see pass_forward): the model's outputs keep their names.
 *
 * Requires: canonicalize has made transpose perms explicit (an absent perm
 * is read as reversed anyway).
 */
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
    return keep >= 0 && pass_forward(g, out, keep);
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
