/* merge-matmuls: matmuls that share their left operand and multiply it by
 * constant weights become one matmul over the weights side by side.
 *
 * In a transformer layer q, k and v are three products of the normalised
 * hidden state, and the MLP's gate and up projections two more.  One
 * product with the weights concatenated along N reads the shared operand
 * once, launches one kernel instead of three (decode: three small GEMVs
 * whose launches cost as much as their bytes), and gives the GEMM a wider
 * N to tile.  Each original result becomes a slice of the merged one along
 * its last axis, under its old name; the fuse pass then computes the
 * slices inside the kernels that read them (a rope, an attention's operand
 * loads, a SwiGLU product).  Under XLA this is "horizontal fusion" of dots;
 * TensorRT and vLLM build the fused QKV and gate-up weights by hand.
 *
 * Which matmuls merge: live, the same left operand and transpose_a, right
 * operands 2-D constants of one dtype with the same K and the same
 * transpose_b (so [K, N_i] side by side along N, or [N_i, K] stacked along
 * N after the layout pass), none of whose results is a graph output.  The
 * old weights are removed from the graph (no second copy in the bundle).
 * Only for --target cuda: the CPU backend packs weights per matmul and
 * gains little from one wider product.
 *
 * A gated pair (two products a, b whose only use is act(a) * b, act one
 * elementwise op: SwiGLU's silu(x Wg) * (x Wu), GeGLU) is merged with the
 * columns interleaved instead, a_j next to b_j, and the two results are the
 * slices of step 2 starting at 0 and 1: a thread of a tensor-core GEMM
 * holds columns 2j and 2j + 1 of a row together, and a warp of the decode
 * GEMV owns both (codegen/cuda/gemv.c, pair mode), so fuse can take the
 * slices, the activation and the product into the kernel's epilogue, which
 * stores only the [M, N] product (half the columns, and no separate
 * kernel).  Whatever the rows, so the decode and prefill specialisations
 * of one model merge the same weight (one copy in the bundle and on the
 * device).
 *
 * The merged weight is pure data movement of the old ones, so when each of
 * them came straight from a weights file (Value.source, one contiguous
 * copy) the merged one gets the strided copies that build it from those
 * files: --external-weights keeps it out of the bundle too.
 *
 * Requires: const-fold; runs before layout and fuse.
 */
#include <stdlib.h>
#include <string.h>

#include "format/parallel.h"
#include "passes.h"
#include "rewrite.h"

enum { MERGE_MAX = 8 };

/* The only use of v's value: its consumer node, or -1. */
static int sole_use(const Graph *g, const int *uses, int v) {
  if (uses[v] != 1) return -1;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead) continue;
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] == v) return i;
  }
  return -1;
}

/* Whether matmuls a and b (ids, compatible, same N) are a gated pair:
 * mul(act(a), b) or mul(b, act(a)) is the only use of each, act an
 * elementwise op of one operand. */
static bool gated_pair(const Graph *g, int a, int b) {
  const TensorType *yt = &g->val[g->node[a].out[0]].type;
  if (yt->dim[yt->rank - 1] != g->val[g->node[b].out[0]].type.dim[yt->rank - 1]) return false;
  int *uses = ir_use_counts(g);
  if (!uses) return false;
  bool ok = false;
  for (int swap = 0; swap < 2 && !ok; swap++) {
    int ga = swap ? b : a, ub = swap ? a : b;
    int act = sole_use(g, uses, g->node[ga].out[0]), mul = sole_use(g, uses, g->node[ub].out[0]);
    if (act < 0 || mul < 0) continue;
    const Node *an = &g->node[act], *mn = &g->node[mul];
    if (an->nin != 1 || ir_op_info(an->op)->fclass != FC_ELEMWISE || an->op == OP_CAST) continue;
    if (mn->op != OP_MUL || sole_use(g, uses, an->out[0]) != mul) continue;
    ok = (mn->in[0] == an->out[0] && mn->in[1] == g->node[ub].out[0]) ||
         (mn->in[1] == an->out[0] && mn->in[0] == g->node[ub].out[0]);
  }
  free(uses);
  return ok;
}

static bool weight_of(const Graph *g, const Node *n, int64_t *K, int64_t *N) {
  if (n->dead || n->op != OP_MATMUL || n->nin != 2) return false;
  const Value *b = &g->val[n->in[1]];
  if (b->kind != VK_CONST || !b->data || b->type.rank != 2 || n->in[0] == n->in[1]) return false;
  if (g->val[n->in[0]].type.rank < 2) return false;
  bool tb = ir_attr_int(n, "transpose_b") != 0;
  *K = b->type.dim[tb ? 1 : 0];
  *N = b->type.dim[tb ? 0 : 1];
  return !pass_is_output(g, n->out[0]);
}

static bool compatible(const Graph *g, const Node *a, const Node *b) {
  int64_t Ka, Na, Kb, Nb;
  if (!weight_of(g, a, &Ka, &Na) || !weight_of(g, b, &Kb, &Nb)) return false;
  return a->in[0] == b->in[0] && Ka == Kb && ir_attr_int(a, "transpose_a") == ir_attr_int(b, "transpose_a") &&
         ir_attr_int(a, "transpose_b") == ir_attr_int(b, "transpose_b") &&
         g->val[a->in[1]].type.dt == g->val[b->in[1]].type.dt && g->val[a->out[0]].type.dt == g->val[b->out[0]].type.dt;
}

/* The provenance of the merged weight (ir.h: IrSource): per old weight one
 * strided copy out of its file, when every old weight is one contiguous
 * copy of a file; else NULL (the merged weight is then stored as it is). */
static const IrSource *merged_source(Graph *g, const int *ids, int n, bool glu, bool tb, int64_t K, const int64_t *Ns,
                                     int64_t Ntot, size_t es) {
  for (int i = 0; i < n; i++) {
    const Value *w = &g->val[g->node[ids[i]].in[1]];
    const IrCopy *c = w->source && w->source->ncopies == 1 ? &w->source->copies[0] : NULL;
    if (!c || c->rows != 1 || c->cols != 1 || c->dst != 0 || c->elem != ir_type_bytes(&w->type)) return NULL;
  }
  IrSource *src = ir_graph_alloc(g, sizeof *src);
  IrCopy *cp = ir_graph_alloc(g, sizeof *cp * (size_t)n);
  if (!src || !cp) return NULL; /* out of memory: the graph is marked */
  uint64_t e = es, k = (uint64_t)K, nt = (uint64_t)Ntot, off = 0;
  for (int i = 0; i < n; i++) {
    const IrCopy *c = &g->val[g->node[ids[i]].in[1]].source->copies[0];
    uint64_t ni = (uint64_t)Ns[i];
    IrCopy x = {.file = c->file, .name = c->name, .src = c->src};
    if (glu && tb) { /* row j of weight i is merged row 2j + i */
      x.dst = (uint64_t)i * k * e, x.rows = ni, x.cols = 1, x.elem = k * e, x.src_row = k * e, x.dst_row = 2 * k * e;
    } else if (glu) { /* element (r, j) of weight i is merged element (r, 2j + i) */
      x.dst = (uint64_t)i * e, x.rows = k, x.cols = ni, x.elem = e, x.src_row = ni * e, x.src_col = e;
      x.dst_row = nt * e, x.dst_col = 2 * e;
    } else if (tb) { /* stacked rows */
      x.dst = off * k * e, x.rows = 1, x.cols = 1, x.elem = ni * k * e;
    } else { /* side by side: each row of weight i at column off */
      x.dst = off * e, x.rows = k, x.cols = 1, x.elem = ni * e, x.src_row = ni * e, x.dst_row = nt * e;
    }
    cp[i] = x;
    off += ni;
  }
  src->ncopies = n;
  src->copies = cp;
  return src;
}

/* The copy of n weights into their merged one, by rows of the result. */
typedef struct {
  unsigned char *dst;
  const unsigned char *src[MERGE_MAX];
  int64_t N[MERGE_MAX];
  int n;
  bool glu, tb;
  int64_t K, Ntot;
  size_t es;
} MergeCopy;

#define MERGE_ROWS 64

static void merge_rows(void *ctx, int task) {
  const MergeCopy *c = ctx;
  int64_t K = c->K, Ntot = c->Ntot, r0 = (int64_t)task * MERGE_ROWS, r1 = r0 + MERGE_ROWS;
  size_t es = c->es;
  if (c->tb) {
    /* rows are output columns: row r is row j of weight i (glu: r = 2j + i;
     * else the weights one after another) */
    if (r1 > Ntot) r1 = Ntot;
    for (int64_t r = r0; r < r1; r++) {
      int i = 0;
      int64_t j = r;
      if (c->glu) {
        i = (int)(r % 2), j = r / 2;
      } else {
        while (j >= c->N[i]) j -= c->N[i++];
      }
      memcpy(c->dst + (size_t)(r * K) * es, c->src[i] + (size_t)(j * K) * es, (size_t)K * es);
    }
    return;
  }
  /* rows are k: the weights' row k side by side (glu: column 2j + i is column j of weight i) */
  if (r1 > K) r1 = K;
  for (int64_t k = r0; k < r1; k++) {
    unsigned char *row = c->dst + (size_t)(k * Ntot) * es;
    if (c->glu) {
      for (int64_t j = 0; j < c->N[0]; j++)
        for (int i = 0; i < 2; i++) memcpy(row + (size_t)(2 * j + i) * es, c->src[i] + (size_t)(k * c->N[i] + j) * es, es);
      continue;
    }
    int64_t off = 0;
    for (int i = 0; i < c->n; i++) {
      memcpy(row + (size_t)off * es, c->src[i] + (size_t)(k * c->N[i]) * es, (size_t)c->N[i] * es);
      off += c->N[i];
    }
  }
}

/* Merges matmuls ids[0..n) (compatible, in graph order). */
static smelt_status merge(Graph *g, PassCtx *ctx, const int *ids, int n) {
  /* g->node may move when nodes are added: keep ids, not pointers */
  const Node *first = &g->node[ids[0]];
  int a = first->in[0];
  SrcLoc loc = first->loc;
  bool tb = ir_attr_int(first, "transpose_b") != 0;
  DType wdt = g->val[first->in[1]].type.dt;
  size_t es = dt_size(wdt);
  int64_t K = 0, Ntot = 0, Ns[MERGE_MAX];
  for (int i = 0; i < n; i++) {
    int64_t k, nn;
    weight_of(g, &g->node[ids[i]], &k, &nn);
    K = k, Ns[i] = nn, Ntot += nn;
  }
  /* the weights side by side: [K, sum N] or, transposed, [sum N, K] */
  char base[256];
  snprintf(base, sizeof base, "%s.merged", g->val[first->in[1]].name);
  TensorType wt = {.dt = wdt, .rank = 2};
  wt.dim[0] = tb ? Ntot : K;
  wt.dim[1] = tb ? K : Ntot;
  int w = ir_add_const(g, pass_fresh_name(g, base), wt, NULL, g->val[first->in[1]].loc);
  g->val[w].init = "merged";
  unsigned char *dst = g->val[w].data;
  if (!dst) return ir_graph_status(g);
  bool glu = n == 2 && gated_pair(g, ids[0], ids[1]);
  MergeCopy mc = {.dst = dst, .n = n, .glu = glu, .tb = tb, .K = K, .Ntot = Ntot, .es = es};
  for (int i = 0; i < n; i++) {
    mc.src[i] = g->val[g->node[ids[i]].in[1]].data;
    mc.N[i] = Ns[i];
  }
  /* tasks of MERGE_ROWS rows of the merged weight ([Ntot, K] with tb, else
   * [K, Ntot]): on many cores the copy is mostly page faults taken side by side */
  int64_t rows = tb ? Ntot : K;
  int64_t ntasks = (rows + MERGE_ROWS - 1) / MERGE_ROWS;
  fmt_parallel_for(fmt_parallel_threads((uint64_t)(Ntot * K) * es), (int)ntasks, merge_rows, &mc);
  g->val[w].source = merged_source(g, ids, n, glu, tb, K, Ns, Ntot, es);
  /* the merged product, then one slice per old result under its name */
  snprintf(base, sizeof base, "%s.merged", g->val[first->out[0]].name);
  const char *mname = pass_fresh_name(g, base);
  int in[2] = {a, w};
  int m = ir_add_node(g, OP_MATMUL, 2, in, 1, &mname, loc);
  first = NULL;
  pass_copy_attrs(g, m, ids[0]);
  RETURN_IF_ERROR(ir_infer_node(g, m));
  int merged = g->node[m].out[0];
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    Node *old = &g->node[ids[i]];
    int y = old->out[0], wold = old->in[1];
    SrcLoc oloc = old->loc;
    old->dead = true;
    const char *name = pass_fresh_name(g, g->val[y].name); /* the old name: its producer is dead */
    int s = ir_add_node(g, OP_SLICE, 1, &merged, 1, &name, oloc);
    ir_set_attr_int(g, s, "axis", g->val[merged].type.rank - 1);
    ir_set_attr_int(g, s, "start", glu ? i : off);
    ir_set_attr_int(g, s, "end", glu ? Ntot : off + Ns[i]);
    ir_set_attr_int(g, s, "step", glu ? 2 : 1);
    RETURN_IF_ERROR(ir_infer_node(g, s));
    ir_replace_all_uses(g, y, g->node[s].out[0]);
    /* the old weight goes if nothing else reads it */
    int *uses = ir_use_counts(g);
    if (!uses) return st_error(ST_NO_MEMORY, "out of memory");
    if (uses[wold] == 0) {
      g->val[wold].kind = VK_DEAD;
      g->val[wold].data = NULL;
    }
    free(uses);
    off += Ns[i];
  }
  pass_ctx_logf(ctx, "merge-matmuls: %d products of %s (K %lld) as one of N %lld%s: %s", n, g->val[a].name,
                (long long)K, (long long)Ntot, glu ? ", columns interleaved (gated pair)" : "", g->val[merged].name);
  return NULL;
}

smelt_status pass_merge_matmuls(Graph *g, PassCtx *ctx, bool *changed) {
  *changed = false;
  if (!ctx->target || !strstr(ctx->target, "cuda")) return NULL;
  int nnode = g->nnode; /* nodes added here are not candidates */
  bool *taken = calloc((size_t)(nnode ? nnode : 1), sizeof(bool));
  if (!taken) return st_error(ST_NO_MEMORY, "out of memory");
  smelt_status st = NULL;
  for (int i = 0; i < nnode && !st; i++) {
    int64_t K, N;
    if (taken[i] || !weight_of(g, &g->node[i], &K, &N)) continue;
    int ids[MERGE_MAX], n = 0;
    ids[n++] = i;
    for (int j = i + 1; j < nnode && n < MERGE_MAX; j++)
      if (!taken[j] && compatible(g, &g->node[i], &g->node[j])) ids[n++] = j;
    if (n < 2) continue;
    for (int k = 0; k < n; k++) taken[ids[k]] = true;
    st = merge(g, ctx, ids, n);
    *changed = true;
  }
  free(taken);
  return st;
}
