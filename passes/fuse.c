/* fuse: cache-bounded fusion of producer-consumer chains into kernels.
 *
 * One walk over the nodes in topological order.  Each node either joins the
 * group of one of its producers (an elementwise node may also merge several
 * elementwise producer groups) or starts a group of its own; the rules are
 * TVM's, by fusion class (FIELD-NOTES.md):
 *   - elementwise and broadcast ops chain, and injective ops (reshape,
 *     transpose, slice, rope, expand, ...) join those chains: GK_ELEMWISE;
 *   - a reduction over one axis (softmax, log_softmax, layer_norm, rms_norm,
 *     sum/mean/max/min over one axis) takes the elementwise group that
 *     computes its first input as prologue, if every member has that input's
 *     shape and none is injective, then a chain of elementwise ops on its
 *     result as epilogue: GK_REDUCTION;
 *   - matmul and conv2d take an elementwise epilogue chain: GK_CONTRACTION;
 *   - everything else is one node alone, GK_OPAQUE: attention, pools, split,
 *     gather by computed indices, concat, reductions over several axes,
 *     batch_norm that const-fold could not fold.  Pools are reductions in
 *     ops.def, and gather/concat/split injective, but their results are not
 *     computed one element from one position of one input, which the chains
 *     assume; a gather by constant indices is (a slice), and chains.
 * A producer joins a consumer's group only when every use of its result is
 * that consumer (no recomputation, no duplication), so every group has one
 * result that leaves it; the one exception is a reduction's prologue, whose
 * values may also leave (the residual sum x1 = x + o that feeds rms_norm and
 * the next residual add).  That case is worth a rule of its own: an
 * elementwise node whose result is the first input of a reduction stays out
 * of a contraction's epilogue and waits to become the reduction's prologue.
 * On a CUDA-only target three more rules: a contraction's or an
 * attention's epilogue may also move the result (transpose, reshape) and
 * go on elementwise in the new shape, and take both halves of an
 * interleaved gated pair (the step-2 slices merge-matmuls makes) into
 * the product silu(a) * b: the emitters store each element where the
 * chain puts it (layout_epilogue, gated_half); and elementwise groups that
 * read the same computed value and do not depend on each other become one
 * kernel (merge_siblings).
 * A join that would make two groups depend on each other (a cycle between
 * kernels) is refused; at the end the groups are sorted topologically
 * (ties by their first node) and g->node is reordered so that each group's
 * nodes are contiguous, which ir_graph_compact (a stable sort) keeps.
 *
 * Cache bound.  A join is accepted only if the bytes the group keeps on chip
 * per tile fit the budget; when they would not, fusion stops there and the
 * producer's result goes to memory.  Footprint model (f32 compute, 4 B per
 * element, whatever the storage dtype):
 *   elementwise:  min(last dim of the result, 4096) * 4
 *                   * (distinct values touched: external inputs + members)
 *   reduction:    D * 4 * (1 row buffer + escaping prologue values
 *                          + distinct broadcast operands such as gamma/beta)
 *                 D = length of the reduced axis; a broadcast operand is an
 *                 external operand of more than one element that does not
 *                 have its consumer's shape (the anchor's 2nd/3rd inputs too)
 *   contraction:  (mc*kc + kc*nc + mc*nc) * 4 + the epilogue operands' tiles
 *                 mc = min(64, M), nc = min(256, N), kc = min(256, K) (conv2d
 *                 as implicit GEMM: M = OH*OW, N = O/groups, K = C/groups*KH*KW);
 *                 an external epilogue operand costs the part of the mc x nc
 *                 output tile it covers: mc*nc*4 with the result's shape,
 *                 nc*4 for a vector along N (a bias), mc*4 along M, 0 for a
 *                 scalar.  For a CUDA-only target only the operand tiles
 *                 count: the kernels size their own A/B stages to shared
 *                 memory and run the epilogue on registers
 *   opaque:       0 (not modelled: such a kernel chooses its own tiling)
 * A node alone is never refused: one op cannot be split further, and its
 * kernel tiles itself; the log says when it is over budget on its own.
 *
 * Size bound.  A group also holds at most GROUP_NODE_CAP nodes, whatever
 * its footprint: a chain of cheap elementwise ops on a small tensor fits any
 * budget, but its kernel's code grows with every op and the backend
 * compilers' time faster than that (NVRTC took 12 s for one kernel of 400
 * unary ops, and more than 120 s for 2,000; emitting the expression is also
 * a recursion per node).  A join that would pass the cap stops fusion there
 * as the budget does, and --explain-fusion says so.
 * Budget: ctx->onchip_bytes (--onchip-bytes), else the target's: for the
 * CPU the L2 of cpu0 (ir_cpu_l2_bytes: sysfs; else
 * 256 KiB); for CUDA the shared memory one block may use on each arch of
 * ctx->arch (ir_cuda_onchip_budget; sm_90a when none is named).  Kernels
 * built for several targets or archs come from one graph, so they get the
 * smallest of those budgets.
 *
 * With ctx->explain_fusion every decision is logged; the notes are kept
 * until the walk ends so that they can name the final kernels.
 *
 * Requires: nothing (it compacts the graph first).  Clears a memory plan
 * made for a different grouping.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ir/target.h"
#include "passes.h"

enum {
  GEMM_MC = 64, /* GEMM tile of the CPU code generator: rows of A and C */
  GEMM_NC = 256, /* columns of B and C */
  GEMM_KC = 256, /* the shared dimension */
  ROW_CAP = 4096, /* elementwise tile: at most this many elements of a row */
  ELEM_BYTES = 4, /* compute is f32 */
  /* nodes of one group (see "Size bound"): no group of the example models
   * reaches it; NVRTC's time per op is flat up to ~32 ops a kernel (15 ms
   * for unary math ops) and grows beyond (24 ms at 64, 43 ms at 128) */
  GROUP_NODE_CAP = 32,
};
#define DEFAULT_BUDGET ((int64_t)256 * 1024)

typedef enum { ROLE_EW, ROLE_INJ, ROLE_RED, ROLE_CON, ROLE_OPAQUE } Role;

/* A candidate producer group of the node being placed, with the verdict. */
typedef enum { C_REFUSED, C_STOPPED, C_CAPPED, C_FUSED, C_UNTRIED } CandState;
typedef struct {
  int grp, val; /* the group and the operand of the node it produces */
  CandState state;
  int64_t fp;
  int nodes; /* C_CAPPED: the nodes the group would have */
  char why[256];
} Cand;

#define RING 8
typedef struct {
  Graph *g;
  PassCtx *ctx;
  int64_t budget;
  int nnode;
  Role *role;
  int *gid;  /* per node: internal group, -1 until the walk reaches it */
  int *next; /* per node: the next member in its group's list, -1 at the end */
  /* per internal group; there is at most one per node */
  GroupKind *kind;
  int *head, *last, *tail, *anchor, *redirect;
  int *size; /* per internal group: its number of nodes */
  int ngrp;
  /* consumers of value v: unode[ustart[v] .. ustart[v+1]), one per operand */
  int *ustart, *unode;
  bool *is_out;
  /* scratch */
  int *gin, *gvis, *vmark, *stack, *members, stamp;
  int cand_node, cand_stamp;
  /* the explain log, with groups written as \1ID\1 until they have names */
  char *log;
  size_t log_len, log_cap;
  char ring[RING][640];
  int nring;
} Fuser;

/* ---- small facts ---- */

static bool same_shape(const TensorType *a, const TensorType *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

static const TensorType *vtype(const Fuser *f, int v) { return &f->g->val[v].type; }
static const TensorType *ntype(const Fuser *f, int n) { return vtype(f, f->g->node[n].out[0]); }

static int producer(const Fuser *f, int v) { return f->g->val[v].kind == VK_NODE ? f->g->val[v].node : -1; }

/* The one axis a reduction-class op reduces, or -1 (several axes, pools). */
static int reduced_axis(const Graph *g, const Node *n) {
  int rank = g->val[n->in[0]].type.rank;
  switch (n->op) {
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
  case OP_LAYER_NORM:
  case OP_RMS_NORM: return ir_norm_axis(ir_attr_int(n, "axis"), rank);
  case OP_SUM:
  case OP_MEAN:
  case OP_MAX:
  case OP_MIN: {
    const Attr *a = ir_attr(n, "axes");
    if (!a) return rank == 1 ? 0 : -1; /* absent = every axis */
    int axis = -1;
    for (int i = 0; i < a->n; i++) {
      int ax = ir_norm_axis(a->ints[i], rank);
      if (ax < 0 || (axis >= 0 && ax != axis)) return -1;
      axis = ax;
    }
    return axis;
  }
  default: return -1;
  }
}

static Role node_role(const Graph *g, const Node *n) {
  switch (n->op) {
  /* not one output element from one position of each input: see above */
  case OP_BATCH_NORM:
  case OP_SPLIT:
  case OP_CONCAT: return ROLE_OPAQUE;
  /* by constant indices it is: a slice (exporters' q, k, v = qkv[0], [1], [2]) */
  case OP_GATHER: return g->val[n->in[1]].kind == VK_CONST ? ROLE_INJ : ROLE_OPAQUE;
  case OP_EXPAND: return ROLE_INJ; /* a broadcast that changes the shape moves elements */
  default: break;
  }
  if (n->nout != 1) return ROLE_OPAQUE;
  switch (ir_op_info(n->op)->fclass) {
  case FC_ELEMWISE:
  case FC_BROADCAST: return ROLE_EW;
  case FC_INJECTIVE: return ROLE_INJ;
  case FC_REDUCTION: return reduced_axis(g, n) >= 0 ? ROLE_RED : ROLE_OPAQUE;
  case FC_CONTRACTION: return ROLE_CON;
  case FC_OPAQUE: break;
  }
  return ROLE_OPAQUE;
}

/* ---- the explain log ---- */

/* A scratch string that lives for the next RING-1 calls. */
static char *ring_buf(Fuser *f) { return f->ring[f->nring++ % RING]; }

/* "layer.0/x1 (add)" */
static const char *nd(Fuser *f, int n) {
  char *b = ring_buf(f);
  snprintf(b, sizeof f->ring[0], "%s (%s)", ir_node_name(f->g, &f->g->node[n]), ir_op_name(f->g->node[n].op));
  return b;
}

static const char *shape_str(Fuser *f, const TensorType *t) {
  char *b = ring_buf(f);
  char tmp[256];
  ir_type_str(t, tmp, sizeof tmp);
  const char *br = strchr(tmp, '['); /* the shape without the dtype */
  snprintf(b, sizeof f->ring[0], "%s", br ? br : tmp);
  return b;
}

/* A placeholder for the kernel name of group G, resolved at the end. */
static const char *gname(Fuser *f, int G) {
  char *b = ring_buf(f);
  snprintf(b, sizeof f->ring[0], "\001%d\001", G);
  return b;
}

static void note(Fuser *f, const char *fmt, ...) SMELT_PRINTF(2, 3);
static void note(Fuser *f, const char *fmt, ...) {
  if (!f->ctx->explain_fusion) return;
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  size_t need = f->log_len + (size_t)(n > 0 ? n : 0) + 2;
  if (n >= 0 && need > f->log_cap) {
    char *p = realloc(f->log, 2 * need);
    if (p) {
      f->log = p;
      f->log_cap = 2 * need;
    }
  }
  /* the explanation is a courtesy; without memory for a note, fusion goes on */
  if (n >= 0 && need <= f->log_cap) {
    vsnprintf(f->log + f->log_len, (size_t)n + 1, fmt, ap2);
    f->log_len += (size_t)n;
    f->log[f->log_len++] = '\n';
    f->log[f->log_len] = 0;
  }
  va_end(ap2);
}

/* ---- groups ---- */

static int group_new(Fuser *f, GroupKind kind, int n) {
  int G = f->ngrp++;
  f->kind[G] = kind;
  f->head[G] = f->last[G] = f->tail[G] = n;
  f->anchor[G] = kind == GK_ELEMWISE ? -1 : n;
  f->redirect[G] = -1;
  f->size[G] = 1;
  f->gid[n] = G;
  f->next[n] = -1;
  return G;
}

static void group_append(Fuser *f, int G, int n) {
  f->next[f->last[G]] = n;
  f->next[n] = -1;
  f->last[G] = f->tail[G] = n;
  f->gid[n] = G;
  f->size[G]++;
}

/* Moves the members of H into G (H's list after G's). */
static void group_absorb(Fuser *f, int G, int H) {
  for (int m = f->head[H]; m >= 0; m = f->next[m]) f->gid[m] = G;
  f->next[f->last[G]] = f->head[H];
  f->last[G] = f->last[H];
  f->head[H] = f->last[H] = -1;
  f->redirect[H] = G;
  f->size[G] += f->size[H];
  f->size[H] = 0;
}

/* Whether a group of nodes nodes passes the size bound; sets the verdict. */
static bool over_cap(Cand *c, int nodes) {
  if (nodes <= GROUP_NODE_CAP) return false;
  c->state = C_CAPPED;
  c->nodes = nodes;
  return true;
}

/* The candidate group under evaluation: the groups marked in gin (with the
 * current cand_stamp) plus node cand_node. */
static void cand_begin(Fuser *f, int n) {
  f->cand_stamp = ++f->stamp;
  f->cand_node = n;
}
static void cand_mark(Fuser *f, int G, bool on) { f->gin[G] = on ? f->cand_stamp : 0; }
static bool cand_has_group(const Fuser *f, int G) { return G >= 0 && f->gin[G] == f->cand_stamp; }
static bool in_cand(const Fuser *f, int node) { return node == f->cand_node || cand_has_group(f, f->gid[node]); }
static bool made_in_cand(const Fuser *f, int v) {
  int p = producer(f, v);
  return p >= 0 && in_cand(f, p);
}

/* Members of the candidate into f->members; returns their number. */
static int cand_members(Fuser *f, const int *grps, int ngrps) {
  int nm = 0;
  for (int i = 0; i < ngrps; i++)
    for (int m = f->head[grps[i]]; m >= 0; m = f->next[m]) f->members[nm++] = m;
  if (f->cand_node >= 0) f->members[nm++] = f->cand_node;
  return nm;
}

/* v leaves the candidate: it is a graph output or a node outside reads it. */
static bool escapes(const Fuser *f, int v) {
  if (f->is_out[v]) return true;
  for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++)
    if (!in_cand(f, f->unode[i])) return true;
  return false;
}

/* Whether v has a use other than node n (a graph output counts); if so,
 * says which in why.  A producer joins a consumer's group only without. */
static bool explain_other_uses(Fuser *f, int v, int n, char *why, size_t cap) {
  if (f->is_out[v]) {
    snprintf(why, cap, "%s is a graph output", f->g->val[v].name);
    return true;
  }
  for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++)
    if (f->unode[i] != n) {
      snprintf(why, cap, "%s is also used by %s", f->g->val[v].name, nd(f, f->unode[i]));
      return true;
    }
  return false;
}

/* ---- footprints ---- */

static int64_t numel(const TensorType *t) { return ir_type_numel(t); }

/* Counts v once per stamp; returns whether it was new. */
static bool first_visit(Fuser *f, int v, int stamp) {
  if (f->vmark[v] == stamp) return false;
  f->vmark[v] = stamp;
  return true;
}

static int64_t fp_elemwise(Fuser *f, int tail, const int *mem, int nm) {
  const TensorType *t = ntype(f, tail);
  int64_t row = t->rank ? t->dim[t->rank - 1] : 1;
  if (row > ROW_CAP) row = ROW_CAP;
  if (row < 1) row = 1;
  int64_t values = nm;
  int stamp = ++f->stamp;
  for (int i = 0; i < nm; i++) {
    const Node *n = &f->g->node[mem[i]];
    for (int j = 0; j < n->nin; j++)
      if (!made_in_cand(f, n->in[j]) && first_visit(f, n->in[j], stamp)) values++;
  }
  return row * ELEM_BYTES * values;
}

static int64_t fp_reduction(Fuser *f, int anchor, const int *mem, int nm) {
  const Node *a = &f->g->node[anchor];
  const TensorType *x = vtype(f, a->in[0]);
  int64_t D = x->dim[reduced_axis(f->g, a)];
  int64_t rows = 1; /* the row the anchor reduces, kept for its second pass */
  int stamp = ++f->stamp;
  for (int i = 0; i < nm; i++) {
    int m = mem[i];
    const Node *n = &f->g->node[m];
    /* node ids are topological during the walk: prologue members come first */
    if (m < anchor && escapes(f, n->out[0])) rows++;
    for (int j = 0; j < n->nin; j++) {
      int u = n->in[j];
      if (made_in_cand(f, u)) continue;
      if (m == anchor ? j == 0 : same_shape(vtype(f, u), ntype(f, m))) continue; /* streamed once */
      if (numel(vtype(f, u)) > 1 && first_visit(f, u, stamp)) rows++;
    }
  }
  return D * ELEM_BYTES * rows;
}

/* M, N, K of the GEMM a contraction is (conv2d as implicit GEMM). */
static void gemm_dims(const Fuser *f, int anchor, int64_t *M, int64_t *N, int64_t *K) {
  const Node *n = &f->g->node[anchor];
  const TensorType *a = vtype(f, n->in[0]), *b = vtype(f, n->in[1]);
  if (n->op == OP_CONV2D) {
    const TensorType *y = ntype(f, anchor);
    int64_t groups = ir_attr_int(n, "groups");
    *M = y->dim[2] * y->dim[3];
    *N = groups > 0 ? b->dim[0] / groups : b->dim[0];
    *K = b->dim[1] * b->dim[2] * b->dim[3];
    return;
  }
  bool ta = ir_attr_int(n, "transpose_a") != 0, tb = ir_attr_int(n, "transpose_b") != 0;
  int ra = a->rank, rb = b->rank;
  *K = ra == 1 ? a->dim[0] : ta ? a->dim[ra - 2] : a->dim[ra - 1];
  *M = ra == 1 ? 1 : ta ? a->dim[ra - 1] : a->dim[ra - 2];
  *N = rb == 1 ? 1 : tb ? b->dim[rb - 2] : b->dim[rb - 1];
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Elements of an mc x nc output tile that operand u covers. */
static int64_t operand_tile(const TensorType *y, const TensorType *u, bool conv, int64_t mc, int64_t nc) {
  if (numel(u) <= 1) return 0;
  if (same_shape(u, y)) return mc * nc;
  /* align u's dims to the right of y's; which GEMM dims does it vary along? */
  bool along_m = false, along_n = false;
  for (int i = 0; i < u->rank; i++) {
    int yd = y->rank - u->rank + i;
    if (u->dim[i] <= 1 || yd < 0) continue;
    if (conv) { /* [N, O, OH, OW]: channels are N, the spatial dims M */
      if (yd == 1) along_n = true;
      if (yd >= 2) along_m = true;
    } else {
      if (yd == y->rank - 1) along_n = true;
      if (yd == y->rank - 2) along_m = true;
    }
  }
  return (along_m ? mc : 1) * (along_n ? nc : 1);
}

static bool cuda_only(const Fuser *f);

static int64_t fp_contraction(Fuser *f, int anchor, const int *mem, int nm) {
  int64_t M, N, K;
  gemm_dims(f, anchor, &M, &N, &K);
  int64_t mc = min64(GEMM_MC, M), nc = min64(GEMM_NC, N), kc = min64(GEMM_KC, K);
  /* The CUDA kernels pick their own tiles for the shared memory they have
   * (the A and B stages) and run the epilogue on the accumulators in
   * registers: only the epilogue's operand tiles count against the budget
   * there.  (With the CPU's tiles counted, no GEMM with K and N >= 256
   * could take an epilogue on a GPU.) */
  int64_t elems = cuda_only(f) ? 0 : mc * kc + kc * nc + mc * nc;
  const TensorType *y = ntype(f, anchor);
  bool conv = f->g->node[anchor].op == OP_CONV2D;
  int stamp = ++f->stamp;
  for (int i = 0; i < nm; i++) {
    if (mem[i] == anchor) continue;
    const Node *n = &f->g->node[mem[i]];
    for (int j = 0; j < n->nin; j++) {
      int u = n->in[j];
      if (!made_in_cand(f, u) && first_visit(f, u, stamp)) elems += operand_tile(y, vtype(f, u), conv, mc, nc);
    }
  }
  return elems * ELEM_BYTES;
}

/* Footprint of the candidate as a group of this kind around this anchor
 * (for GK_ELEMWISE: this last node). */
static int64_t footprint(Fuser *f, GroupKind kind, int anchor, const int *grps, int ngrps) {
  int nm = cand_members(f, grps, ngrps);
  switch (kind) {
  case GK_ELEMWISE: return fp_elemwise(f, anchor, f->members, nm);
  case GK_REDUCTION: return fp_reduction(f, anchor, f->members, nm);
  case GK_CONTRACTION: return fp_contraction(f, anchor, f->members, nm);
  case GK_OPAQUE: break;
  }
  return 0;
}

/* ---- cycles ---- */

static int push_preds(Fuser *f, int node, int vis, int sp) {
  const Node *n = &f->g->node[node];
  for (int j = 0; j < n->nin; j++) {
    int p = producer(f, n->in[j]);
    if (p < 0) continue;
    int Z = f->gid[p];
    if (cand_has_group(f, Z)) continue; /* an edge inside the candidate */
    if (f->gvis[Z] == vis) continue;
    f->gvis[Z] = vis;
    f->stack[sp++] = Z;
  }
  return sp;
}

/* True when merging the candidate (groups grps plus cand_node) into one
 * group would close a cycle of kernels: some group outside it that it reads
 * from depends, through any chain of groups, on one of its groups. */
static bool would_cycle(Fuser *f, const int *grps, int ngrps) {
  int vis = ++f->stamp, sp = 0;
  if (f->cand_node >= 0) sp = push_preds(f, f->cand_node, vis, sp);
  for (int i = 0; i < ngrps; i++)
    for (int m = f->head[grps[i]]; m >= 0; m = f->next[m]) sp = push_preds(f, m, vis, sp);
  while (sp > 0) {
    int Y = f->stack[--sp];
    for (int m = f->head[Y]; m >= 0; m = f->next[m]) {
      const Node *n = &f->g->node[m];
      for (int j = 0; j < n->nin; j++) {
        int p = producer(f, n->in[j]);
        if (p < 0) continue;
        int Z = f->gid[p];
        if (cand_has_group(f, Z)) return true;
        if (f->gvis[Z] == vis) continue;
        f->gvis[Z] = vis;
        f->stack[sp++] = Z;
      }
    }
  }
  return false;
}

/* ---- placing one node ---- */

/* Distinct producer groups of n's operands, in operand order. */
static int collect_cands(Fuser *f, int n, Cand *c, int cap) {
  const Node *nn = &f->g->node[n];
  int nc = 0;
  for (int j = 0; j < nn->nin; j++) {
    int p = producer(f, nn->in[j]);
    if (p < 0) continue;
    int G = f->gid[p], k = 0;
    while (k < nc && c[k].grp != G) k++;
    if (k < nc || nc == cap) continue;
    c[nc].grp = G;
    c[nc].val = nn->in[j];
    c[nc].state = C_UNTRIED;
    c[nc].fp = 0;
    c[nc].why[0] = 0;
    nc++;
  }
  return nc;
}

static void note_cands(Fuser *f, int n, const Cand *c, int nc, const char *how) {
  int G = f->gid[n];
  for (int i = 0; i < nc; i++) {
    int p = producer(f, c[i].val);
    switch (c[i].state) {
    case C_FUSED:
      note(f, "fuse: %s + %s: fused into %s (%s), footprint %lld B <= budget %lld B", nd(f, p), nd(f, n), gname(f, G),
           how, (long long)c[i].fp, (long long)f->budget);
      break;
    case C_STOPPED:
      note(f, "fuse: stopped: adding %s to %s gives footprint %lld B > budget %lld B; %s goes to memory", nd(f, n),
           gname(f, c[i].grp), (long long)c[i].fp, (long long)f->budget, f->g->val[c[i].val].name);
      break;
    case C_CAPPED:
      note(f, "fuse: stopped: adding %s to %s gives %d nodes > cap %d nodes a kernel (code size); %s goes to memory",
           nd(f, n), gname(f, c[i].grp), c[i].nodes, GROUP_NODE_CAP, f->g->val[c[i].val].name);
      break;
    case C_REFUSED:
      note(f, "fuse: %s: not fusable into %s (%s)", nd(f, p), gname(f, G), c[i].why);
      break;
    case C_UNTRIED: /* n joined the epilogue of an earlier operand's group */
      note(f, "fuse: %s: not fusable into %s (%s joined the group of another operand first)", nd(f, p),
           gname(f, G), nd(f, n));
      break;
    }
  }
}

static void note_start(Fuser *f, int n) {
  int G = f->gid[n];
  int64_t fp = 0;
  if (f->kind[G] != GK_OPAQUE) {
    cand_begin(f, n);
    fp = footprint(f, f->kind[G], n, NULL, 0);
  }
  if (fp > f->budget)
    note(f, "fuse: %s: starts %s (%s), footprint %lld B > budget %lld B on its own (one op is not split further)",
         nd(f, n), gname(f, G), ir_group_kind_name(f->kind[G]), (long long)fp, (long long)f->budget);
  else
    note(f, "fuse: %s: starts %s (%s)", nd(f, n), gname(f, G), ir_group_kind_name(f->kind[G]));
}

/* Opaque ops and contractions: a group of their own; nothing joins them
 * from above. */
static void place_alone(Fuser *f, int n, GroupKind kind) {
  Cand c[64];
  int nc = collect_cands(f, n, c, 64);
  group_new(f, kind, n);
  note_start(f, n);
  for (int i = 0; i < nc; i++) {
    c[i].state = C_REFUSED;
    if (kind == GK_OPAQUE)
      snprintf(c[i].why, sizeof c[i].why, "%s is opaque", ir_op_name(f->g->node[n].op));
    else
      snprintf(c[i].why, sizeof c[i].why, "a contraction takes no prologue");
  }
  note_cands(f, n, c, nc, "");
}

/* ---- quantised weights ----
 * A matmul whose weight is dequantize(constants) with no other user (what
 * the quantize pass makes) takes the dequantize into its kernel: the
 * quantised kernels (codegen/llvm/qmatmul.c, codegen/cuda/qgemv.c) read the
 * packed weight and its scales and never store the float weight.  On the
 * CPU at any row count (many rows dequantise a panel of the weight per
 * block of rows, gemm.c's cg_gemm_panels); when CUDA is a target only up
 * to 8 rows, the GEMV's: with more the dequantize stays a kernel of its
 * own and the matmul runs the tensor-core GEMM on its result, the weight
 * read once per row block, not once per row, compute the bound. */
enum { QUANT_FUSE_MAX_M_CUDA = 8 /* the quantised GEMV's, qgemv.c */ };

/* The group of the dequantize node that computes n's weight, when it may
 * join n's kernel; else -1. */
static int quant_weight_group(const Fuser *f, int n) {
  const Node *nn = &f->g->node[n];
  if (nn->op != OP_MATMUL || nn->nin != 2 || ir_attr_int(nn, "transpose_a")) return -1;
  const TensorType *a = vtype(f, nn->in[0]);
  int64_t rows = 1;
  for (int i = 0; i + 1 < a->rank; i++) rows *= a->dim[i];
  bool cuda = f->ctx->target && strstr(f->ctx->target, "cuda");
  if (cuda && rows > QUANT_FUSE_MAX_M_CUDA) return -1;
  int v = nn->in[1], p = producer(f, v);
  if (p < 0 || f->g->node[p].op != OP_DEQUANTIZE || f->is_out[v]) return -1;
  const Node *dq = &f->g->node[p];
  for (int j = 0; j < dq->nin; j++)
    if (f->g->val[dq->in[j]].kind != VK_CONST) return -1;
  for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++)
    if (f->unode[i] != n) return -1;
  int G = f->gid[p];
  return G >= 0 && f->size[G] == 1 && f->kind[G] == GK_ELEMWISE ? G : -1;
}

/* The matmul with its dequantize: one contraction group. */
static void place_quant_matmul(Fuser *f, int n, int G) {
  note(f, "fuse: %s: dequantised in the loads of %s (quantised weight)", nd(f, f->tail[G]), nd(f, n));
  group_append(f, G, n);
  f->kind[G] = GK_CONTRACTION;
  f->anchor[G] = n;
}

/* ---- prologues of opaque attention and decode matmuls (CUDA) ----
 *
 * The CUDA kernels of attention and of the decode matmul (M <= 8, the
 * GEMV) read their operands through "emit at coordinates", so an operand
 * may be computed in the load instead of coming from memory: the rope,
 * transposes and reshapes that make q, k and v [B, H, S, D], the concat
 * that appends this step's k/v to a KV cache, the transpose back after
 * attention that feeds the output projection.  Each such kernel would
 * otherwise be launched on its own and write and read its result once
 * more; in decode, where each moves a few KiB, the launches are the cost.
 * A producer group joins when it is elementwise/injective (or a lone
 * concat), its result is used by this node alone, and no cycle of kernels
 * results; producers of an absorbed group whose results only it reads
 * join too.  Attention takes prologues only with one query tile (S <= 64,
 * decode): with more, every query tile would recompute the keys, and the
 * prefill kernel's 16-byte tile copies beat element-wise loads even for q.
 * A scatter (the KV-cache append) takes its rows' producers at any length:
 * it reads each element once.
 * A GEMV takes only data movement (see movement_only).  Only for a
 * CUDA-only target: the CPU backend reads these operands as arrays.
 */
enum { PRO_MAX = 32, ATT_PROLOGUE_MAX_S = 64, GEMV_PROLOGUE_MAX_M = 8 };

static bool cuda_only(const Fuser *f) { return f->ctx->target && strcmp(f->ctx->target, "cuda") == 0; }

static bool takes_prologue(const Fuser *f, int n);

static bool gemv_storage(DType dt) { return dt == DT_F16 || dt == DT_BF16 || dt == DT_F32; }

/* Whether node d, computing a matmul's weight, is a dequantize that the
 * quantised GEMV (codegen/cuda/qgemv.c) reads in its norm mode: constant
 * codes [N, K] grouped along K (i4, u4, i8, u8, fp8) in groups of whole
 * 16-byte chunks, float scales, zero points of the codes' or the scales'
 * dtype (none with fp8).  qmma.c declines a norm prologue. */
static bool quant_norm_weight(const Graph *g, int d) {
  const Node *dq = &g->node[d];
  if (dq->op != OP_DEQUANTIZE || dq->nin < 2 || dq->nin > 3) return false;
  for (int j = 0; j < dq->nin; j++)
    if (g->val[dq->in[j]].kind != VK_CONST) return false;
  const TensorType *qt = &g->val[dq->in[0]].type;
  DType q = qt->dt, sdt = g->val[dq->in[1]].type.dt;
  if (qt->rank != 2 || ir_norm_axis(ir_attr_int(dq, "axis"), 2) != 1) return false;
  if (q != DT_I4 && q != DT_U4 && q != DT_I8 && q != DT_U8 && !dt_is_f8(q)) return false;
  if (!dt_is_float(sdt) || sdt == DT_F64) return false;
  if (dq->nin == 3) {
    DType z = g->val[dq->in[2]].type.dt;
    if (dt_is_f8(q) || (z != q && z != sdt)) return false;
  }
  int64_t K = qt->dim[1], E = dt_is_packed(q) ? 32 : 16, G = ir_attr_int(dq, "group");
  if (G <= 0) G = K;
  return K % E == 0 && K % G == 0 && G % E == 0;
}

/* The decode matmul that rms_norm node r can be computed in, or -1.  The
 * float GEMV (codegen/cuda/gemv.c) reads all of A's row in every warp
 * anyway, so it computes the row's mean square itself and normalises A in
 * its loads: the norm's kernel (a launch per norm, two per layer in
 * decode) goes.  The quantised GEMV (qgemv.c) does the same.  When: a
 * CUDA-only target; r normalises the last axis and its result is read
 * only as A of one matmul that takes a prologue (M <= 8), whose weight is
 * [N, K] (transpose_b), not computed by a kernel (or a dequantize of
 * constants that qgemv reads: quant_norm_weight) and of 16-byte rows;
 * every dtype a GEMV takes. */
static int norm_gemv_consumer(const Fuser *f, int r) {
  const Graph *g = f->g;
  const Node *rn = &g->node[r];
  if (!cuda_only(f) || rn->op != OP_RMS_NORM || rn->nin != 2) return -1;
  int v = rn->out[0];
  const TensorType *xt = vtype(f, v);
  if (xt->rank < 1 || ir_norm_axis(ir_attr_int(rn, "axis"), xt->rank) != xt->rank - 1 || f->is_out[v]) return -1;
  if (f->ustart[v + 1] - f->ustart[v] != 1) return -1;
  int m = f->unode[f->ustart[v]];
  const Node *mn = &g->node[m];
  if (mn->op != OP_MATMUL || mn->nin != 2 || mn->in[0] != v || mn->in[1] == v || !takes_prologue(f, m)) return -1;
  if (!ir_attr_int(mn, "transpose_b")) return -1;
  const Value *b = &g->val[mn->in[1]];
  if ((b->kind == VK_NODE && !quant_norm_weight(g, b->node)) || b->type.rank != 2) return -1;
  DType dts[] = {xt->dt, b->type.dt, vtype(f, mn->out[0])->dt, vtype(f, rn->in[0])->dt, vtype(f, rn->in[1])->dt};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++)
    if (!gemv_storage(dts[i])) return -1;
  int64_t vec = 16 / (int64_t)dt_size(b->type.dt);
  return xt->dim[xt->rank - 1] % vec == 0 ? m : -1;
}

/* Whether group G is a lone rms_norm that matmul `user` computes in its
 * loads (norm_gemv_consumer). */
static bool norm_prologue(const Fuser *f, int G, int user) {
  int a = f->anchor[G];
  return f->kind[G] == GK_REDUCTION && f->size[G] == 1 && norm_gemv_consumer(f, a) == user;
}

/* Whether group G (producing operand v of node `user` inside the
 * candidate) can be absorbed as a prologue; the reason in why if not. */
static bool prologue_group_ok(Fuser *f, int G, int v, char *why, size_t cap) {
  int p = producer(f, v);
  bool lone_concat = f->kind[G] == GK_OPAQUE && f->head[G] == f->last[G] && f->g->node[p].op == OP_CONCAT;
  if (norm_prologue(f, G, f->cand_node)) return true;
  if (f->kind[G] != GK_ELEMWISE && !lone_concat) {
    snprintf(why, cap, "%s is %s", nd(f, p),
             f->kind[G] == GK_OPAQUE ? "opaque" : "the result of a reduction or contraction");
    return false;
  }
  if (f->tail[G] != p) {
    snprintf(why, cap, "%s is not the result of its group", f->g->val[v].name);
    return false;
  }
  if (f->is_out[v]) {
    snprintf(why, cap, "%s is a graph output", f->g->val[v].name);
    return false;
  }
  for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++)
    if (!in_cand(f, f->unode[i])) {
      snprintf(why, cap, "%s is also used by %s", f->g->val[v].name, nd(f, f->unode[i]));
      return false;
    }
  return true;
}

/* A GEMV reads its A once per block: a prologue there must be data
 * movement (slices, transposes, reshapes), not arithmetic that every
 * block would redo over all of K (measured on the H200: SwiGLU's
 * silu(g) * u computed in the down projection's loads made it 4x slower
 * than the product as a kernel of its own). */
static bool movement_only(const Fuser *f, int G) {
  for (int m = f->head[G]; m >= 0; m = f->next[m])
    if (f->role[m] != ROLE_INJ && f->g->node[m].op != OP_CONCAT) return false;
  return true;
}

/* Adds to grps[] (marked in the candidate) the producer groups of the
 * operands of node m that qualify, recursively. */
static int absorb_producers(Fuser *f, int m, const bool *operand_ok, int *grps, int ng) {
  const Node *nn = &f->g->node[m];
  for (int j = 0; j < nn->nin && ng < PRO_MAX; j++) {
    if (operand_ok && !operand_ok[j]) continue;
    int p = producer(f, nn->in[j]);
    if (p < 0 || cand_has_group(f, f->gid[p])) continue;
    int G = f->gid[p];
    char why[256];
    if (!prologue_group_ok(f, G, nn->in[j], why, sizeof why)) continue;
    bool norm = norm_prologue(f, G, f->cand_node);
    if (f->g->node[f->cand_node].op == OP_MATMUL && !norm && !movement_only(f, G)) continue;
    cand_mark(f, G, true);
    grps[ng++] = G;
    /* the norm's input is read from memory (the GEMV's loads of it) */
    if (norm) continue;
    for (int k = f->head[G]; k >= 0 && ng < PRO_MAX; k = f->next[k]) ng = absorb_producers(f, k, NULL, grps, ng);
  }
  return ng;
}

/* Attention or a decode matmul with the prologue groups that qualify. */
static void place_with_prologue(Fuser *f, int n, GroupKind kind) {
  const Node *nn = &f->g->node[n];
  bool ok[8] = {false};
  if (nn->op == OP_ATTENTION) {
    /* only with one query tile (decode): in prefill the flash kernel's
     * 16-byte cp.async tile loads beat computing operands element by
     * element (measured on the H200, W4 prefill: 36 us with rope(q) in the
     * loads, 17 us without) */
    int64_t S = vtype(f, nn->in[0])->dim[2];
    ok[0] = ok[1] = ok[2] = S <= ATT_PROLOGUE_MAX_S;
  } else if (nn->op == OP_SCATTER) {
    ok[2] = true; /* the rows written: this step's k (its rope) or v */
  } else {
    ok[0] = true; /* A of the GEMV; B is the weight, */
    ok[1] = quant_weight_group(f, n) >= 0; /* or its dequantize */
  }
  cand_begin(f, n);
  int grps[PRO_MAX];
  int ng = absorb_producers(f, n, ok, grps, 0);
  if (ng > 0 && would_cycle(f, grps, ng)) {
    note(f, "fuse: %s: its operands' kernels not fused in (the kernels would depend on each other in a cycle)", nd(f, n));
    ng = 0;
  }
  int nodes = 1;
  for (int i = 0; i < ng; i++) nodes += f->size[grps[i]];
  if (ng > 0 && nodes > GROUP_NODE_CAP) {
    note(f, "fuse: %s: its operands' kernels not fused in (%d nodes > cap %d nodes a kernel (code size))", nd(f, n),
         nodes, GROUP_NODE_CAP);
    ng = 0;
  }
  if (ng == 0) {
    place_alone(f, n, kind);
    return;
  }
  for (int i = 0; i < ng; i++)
    note(f, "fuse: %s: computed in the operand loads of %s (%s prologue)", nd(f, f->tail[grps[i]]), nd(f, n),
         ir_op_name(nn->op));
  int G = grps[0];
  for (int i = 1; i < ng; i++) group_absorb(f, G, grps[i]);
  group_append(f, G, n);
  f->kind[G] = kind;
  f->anchor[G] = n;
}

/* Whether node n takes a prologue (CUDA only): attention and scatter
 * always, a matmul with M <= 8 whose A is not transposed.  A scatter
 * reads each element of its rows once, so the rope and the transposes
 * that make a KV-cache append's k and v cost nothing there, and the
 * kernel that computed them (a launch per layer in decode) goes. */
static bool takes_prologue(const Fuser *f, int n) {
  if (!cuda_only(f)) return false;
  const Node *nn = &f->g->node[n];
  if (nn->op == OP_ATTENTION || nn->op == OP_SCATTER) return true;
  if (nn->op != OP_MATMUL || ir_attr_int(nn, "transpose_a")) return false;
  const TensorType *a = vtype(f, nn->in[0]);
  return a->rank >= 2 && a->dim[a->rank - 2] <= GEMV_PROLOGUE_MAX_M;
}

/* Why elementwise group E (whose last value v0 is R's first input) cannot
 * be reduction R's prologue; false when it can. */
static bool prologue_refusal(Fuser *f, int E, int R, int v0, char *why, size_t cap) {
  const TensorType *x = vtype(f, v0);
  switch (f->kind[E]) {
  case GK_ELEMWISE: break;
  case GK_OPAQUE:
    snprintf(why, cap, "%s is opaque", ir_op_name(f->g->node[producer(f, v0)].op));
    return true;
  case GK_REDUCTION: snprintf(why, cap, "a reduction ends its group"); return true;
  case GK_CONTRACTION: snprintf(why, cap, "a reduction takes only an elementwise prologue"); return true;
  }
  if (f->tail[E] != producer(f, v0)) {
    snprintf(why, cap, "%s is not the result of its group", f->g->val[v0].name);
    return true;
  }
  for (int m = f->head[E]; m >= 0; m = f->next[m]) {
    if (f->role[m] != ROLE_EW) {
      snprintf(why, cap, "prologue member %s is injective", nd(f, m));
      return true;
    }
    if (!same_shape(ntype(f, m), x)) {
      snprintf(why, cap, "prologue member %s has shape %s, the reduction input %s", nd(f, m), shape_str(f, ntype(f, m)),
               shape_str(f, x));
      return true;
    }
  }
  const Node *r = &f->g->node[R];
  for (int j = 1; j < r->nin; j++) {
    int p = producer(f, r->in[j]);
    if (p >= 0 && f->gid[p] == E) {
      snprintf(why, cap, "%s also reads %s from the prologue", nd(f, R), f->g->val[r->in[j]].name);
      return true;
    }
  }
  return false;
}

static void place_reduction(Fuser *f, int R) {
  Cand c[64];
  int nc = collect_cands(f, R, c, 64);
  const Node *r = &f->g->node[R];
  int v0 = r->in[0], p0 = producer(f, v0), E = -1;
  for (int i = 0; i < nc; i++) {
    Cand *ci = &c[i];
    if (p0 < 0 || ci->grp != f->gid[p0]) {
      ci->state = C_REFUSED;
      snprintf(ci->why, sizeof ci->why, "only the first input of a reduction takes a prologue");
      continue;
    }
    ci->val = v0;
    if (prologue_refusal(f, ci->grp, R, v0, ci->why, sizeof ci->why)) {
      ci->state = C_REFUSED;
      continue;
    }
    cand_begin(f, R);
    cand_mark(f, ci->grp, true);
    if (would_cycle(f, &ci->grp, 1)) {
      ci->state = C_REFUSED;
      snprintf(ci->why, sizeof ci->why, "the kernels would depend on each other in a cycle");
      continue;
    }
    if (over_cap(ci, f->size[ci->grp] + 1)) continue;
    ci->fp = footprint(f, GK_REDUCTION, R, &ci->grp, 1);
    ci->state = ci->fp <= f->budget ? C_FUSED : C_STOPPED;
    if (ci->state == C_FUSED) E = ci->grp;
  }
  if (E >= 0) {
    group_append(f, E, R);
    f->kind[E] = GK_REDUCTION;
    f->anchor[E] = R;
  } else {
    group_new(f, GK_REDUCTION, R);
    note_start(f, R);
  }
  note_cands(f, R, c, nc, "reduction prologue");
}

/* The reduction that reads n's result as its first input, or -1. */
static int prologue_consumer(const Fuser *f, int n) {
  int v = f->g->node[n].out[0];
  for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++) {
    int c = f->unode[i];
    /* a norm that a decode GEMV computes in its loads reads its input
     * from memory: the residual sum joins the epilogue before it */
    if (f->role[c] == ROLE_RED && f->g->node[c].in[0] == v && norm_gemv_consumer(f, c) < 0) return c;
  }
  return -1;
}

/* Ops that only move data: each element of the input has one place in the
 * result. */
static bool moves_data(Op op) { return op == OP_TRANSPOSE || op == OP_RESHAPE || op == OP_SQUEEZE || op == OP_UNSQUEEZE; }

/* Whether group H's epilogue may leave its anchor's shape: on a CUDA-only
 * target, a contraction's or an attention's epilogue may move the result
 * (transpose, reshape: the attention output [B,H,S,D] stored straight as
 * [B*S, H*D] for the next matmul) and go on elementwise in the new shape;
 * the emitters store each element where the chain puts it
 * (codegen/cuda/emit.c, cu_store_epilogue).  Reductions keep rows of the
 * anchor's shape. */
static bool layout_epilogue(const Fuser *f, int H) {
  return cuda_only(f) && (f->kind[H] == GK_CONTRACTION ||
                          (f->kind[H] == GK_OPAQUE && f->g->node[f->anchor[H]].op == OP_ATTENTION));
}

/* A slice of step 2 along the last axis from 0 or 1 to the end: one half
 * of a gated pair merged with interleaved columns (merge-matmuls). */
static bool pair_slice(const Fuser *f, int n) {
  const Node *nn = &f->g->node[n];
  if (nn->op != OP_SLICE) return false;
  const TensorType *it = vtype(f, nn->in[0]);
  if (it->rank < 1) return false;
  int ax = ir_norm_axis(ir_attr_int(nn, "axis"), it->rank);
  int64_t start, end, len, step = ir_attr_int(nn, "step");
  ir_slice_bounds(it->dim[ax], ir_attr_int(nn, "start"), ir_attr_int(nn, "end"), step, &start, &end, &len);
  return ax == it->rank - 1 && step == 2 && (start == 0 || start == 1) && it->dim[ax] % 2 == 0 &&
         len == it->dim[ax] / 2;
}

/* Whether v is used, and only by pair slices. */
static bool pair_halves(const Fuser *f, int v) {
  if (f->is_out[v] || f->ustart[v] == f->ustart[v + 1]) return false;
  for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++)
    if (!pair_slice(f, f->unode[i])) return false;
  return true;
}

/* Whether node n may join contraction group H as a half of its
 * interleaved gated pair: the GEMM's result is read only by pair slices.
 * The tensor-core kernels hold columns 2j and 2j + 1 of a row in one
 * thread, and the decode GEMVs (M <= 8: the float one when no kernel
 * computes the weight, the quantised ones when a dequantize does) in one
 * warp (pair mode).  Any other weight computed in the kernel at M <= 8
 * (a GEMV prologue's) keeps its gated pair a kernel of its own. */
static bool gated_half(Fuser *f, int H, int u, int n) {
  if (!layout_epilogue(f, H) || f->kind[H] != GK_CONTRACTION || f->g->node[f->anchor[H]].op != OP_MATMUL) return false;
  if (u != f->g->node[f->anchor[H]].out[0] || !pair_slice(f, n) || !pair_halves(f, u)) return false;
  int64_t M, N, K;
  gemm_dims(f, f->anchor[H], &M, &N, &K);
  const Value *w = &f->g->val[f->g->node[f->anchor[H]].in[1]];
  return M > GEMV_PROLOGUE_MAX_M || w->kind != VK_NODE || f->g->node[w->node].op == OP_DEQUANTIZE;
}

/* Why node n cannot be the next epilogue op of contraction/reduction group
 * H through operand u; false when it can. */
static bool epilogue_refusal(Fuser *f, int H, int u, int n, int pref, char *why, size_t cap) {
  bool layout = layout_epilogue(f, H), half = gated_half(f, H, u, n);
  if (f->role[n] == ROLE_INJ && !(layout && moves_data(f->g->node[n].op)) && !half) {
    snprintf(why, cap, "%s is injective; only elementwise ops join an epilogue", nd(f, n));
    return true;
  }
  if (pref >= 0) {
    snprintf(why, cap, "%s is kept for the prologue of %s", f->g->val[f->g->node[n].out[0]].name, nd(f, pref));
    return true;
  }
  /* a layout epilogue may branch (the two halves of a gated pair) and
   * join again: any value of the group computed from the anchor */
  int pu = producer(f, u);
  if (layout ? pu < 0 || f->gid[pu] != H : f->tail[H] != pu) {
    snprintf(why, cap, "%s is not the result of its group", f->g->val[u].name);
    return true;
  }
  if (!half && explain_other_uses(f, u, n, why, cap)) return true;
  const TensorType *ya = ntype(f, f->anchor[H]);
  if (layout) ya = vtype(f, u); /* elementwise keeps the shape its operand has */
  if (!moves_data(f->g->node[n].op) && !half && !same_shape(ntype(f, n), ya)) {
    snprintf(why, cap, "%s has shape %s, the %s result %s", nd(f, n), shape_str(f, ntype(f, n)),
             ir_op_name(f->g->node[f->anchor[H]].op), shape_str(f, ya));
    return true;
  }
  const Node *nn = &f->g->node[n];
  for (int j = 0; j < nn->nin; j++) {
    int p = producer(f, nn->in[j]);
    /* in a layout epilogue, another value of the group of n's shape is
     * computed at the same place (the product of a gated pair's halves) */
    if (layout && p >= 0 && f->gid[p] == H && same_shape(vtype(f, nn->in[j]), ntype(f, n))) continue;
    if (nn->in[j] != u && p >= 0 && f->gid[p] == H) {
      snprintf(why, cap, "%s also reads %s from inside the group", nd(f, n), f->g->val[nn->in[j]].name);
      return true;
    }
  }
  return false;
}

/* Why node n cannot merge elementwise group H through operand u. */
static bool elemwise_refusal(Fuser *f, int H, int u, int n, int pref, char *why, size_t cap) {
  if (f->tail[H] != producer(f, u)) {
    snprintf(why, cap, "%s is not the result of its group", f->g->val[u].name);
    return true;
  }
  if (explain_other_uses(f, u, n, why, cap)) return true;
  if (pref >= 0)
    for (int m = f->head[H]; m >= 0; m = f->next[m])
      if (f->role[m] != ROLE_EW || !same_shape(ntype(f, m), ntype(f, n))) {
        snprintf(why, cap, "%s is kept for the prologue of %s, which takes only elementwise ops of shape %s",
                 f->g->val[f->g->node[n].out[0]].name, nd(f, pref), shape_str(f, ntype(f, n)));
        return true;
      }
  return false;
}

static void place_elementwise(Fuser *f, int n) {
  Cand c[64];
  int nc = collect_cands(f, n, c, 64);
  int pref = f->role[n] == ROLE_EW ? prologue_consumer(f, n) : -1;
  const char *how = "elementwise";

  /* an epilogue of a contraction or reduction first: it saves the round
   * trip of the anchor's result, the largest value around */
  int chosen = -1;
  for (int i = 0; i < nc && chosen < 0; i++) {
    Cand *ci = &c[i];
    GroupKind k = f->kind[ci->grp];
    if (k == GK_OPAQUE && !layout_epilogue(f, ci->grp)) {
      ci->state = C_REFUSED;
      snprintf(ci->why, sizeof ci->why, "%s is opaque", ir_op_name(f->g->node[producer(f, ci->val)].op));
      continue;
    }
    if (k == GK_ELEMWISE) continue;
    if (epilogue_refusal(f, ci->grp, ci->val, n, pref, ci->why, sizeof ci->why)) {
      ci->state = C_REFUSED;
      continue;
    }
    cand_begin(f, n);
    cand_mark(f, ci->grp, true);
    if (would_cycle(f, &ci->grp, 1)) {
      ci->state = C_REFUSED;
      snprintf(ci->why, sizeof ci->why, "the kernels would depend on each other in a cycle");
      continue;
    }
    if (over_cap(ci, f->size[ci->grp] + 1)) continue;
    ci->fp = footprint(f, k, f->anchor[ci->grp], &ci->grp, 1);
    ci->state = ci->fp <= f->budget ? C_FUSED : C_STOPPED;
    if (ci->state == C_FUSED) chosen = i;
  }
  if (chosen >= 0) {
    group_append(f, c[chosen].grp, n);
    how = f->kind[c[chosen].grp] == GK_CONTRACTION ? "contraction epilogue"
          : f->kind[c[chosen].grp] == GK_OPAQUE   ? "attention epilogue"
                                                  : "reduction epilogue";
  } else {
    /* else merge every elementwise producer group that may, one by one */
    int grps[64], ng = 0, nodes = 1;
    cand_begin(f, n);
    for (int i = 0; i < nc; i++) {
      Cand *ci = &c[i];
      if (f->kind[ci->grp] != GK_ELEMWISE) continue;
      if (elemwise_refusal(f, ci->grp, ci->val, n, pref, ci->why, sizeof ci->why)) {
        ci->state = C_REFUSED;
        continue;
      }
      grps[ng] = ci->grp;
      cand_mark(f, ci->grp, true);
      if (would_cycle(f, grps, ng + 1)) {
        cand_mark(f, ci->grp, false);
        ci->state = C_REFUSED;
        snprintf(ci->why, sizeof ci->why, "the kernels would depend on each other in a cycle");
        continue;
      }
      if (over_cap(ci, nodes + f->size[ci->grp])) {
        cand_mark(f, ci->grp, false);
        continue;
      }
      ci->fp = footprint(f, GK_ELEMWISE, n, grps, ng + 1);
      if (ci->fp > f->budget) {
        cand_mark(f, ci->grp, false);
        ci->state = C_STOPPED;
        continue;
      }
      ci->state = C_FUSED;
      nodes += f->size[ci->grp];
      ng++;
    }
    if (ng > 0) {
      for (int i = 1; i < ng; i++) group_absorb(f, grps[0], grps[i]);
      group_append(f, grps[0], n);
    } else {
      group_new(f, GK_ELEMWISE, n);
      note_start(f, n);
    }
  }
  note_cands(f, n, c, nc, how);
}

/* ---- siblings ---- */

/* Sibling fusion, CUDA only: elementwise groups that read the same
 * computed value and do not depend on each other become one kernel (one
 * launch instead of several, each writing its own results: the q, k and v
 * of an attention made from one merged projection: rope q, rope k and the
 * transposed v).  The elementwise emitter runs a grid-stride loop per
 * result shape.  A merge must keep the kernels acyclic and the footprint
 * within the budget. */
static void merge_siblings(Fuser *f) {
  if (!cuda_only(f)) return;
  Graph *g = f->g;
  for (int v = 0; v < g->nval; v++) {
    if (g->val[v].kind != VK_NODE) continue;
    int first = -1;
    for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++) {
      int c = f->unode[i];
      int H = f->gid[c];
      if (H < 0 || f->kind[H] != GK_ELEMWISE || H == f->gid[g->val[v].node]) continue;
      if (first < 0) {
        first = H;
        continue;
      }
      if (H == first) continue;
      int pair[2] = {first, H};
      cand_begin(f, -1);
      cand_mark(f, first, true);
      cand_mark(f, H, true);
      if (would_cycle(f, pair, 2)) continue;
      if (f->size[first] + f->size[H] > GROUP_NODE_CAP) {
        note(f, "%s: not merged with its sibling ending in %s: %d nodes > cap %d nodes a kernel (code size)",
             gname(f, first), nd(f, f->tail[H]), f->size[first] + f->size[H], GROUP_NODE_CAP);
        continue;
      }
      int nm = cand_members(f, pair, 2);
      int64_t fp = fp_elemwise(f, f->tail[first], f->members, nm);
      if (fp > f->budget) continue;
      /* H's name is first's once merged: name H by its last node */
      note(f, "%s: merged with its sibling ending in %s (both read %s; footprint %lld B)", gname(f, first),
           nd(f, f->tail[H]), g->val[v].name, (long long)fp);
      group_absorb(f, first, H);
    }
  }
}

/* ---- the result ---- */

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* A binary min-heap of group ids keyed by key[]. */
static void heap_push(int *h, int *n, const int *key, int G) {
  int i = (*n)++;
  h[i] = G;
  while (i > 0 && key[h[(i - 1) / 2]] > key[h[i]]) {
    int p = (i - 1) / 2, t = h[p];
    h[p] = h[i], h[i] = t, i = p;
  }
}
static int heap_pop(int *h, int *n, const int *key) {
  int top = h[0], i = 0;
  h[0] = h[--(*n)];
  for (;;) {
    int l = 2 * i + 1, r = l + 1, s = i;
    if (l < *n && key[h[l]] < key[h[s]]) s = l;
    if (r < *n && key[h[r]] < key[h[s]]) s = r;
    if (s == i) break;
    int t = h[s];
    h[s] = h[i], h[i] = t, i = s;
  }
  return top;
}

/* "k03_layer.0_h": the group's index, then its anchor's YAML name with
 * characters other than [A-Za-z0-9_.] made '_'. */
static const char *kernel_name(Graph *g, int index, int anchor) {
  char buf[96];
  int len = snprintf(buf, sizeof buf, "k%02d_%s", index, ir_node_name(g, &g->node[anchor]));
  if (len < 0) buf[0] = 0;
  for (char *s = buf; *s; s++) {
    char ch = *s;
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '.';
    if (!ok) *s = '_';
  }
  return ir_graph_strdup(g, buf);
}

static int group_anchor(const Fuser *f, int G) { return f->kind[G] == GK_ELEMWISE ? f->tail[G] : f->anchor[G]; }

/* Sorts the groups topologically, reorders g->node to match and writes
 * g->groups.  Returns the emission order of the internal groups in
 * *out_final (index per internal group, -1 for merged ones). */
static smelt_status emit_groups(Fuser *f, int *final) {
  Graph *g = f->g;
  int N = f->nnode, ng = f->ngrp;
  int *key = malloc(sizeof(int) * (size_t)(ng + 1)), *indeg = calloc((size_t)ng + 1, sizeof(int));
  int *heap = malloc(sizeof(int) * (size_t)(ng + 1)), *order = malloc(sizeof(int) * (size_t)(ng + 1));
  int *norder = malloc(sizeof(int) * (size_t)(N + 1)), *newid = malloc(sizeof(int) * (size_t)(N + 1));
  int64_t *fp = malloc(sizeof(int64_t) * (size_t)(ng + 1));
  Node *copy = malloc(sizeof(Node) * (size_t)(N + 1));
  smelt_status st = NULL;
  if (!key || !indeg || !heap || !order || !norder || !newid || !fp || !copy) {
    st = st_error(ST_NO_MEMORY, "out of memory");
    goto done;
  }
  for (int G = 0; G < ng; G++) {
    key[G] = -1;
    final[G] = -1;
    if (f->head[G] >= 0) {
      cand_begin(f, -1);
      cand_mark(f, G, true);
      fp[G] = footprint(f, f->kind[G], group_anchor(f, G), &G, 1);
    }
  }
  for (int n = 0; n < N; n++) {
    int G = f->gid[n];
    if (key[G] < 0) key[G] = n;
    const Node *nn = &g->node[n];
    for (int j = 0; j < nn->nin; j++) {
      int p = producer(f, nn->in[j]);
      if (p >= 0 && f->gid[p] != G) indeg[G]++;
    }
  }
  int nh = 0, norders = 0, nn_out = 0;
  for (int G = 0; G < ng; G++)
    if (f->head[G] >= 0 && indeg[G] == 0) heap_push(heap, &nh, key, G);
  while (nh > 0) {
    int G = heap_pop(heap, &nh, key);
    final[G] = norders;
    order[norders++] = G;
    int first = nn_out;
    for (int m = f->head[G]; m >= 0; m = f->next[m]) norder[nn_out++] = m;
    qsort(norder + first, (size_t)(nn_out - first), sizeof(int), cmp_int); /* topological within */
    for (int k = first; k < nn_out; k++) {
      const Node *mn = &g->node[norder[k]];
      for (int o = 0; o < mn->nout; o++) {
        int v = mn->out[o];
        for (int i = f->ustart[v]; i < f->ustart[v + 1]; i++) {
          int X = f->gid[f->unode[i]];
          if (X != G && --indeg[X] == 0) heap_push(heap, &nh, key, X);
        }
      }
    }
  }
  if (nn_out != N) {
    st = st_error(ST_INTERNAL, "internal error: fusion groups depend on each other in a cycle");
    goto done;
  }
  /* reorder g->node; value ids stay, node ids change */
  memcpy(copy, g->node, sizeof(Node) * (size_t)N);
  for (int i = 0; i < N; i++) {
    g->node[i] = copy[norder[i]];
    newid[norder[i]] = i;
  }
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].kind == VK_NODE) g->val[v].node = newid[g->val[v].node];
  for (int k = 0; k < norders; k++) {
    int G = order[k];
    int id = ir_add_group(g, f->kind[G]);
    int cnt = 0;
    for (int m = f->head[G]; m >= 0; m = f->next[m]) cnt++;
    int *mem = id < 0 ? NULL : ir_graph_alloc(g, sizeof(int) * (size_t)cnt);
    if (!mem) {
      st = ir_graph_status(g);
      goto done;
    }
    Group *gr = &g->groups[id];
    cnt = 0;
    for (int m = f->head[G]; m >= 0; m = f->next[m]) mem[cnt++] = newid[m];
    qsort(mem, (size_t)cnt, sizeof(int), cmp_int);
    for (int i = 0; i < cnt; i++) g->node[mem[i]].group = id;
    gr->nodes = mem;
    gr->nnodes = cnt;
    gr->anchor = newid[group_anchor(f, G)];
    gr->footprint = fp[G];
    gr->budget = f->budget;
    gr->kernel = kernel_name(g, id, gr->anchor);
  }
done:
  free(key), free(indeg), free(heap), free(order), free(norder), free(newid), free(fp), free(copy);
  return st;
}

/* Copies the explain notes into the pass log with the kernel names in. */
static void flush_notes(Fuser *f, const int *final) {
  if (!f->log) return;
  char *line = f->log;
  while (*line) {
    char *end = strchr(line, '\n');
    *end = 0;
    char out[2048];
    size_t len = 0;
    for (const char *s = line; *s && len + 1 < sizeof out;) {
      if (*s == '\001') {
        int G = (int)strtol(s + 1, (char **)&s, 10);
        s++; /* the closing \1 */
        while (f->redirect[G] >= 0) G = f->redirect[G];
        const char *name = final[G] >= 0 ? f->g->groups[final[G]].kernel : "?";
        int w = snprintf(out + len, sizeof out - len, "%s", name);
        if (w > 0) len += (size_t)w < sizeof out - len ? (size_t)w : sizeof out - len - 1;
      } else {
        out[len++] = *s++;
      }
    }
    out[len] = 0;
    pass_ctx_logf(f->ctx, "%s", out);
    line = end + 1;
  }
}

/* ---- setup ---- */

static void fuser_free(Fuser *f) {
  free(f->role), free(f->gid), free(f->next), free(f->kind), free(f->head), free(f->last), free(f->tail);
  free(f->anchor), free(f->redirect), free(f->size), free(f->ustart), free(f->unode), free(f->is_out);
  free(f->gin), free(f->gvis), free(f->vmark), free(f->stack), free(f->members), free(f->log);
}

static bool fuser_init(Fuser *f, Graph *g, PassCtx *ctx) {
  memset(f, 0, sizeof *f);
  f->g = g;
  f->ctx = ctx;
  size_t N = (size_t)g->nnode + 1, V = (size_t)g->nval + 1;
  f->nnode = g->nnode;
  f->role = malloc(sizeof(Role) * N);
  f->gid = malloc(sizeof(int) * N);
  f->next = malloc(sizeof(int) * N);
  f->kind = malloc(sizeof(GroupKind) * N);
  f->head = malloc(sizeof(int) * N);
  f->last = malloc(sizeof(int) * N);
  f->tail = malloc(sizeof(int) * N);
  f->anchor = malloc(sizeof(int) * N);
  f->redirect = malloc(sizeof(int) * N);
  f->size = malloc(sizeof(int) * N);
  f->gin = calloc(N, sizeof(int));
  f->gvis = calloc(N, sizeof(int));
  f->stack = malloc(sizeof(int) * N);
  f->members = malloc(sizeof(int) * N);
  f->vmark = calloc(V, sizeof(int));
  f->ustart = calloc(V + 1, sizeof(int));
  f->is_out = calloc(V, sizeof(bool));
  size_t nuse = 0;
  for (int n = 0; n < g->nnode; n++) nuse += (size_t)g->node[n].nin;
  f->unode = malloc(sizeof(int) * (nuse + 1));
  if (!f->role || !f->gid || !f->next || !f->kind || !f->head || !f->last || !f->tail || !f->anchor || !f->redirect || !f->size ||
      !f->gin || !f->gvis || !f->stack || !f->members || !f->vmark || !f->ustart || !f->is_out || !f->unode)
    return false;
  for (int n = 0; n < g->nnode; n++) {
    f->role[n] = node_role(g, &g->node[n]);
    f->gid[n] = -1;
    for (int j = 0; j < g->node[n].nin; j++) f->ustart[g->node[n].in[j] + 1]++;
  }
  for (int v = 0; v < g->nval; v++) f->ustart[v + 1] += f->ustart[v];
  int *fill = malloc(sizeof(int) * V); /* next free slot per value */
  if (!fill) return false;
  for (int v = 0; v < g->nval; v++) fill[v] = f->ustart[v];
  for (int n = 0; n < g->nnode; n++)
    for (int j = 0; j < g->node[n].nin; j++) f->unode[fill[g->node[n].in[j]]++] = n;
  free(fill);
  for (int i = 0; i < g->noutputs; i++) f->is_out[g->outputs[i]] = true;
  f->cand_node = -1;
  return true;
}

/* ---- the pass ---- */

/* The grouping as it was, to tell whether the pass changed anything. */
typedef struct {
  int *key, *grp, n, ngroups;
  Group *groups;
} Snapshot;

static bool snapshot_take(const Graph *g, Snapshot *s) {
  s->n = g->nnode;
  s->ngroups = g->ngroups;
  s->key = malloc(sizeof(int) * ((size_t)s->n + 1));
  s->grp = malloc(sizeof(int) * ((size_t)s->n + 1));
  s->groups = malloc(sizeof(Group) * ((size_t)s->ngroups + 1));
  if (!s->key || !s->grp || !s->groups) return false;
  for (int i = 0; i < s->n; i++) {
    s->key[i] = g->node[i].out[0];
    s->grp[i] = g->node[i].group;
  }
  if (s->ngroups) memcpy(s->groups, g->groups, sizeof(Group) * (size_t)s->ngroups);
  return true;
}

static bool snapshot_same(const Graph *g, const Snapshot *s) {
  if (s->n != g->nnode || s->ngroups != g->ngroups) return false;
  for (int i = 0; i < s->n; i++)
    if (s->key[i] != g->node[i].out[0] || s->grp[i] != g->node[i].group) return false;
  for (int k = 0; k < s->ngroups; k++) {
    const Group *a = &s->groups[k], *b = &g->groups[k];
    if (a->kind != b->kind || a->anchor != b->anchor || a->footprint != b->footprint || a->budget != b->budget ||
        !a->kernel || !b->kernel || strcmp(a->kernel, b->kernel) != 0)
      return false;
  }
  return true;
}

/* The smallest shared-memory budget of the archs in the comma-separated
 * list (NULL or empty: sm_90a, the default target); `source` says which. */
static int64_t cuda_budget(const char *archs, char *source, size_t cap) {
  const char *list = archs && *archs ? archs : "sm_90a";
  int64_t best = 0;
  snprintf(source, cap, "shared memory per block of %s", list);
  for (const char *p = list; *p;) {
    size_t n = strcspn(p, ",");
    char arch[32];
    snprintf(arch, sizeof arch, "%.*s", (int)(n < sizeof arch ? n : sizeof arch - 1), p);
    int64_t b = ir_cuda_onchip_budget(arch);
    if (b > 0 && (best <= 0 || b < best)) {
      best = b;
      snprintf(source, cap, "shared memory per block of %s", arch);
    }
    p += n + (p[n] == ',');
  }
  return best;
}

static void snapshot_free(Snapshot *s) { free(s->key), free(s->grp), free(s->groups); }

smelt_status pass_fuse(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  /* a topological order without dead nodes: node ids are positions below */
  RETURN_IF_ERROR(ir_graph_compact(g));
  Snapshot snap;
  if (!snapshot_take(g, &snap)) {
    snapshot_free(&snap);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int i = 0; i < g->nnode; i++) g->node[i].group = -1;
  g->ngroups = 0;

  Fuser f;
  const char *source = "--onchip-bytes";
  if (!fuser_init(&f, g, ctx)) {
    fuser_free(&f);
    snapshot_free(&snap);
    return st_error(ST_NO_MEMORY, "out of memory");
  }
  f.budget = ctx->onchip_bytes;
  char cuda_source[96];
  if (f.budget <= 0 && ctx->target && strstr(ctx->target, "cuda")) {
    f.budget = cuda_budget(ctx->arch, cuda_source, sizeof cuda_source);
    source = cuda_source;
  }
  bool cpu = !ctx->target || strstr(ctx->target, "cpu");
  if (cpu && (ctx->onchip_bytes <= 0)) {
    int64_t l2 = ir_cpu_l2_bytes();
    if (l2 > 0 && (f.budget <= 0 || l2 < f.budget)) {
      f.budget = l2;
      source = "the L2 cache of cpu0";
    }
  }
  if (f.budget <= 0) {
    f.budget = DEFAULT_BUDGET;
    source = "default: no L2 size found";
  }

  for (int n = 0; n < g->nnode; n++) {
    int qg;
    switch (f.role[n]) {
    case ROLE_OPAQUE:
      if (takes_prologue(&f, n)) place_with_prologue(&f, n, GK_OPAQUE);
      else place_alone(&f, n, GK_OPAQUE);
      break;
    case ROLE_CON:
      if (takes_prologue(&f, n)) place_with_prologue(&f, n, GK_CONTRACTION);
      else if ((qg = quant_weight_group(&f, n)) >= 0) place_quant_matmul(&f, n, qg);
      else place_alone(&f, n, GK_CONTRACTION);
      break;
    case ROLE_RED: place_reduction(&f, n); break;
    case ROLE_EW:
    case ROLE_INJ: place_elementwise(&f, n); break;
    }
  }

  merge_siblings(&f);
  int *final = malloc(sizeof(int) * ((size_t)f.ngrp + 1));
  smelt_status st = final ? emit_groups(&f, final) : st_error(ST_NO_MEMORY, "out of memory");
  if (!st) {
    flush_notes(&f, final);
    int count[4] = {0};
    for (int k = 0; k < g->ngroups; k++) count[g->groups[k].kind]++;
    pass_ctx_logf(ctx,
                  "fuse: %d node%s in %d kernel%s (%d elementwise, %d reduction, %d contraction, %d opaque); "
                  "budget %lld B (%s), at most %d nodes a kernel",
                  g->nnode, g->nnode == 1 ? "" : "s", g->ngroups, g->ngroups == 1 ? "" : "s", count[GK_ELEMWISE],
                  count[GK_REDUCTION], count[GK_CONTRACTION], count[GK_OPAQUE], (long long)f.budget, source,
                  GROUP_NODE_CAP);
    *changed = !snapshot_same(g, &snap);
    if (*changed) { /* a plan made for other kernel boundaries is stale */
      for (int v = 0; v < g->nval; v++) g->val[v].mem_offset = -1;
      g->arena_bytes = g->unplanned_bytes = 0;
    }
  }
  free(final);
  fuser_free(&f);
  snapshot_free(&snap);
  return st;
}
