/* Unit tests of the fuse pass.
 *
 * check_group_invariants() states the contract between fuse and the code
 * generators (every live node in exactly one group, groups contiguous and in
 * topological order, and per kind which members a group may have and which
 * of their results may leave it); it runs on every example under two budgets
 * and on the small graphs built here.  Around it: the decisions that matter
 * (residual add + rms_norm in one reduction kernel, matmul + bias + gelu in
 * one contraction kernel, SwiGLU's mul joining one matmul with the other
 * computed first, injective ops kept out of epilogues, no producer pulled
 * into one of several consumers, no cycle between kernels), footprints
 * computed by hand against the model documented in passes/fuse.c, the
 * budget splitting groups exactly at the documented threshold, the explain
 * log, and that a fused graph computes bit for bit what the unfused one does
 * (fusion only reorders nodes).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "ir/interp.h"
#include "passes/passes.h"
#include "tests/unit/check.h"

/* ---- the invariants ---- */

static bool is_output(const Graph *g, int v) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return true;
  return false;
}

/* v is read by a node outside group k, or is a graph output. */
static bool leaves_group(const Graph *g, int v, int k) {
  if (is_output(g, v)) return true;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    if (n->dead || n->group == k) continue;
    for (int j = 0; j < n->nin; j++)
      if (n->in[j] == v) return true;
  }
  return false;
}

static bool same_dims(const TensorType *a, const TensorType *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

static bool elementwise_op(const Node *n) {
  FusionClass fc = ir_op_info(n->op)->fclass;
  return n->nout == 1 && (fc == FC_ELEMWISE || fc == FC_BROADCAST) && n->op != OP_EXPAND &&
         n->op != OP_BATCH_NORM;
}

static bool one_axis_reduction(const Graph *g, const Node *n) {
  int rank = g->val[n->in[0]].type.rank;
  switch (n->op) {
  case OP_SOFTMAX:
  case OP_LOG_SOFTMAX:
  case OP_LAYER_NORM:
  case OP_RMS_NORM: return true;
  case OP_SUM:
  case OP_MEAN:
  case OP_MAX:
  case OP_MIN: {
    const Attr *a = ir_attr(n, "axes");
    if (!a) return rank == 1;
    for (int i = 1; i < a->n; i++)
      if (ir_norm_axis(a->ints[i], rank) != ir_norm_axis(a->ints[0], rank)) return false;
    return a->n >= 1;
  }
  default: return false;
  }
}

/* The epilogue members[from..nm) form a chain on the result of member
 * from-1: each reads the previous one's result and nothing else of the
 * group; every member's result has the anchor result's shape. */
static int check_epilogue(const Graph *g, const Group *gr, int from, const TensorType *shape) {
  int bad = 0;
  for (int i = from; i < gr->nnodes; i++) {
    const Node *n = &g->node[gr->nodes[i]];
    int prev = g->node[gr->nodes[i - 1]].out[0];
    bool reads_prev = false;
    for (int j = 0; j < n->nin; j++) {
      int v = n->in[j];
      if (v == prev) reads_prev = true;
      else if (g->val[v].kind == VK_NODE && g->node[g->val[v].node].group == n->group) bad++;
    }
    if (!elementwise_op(n) || !reads_prev || !same_dims(&g->val[n->out[0]].type, shape)) bad++;
    if (i + 1 < gr->nnodes && leaves_group(g, n->out[0], n->group)) bad++;
  }
  return bad;
}

static void check_group_invariants(const Graph *g) {
  int failures = check_failures;
  CHECK(g->ngroups > 0 || g->nnode == 0);
  /* node.group is set, groups are contiguous and numbered in execution order */
  int expect = 0;
  for (int i = 0; i < g->nnode; i++) {
    const Node *n = &g->node[i];
    CHECK(!n->dead);
    CHECK(n->group >= 0 && n->group < g->ngroups);
    if (i > 0 && n->group != g->node[i - 1].group) expect++;
    CHECK(n->group == expect);
    /* topological: operands come from earlier nodes */
    for (int j = 0; j < n->nin; j++)
      if (g->val[n->in[j]].kind == VK_NODE) CHECK(g->val[n->in[j]].node < i);
  }
  CHECK(g->nnode == 0 || expect == g->ngroups - 1);

  int total = 0;
  for (int k = 0; k < g->ngroups; k++) {
    const Group *gr = &g->groups[k];
    total += gr->nnodes;
    CHECK(gr->nnodes >= 1);
    if (gr->nnodes < 1) continue;
    /* members listed in order, exactly the nodes marked with this group */
    for (int i = 0; i < gr->nnodes; i++) {
      CHECK(gr->nodes[i] >= 0 && gr->nodes[i] < g->nnode && g->node[gr->nodes[i]].group == k);
      if (i) CHECK(gr->nodes[i] == gr->nodes[i - 1] + 1);
    }
    int apos = -1;
    for (int i = 0; i < gr->nnodes; i++)
      if (gr->nodes[i] == gr->anchor) apos = i;
    CHECK(apos >= 0);
    if (apos < 0) continue;
    char want[16];
    snprintf(want, sizeof want, "k%02d_", k);
    CHECK(gr->kernel && strncmp(gr->kernel, want, strlen(want)) == 0);
    CHECK(gr->budget > 0 && gr->footprint >= 0);
    const Node *a = &g->node[gr->anchor];
    int ares = a->out[0];
    switch (gr->kind) {
    case GK_ELEMWISE:
      CHECK(apos == gr->nnodes - 1);
      for (int i = 0; i < gr->nnodes; i++) {
        const Node *n = &g->node[gr->nodes[i]];
        FusionClass fc = ir_op_info(n->op)->fclass;
        CHECK(n->nout == 1 && n->op != OP_SPLIT && n->op != OP_GATHER && n->op != OP_CONCAT);
        CHECK(fc == FC_ELEMWISE || fc == FC_BROADCAST || fc == FC_INJECTIVE);
        if (i + 1 < gr->nnodes) CHECK(!leaves_group(g, n->out[0], k));
      }
      break;
    case GK_REDUCTION: {
      CHECK(one_axis_reduction(g, a));
      const TensorType *x = &g->val[a->in[0]].type;
      for (int i = 0; i < apos; i++) { /* prologue: may leave, has the input's shape */
        const Node *n = &g->node[gr->nodes[i]];
        CHECK(elementwise_op(n) && same_dims(&g->val[n->out[0]].type, x));
      }
      if (apos > 0) CHECK(g->node[gr->nodes[apos - 1]].out[0] == a->in[0]);
      for (int j = 1; j < a->nin; j++) /* only the first input comes from the prologue */
        CHECK(g->val[a->in[j]].kind != VK_NODE || g->node[g->val[a->in[j]].node].group != k);
      if (apos + 1 < gr->nnodes) CHECK(!leaves_group(g, ares, k));
      CHECK(check_epilogue(g, gr, apos + 1, &g->val[ares].type) == 0);
      break;
    }
    case GK_CONTRACTION:
      CHECK(apos == 0 && (a->op == OP_MATMUL || a->op == OP_CONV2D));
      if (gr->nnodes > 1) CHECK(!leaves_group(g, ares, k));
      CHECK(check_epilogue(g, gr, 1, &g->val[ares].type) == 0);
      break;
    case GK_OPAQUE: CHECK(gr->nnodes == 1); break;
    }
  }
  CHECK(total == g->nnode);
  if (check_failures != failures) fprintf(stderr, "  ^ in graph %s\n", g->name);
}

/* ---- helpers ---- */

static Graph *load(const char *path) {
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, NULL, &g);
  if (st) {
    fprintf(stderr, "%s: %s\n", path, st_message(st));
    st_free(st);
    check_failures++;
    return NULL;
  }
  return g;
}

/* Runs the pipeline with this budget (0 = the machine's); the log goes to
 * *out_log when given (caller frees). */
static bool run(Graph *g, const char *passes, int64_t budget, bool explain, char **out_log) {
  PassCtx ctx = {.onchip_bytes = budget, .explain_fusion = explain};
  smelt_status st = pass_run_pipeline(g, &ctx, passes, NULL, NULL);
  bool ok = st == NULL;
  if (st) {
    fprintf(stderr, "%s: pipeline: %s\n", g->name, st_message(st));
    st_free(st);
    check_failures++;
  }
  if (out_log) {
    *out_log = ctx.log ? strdup(ctx.log) : strdup("");
  }
  pass_ctx_free(&ctx);
  return ok;
}

static const Group *group_of(const Graph *g, const char *value) {
  int v = ir_find_value(g, value);
  if (v < 0 || g->val[v].kind != VK_NODE) return NULL;
  int k = g->node[g->val[v].node].group;
  return k >= 0 && k < g->ngroups ? &g->groups[k] : NULL;
}

static int group_index(const Graph *g, const char *value) {
  const Group *gr = group_of(g, value);
  return gr ? (int)(gr - g->groups) : -1;
}

static bool same_group(const Graph *g, const char *a, const char *b) {
  const Group *x = group_of(g, a);
  return x && x == group_of(g, b);
}

static const char *anchor_name(const Graph *g, const Group *gr) { return ir_node_name(g, &g->node[gr->anchor]); }

static int add_node(Graph *g, Op op, int nin, const int *in, const char *name) {
  int id = ir_add_node(g, op, nin, in, 1, &name, (SrcLoc){0});
  ir_fill_default_attrs(g, id);
  CHECK_OK(ir_infer_node(g, id));
  return g->node[id].out[0];
}
static int op1(Graph *g, Op op, int a, const char *name) { return add_node(g, op, 1, &a, name); }
static int op2(Graph *g, Op op, int a, int b, const char *name) {
  int in[2] = {a, b};
  return add_node(g, op, 2, in, name);
}
static int input(Graph *g, const char *name, int rank, const int64_t *dims) {
  TensorType t = {.dt = DT_F32, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return ir_add_input(g, name, t, (SrcLoc){0});
}
static int param(Graph *g, const char *name, int rank, const int64_t *dims) {
  TensorType t = {.dt = DT_F32, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  return ir_add_const(g, name, t, NULL, (SrcLoc){0});
}

/* Runs both graphs on the same inputs; outputs must be bitwise equal. */
static void check_same_numbers(const Graph *a, const Graph *b) {
  Interp *ia = NULL, *ib = NULL;
  CHECK_OK(ir_interp_create(a, &ia));
  CHECK_OK(ir_interp_create(b, &ib));
  if (!ia || !ib) {
    ir_interp_destroy(ia);
    ir_interp_destroy(ib);
    return;
  }
  uint64_t s = 88172645463325252ull;
  for (int i = 0; i < a->ninputs; i++) {
    const TensorType *t = &a->val[a->inputs[i]].type;
    size_t n = (size_t)ir_type_numel(t);
    void *p = calloc(n ? n : 1, dt_size(t->dt));
    for (size_t k = 0; k < n; k++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      dt_store(t->dt, p, k, dt_is_float(t->dt) ? (double)(s >> 11) / 9007199254740992.0 * 2 - 1 : (double)(s & 7));
    }
    CHECK_OK(ir_interp_set_input(ia, a->inputs[i], p));
    CHECK_OK(ir_interp_set_input(ib, b->inputs[i], p));
    free(p);
  }
  CHECK_OK(ir_interp_run(ia));
  CHECK_OK(ir_interp_run(ib));
  for (int i = 0; i < a->noutputs; i++) {
    const void *da = ir_interp_value(ia, a->outputs[i]), *db = ir_interp_value(ib, b->outputs[i]);
    size_t bytes = ir_type_bytes(&a->val[a->outputs[i]].type);
    CHECK(da && db && memcmp(da, db, bytes) == 0);
  }
  ir_interp_destroy(ia);
  ir_interp_destroy(ib);
}

/* ---- the examples ---- */

static const char *const examples[] = {"examples/mlp.yaml", "examples/cnn.yaml", "examples/gpt2_block.yaml",
                                       "examples/tiny_llama.yaml"};

static void test_examples(void) {
  for (size_t e = 0; e < sizeof examples / sizeof examples[0]; e++) {
    Graph *g = load(examples[e]);
    if (!g) continue;
    /* everything but fusion first, so that the two graphs differ only by it */
    CHECK(run(g, "canonicalize,const-fold,simplify,cse,dce,fuse-attention", 0, false, NULL));
    int64_t budgets[] = {0, 1 << 20, 64};
    int ngroups[3] = {0};
    for (int b = 0; b < 3; b++) {
      Graph *f = ir_graph_clone(g);
      char *log = NULL;
      CHECK(run(f, "fuse,plan-memory", budgets[b], true, &log));
      check_group_invariants(f);
      check_same_numbers(g, f);
      ngroups[b] = f->ngroups;
      CHECK(strstr(log, "fuse: ") && !strchr(log, '\001')); /* every kernel name resolved */
      for (int k = 0; k < f->ngroups; k++) CHECK(f->groups[k].budget == (budgets[b] ? budgets[b] : f->groups[0].budget));
      if (budgets[b] == 64) {
        /* nothing of two nodes fits in 64 bytes */
        CHECK(strstr(log, "stopped: adding"));
        for (int k = 0; k < f->ngroups; k++) CHECK(f->groups[k].nnodes == 1);
      }
      free(log);
      ir_graph_destroy(f);
    }
    CHECK(ngroups[2] > ngroups[1]); /* the small budget splits groups */
    CHECK(ngroups[2] == g->nnode);
    ir_graph_destroy(g);
  }
}

/* The residual add and rms_norm of tiny_llama: one reduction kernel whose
 * prologue result also leaves it for the next residual add. */
static void test_tiny_llama(void) {
  Graph *g = load("examples/tiny_llama.yaml");
  if (!g) return;
  char *log = NULL;
  CHECK(run(g, NULL, 1 << 20, true, &log));
  check_group_invariants(g);
  const Group *gr = group_of(g, "layer.0/h2");
  CHECK(gr && gr->kind == GK_REDUCTION && gr->nnodes == 2);
  CHECK(gr && strcmp(anchor_name(g, gr), "layer.0/h2") == 0 && strcmp(gr->kernel + 4, "layer.0_h2") == 0);
  CHECK(same_group(g, "layer.0/x1", "layer.0/h2"));
  /* x1 leaves the kernel (layer.0/y adds it), so it has a place in memory */
  CHECK(g->val[ir_find_value(g, "layer.0/x1")].mem_offset >= 0);
  /* the layer's output add is the next layer's rms_norm prologue */
  CHECK(same_group(g, "layer.0/y", "layer.1/h"));
  CHECK(same_group(g, "layer.1/y", "y"));
  /* x1 does not go into o's epilogue: it waits for the reduction */
  CHECK(!same_group(g, "layer.0/o", "layer.0/x1"));
  CHECK(strstr(log, "fuse: layer.0/x1 (add) + layer.0/h2 (rms_norm): fused into k"));
  CHECK(strstr(log, "(reduction prologue), footprint 768 B <= budget 1048576 B"));
  CHECK(strstr(log, "layer.0/x1 is kept for the prologue of layer.0/h2 (rms_norm)"));
  CHECK(strstr(log, "fuse: layer.0/q (rope): not fusable into k"));
  CHECK(strstr(log, "(attention is opaque)"));
  /* SwiGLU: silu and the mul join the gate matmul; the up matmul, which the
   * mul also reads, runs before that kernel */
  CHECK(same_group(g, "layer.0/g0", "layer.0/g") && same_group(g, "layer.0/g", "layer.0/gu"));
  CHECK(!same_group(g, "layer.0/u", "layer.0/gu"));
  CHECK(group_index(g, "layer.0/u") < group_index(g, "layer.0/g0"));
  /* reshape/transpose/rope: one elementwise kernel, not the matmul's epilogue */
  const Group *q = group_of(g, "layer.0/q");
  CHECK(q && q->kind == GK_ELEMWISE && q->nnodes == 3 && same_group(g, "layer.0/q1", "layer.0/q"));
  CHECK(!same_group(g, "layer.0/q0", "layer.0/q1"));
  const Group *att = group_of(g, "layer.0/att");
  CHECK(att && att->kind == GK_OPAQUE);
  free(log);
  ir_graph_destroy(g);
}

/* mlp: matmul + bias + gelu in one contraction kernel, footprint by hand:
 * M=8, N=128, K=64: (8*64 + 64*128 + 8*128) * 4 = 38912 B, plus the bias, a
 * vector along N: 128 * 4 = 512 B. */
static void test_mlp(void) {
  Graph *g = load("examples/mlp.yaml");
  if (!g) return;
  CHECK(run(g, NULL, 1 << 20, false, NULL));
  check_group_invariants(g);
  const Group *gr = group_of(g, "h1");
  CHECK(gr && gr->kind == GK_CONTRACTION && gr->nnodes == 3);
  CHECK(same_group(g, "h1", "h1b") && same_group(g, "h1", "a1"));
  CHECK(gr && gr->footprint == 38912 + 512);
  CHECK(gr && strcmp(gr->kernel, "k00_h1") == 0);
  /* softmax over 10 classes alone: one row of 10 floats */
  const Group *sm = group_of(g, "y");
  CHECK(sm && sm->kind == GK_REDUCTION && sm->nnodes == 1 && sm->footprint == 40);
  ir_graph_destroy(g);
  /* one byte below the contraction's footprint with its epilogue: the bias
   * add stops fusion, and so gelu starts an elementwise group with it */
  g = load("examples/mlp.yaml");
  if (!g) return;
  char *log = NULL;
  CHECK(run(g, NULL, 38912 + 512 - 1, true, &log));
  check_group_invariants(g);
  CHECK(!same_group(g, "h1", "h1b") && same_group(g, "h1b", "a1"));
  CHECK(strstr(log, "fuse: stopped: adding h1b (add) to k00_h1 gives footprint 39424 B > budget 39423 B; "
                    "h1 goes to memory"));
  free(log);
  ir_graph_destroy(g);
}

/* ---- small graphs ---- */

/* An elementwise chain: a = exp(x); b = a + y over [4, 100]: the tile is a
 * row of 100 floats for each of x, y, a, b: 1600 B. */
static void test_elementwise_budget(void) {
  for (int fits = 0; fits < 2; fits++) {
    Graph *g = ir_graph_create("chain");
    int64_t d[2] = {4, 100};
    int x = input(g, "x", 2, d), y = input(g, "y", 2, d);
    int a = op1(g, OP_EXP, x, "a");
    int b = op2(g, OP_ADD, a, y, "b");
    ir_add_output(g, b);
    char *log = NULL;
    CHECK(run(g, "fuse", fits ? 1600 : 1599, true, &log));
    check_group_invariants(g);
    if (fits) {
      CHECK(g->ngroups == 1 && g->groups[0].footprint == 1600 && g->groups[0].kind == GK_ELEMWISE);
      CHECK(strcmp(g->groups[0].kernel, "k00_b") == 0 && g->groups[0].anchor == 1);
      CHECK(strstr(log, "fuse: a (exp) + b (add): fused into k00_b (elementwise), footprint 1600 B <= budget 1600 B"));
    } else {
      CHECK(g->ngroups == 2);
      CHECK(strstr(log, "fuse: stopped: adding b (add) to k00_a gives footprint 1600 B > budget 1599 B"));
    }
    free(log);
    ir_graph_destroy(g);
  }
}

/* A value read by two consumers is not pulled into either; two chains that
 * meet in one node merge into one group. */
static void test_shared_producer_and_merge(void) {
  Graph *g = ir_graph_create("shared");
  int64_t d[2] = {4, 8};
  int x = input(g, "x", 2, d);
  int a = op1(g, OP_EXP, x, "a");
  int b = op1(g, OP_NEG, a, "b");
  int c = op1(g, OP_RELU, a, "c");
  int e = op2(g, OP_MUL, b, c, "e");
  ir_add_output(g, e);
  char *log = NULL;
  CHECK(run(g, "fuse", 1 << 20, true, &log));
  check_group_invariants(g);
  (void)e;
  CHECK(g->ngroups == 2);
  CHECK(!same_group(g, "a", "b") && !same_group(g, "a", "c"));
  CHECK(same_group(g, "b", "e") && same_group(g, "c", "e"));
  CHECK(strstr(log, "not fusable into") && strstr(log, "(a is also used by"));
  free(log);
  ir_graph_destroy(g);
}

/* The residual pattern with a second reader of the prologue value: x1 is
 * the prologue of rms_norm and also read by z = exp(x1); n = h + z may not
 * join the reduction (z's kernel needs x1 from it: a cycle), so it merges
 * with z's group instead. */
static void test_no_cycle(void) {
  Graph *g = ir_graph_create("cycle");
  int64_t d[2] = {4, 16}, dg[1] = {16};
  int x = input(g, "x", 2, d), o = input(g, "o", 2, d), gamma = param(g, "gamma", 1, dg);
  int x1 = op2(g, OP_ADD, x, o, "x1");
  int h = op2(g, OP_RMS_NORM, x1, gamma, "h");
  int z = op1(g, OP_EXP, x1, "z");
  int n = op2(g, OP_ADD, h, z, "n");
  ir_add_output(g, n);
  char *log = NULL;
  CHECK(run(g, "fuse,plan-memory", 1 << 20, true, &log));
  check_group_invariants(g);
  CHECK(same_group(g, "x1", "h") && group_of(g, "h")->kind == GK_REDUCTION);
  CHECK(same_group(g, "z", "n") && !same_group(g, "h", "n"));
  CHECK(strstr(log, "the kernels would depend on each other in a cycle"));
  /* reduction footprint: D = 16, row buffer + escaping x1 + gamma = 3 rows */
  CHECK(group_of(g, "h")->footprint == 16 * 4 * 3);
  /* h and x1 both leave the reduction kernel */
  CHECK(g->val[x1].mem_offset >= 0 && g->val[h].mem_offset >= 0);
  CHECK(g->val[x1].mem_offset != g->val[h].mem_offset);
  (void)z;
  free(log);
  ir_graph_destroy(g);
}

/* softmax with an epilogue, and a reduction over two axes that stays
 * alone; a matmul whose result is a graph output takes no epilogue. */
static void test_reduction_kinds(void) {
  Graph *g = ir_graph_create("reductions");
  int64_t d[2] = {4, 16}, dw[2] = {16, 16};
  int x = input(g, "x", 2, d), w = param(g, "w", 2, dw);
  int m = op2(g, OP_MATMUL, x, w, "m");
  int s = op1(g, OP_SOFTMAX, m, "s");
  int t = op1(g, OP_EXP, s, "t");
  int r = op1(g, OP_SUM, t, "r"); /* no axes: every axis, so opaque */
  int e = op1(g, OP_NEG, m, "e");
  ir_add_output(g, r);
  ir_add_output(g, m);
  ir_add_output(g, e);
  CHECK(run(g, "fuse", 1 << 20, false, NULL));
  check_group_invariants(g);
  CHECK(same_group(g, "s", "t") && group_of(g, "s")->kind == GK_REDUCTION);
  CHECK(group_of(g, "r")->kind == GK_OPAQUE);
  CHECK(!same_group(g, "m", "s") && !same_group(g, "m", "e")); /* m is an output */
  CHECK(group_of(g, "m")->nnodes == 1);
  (void)s, (void)t, (void)e;
  ir_graph_destroy(g);
}

/* ---- random graphs ---- */

static uint64_t rnd_state;
static int rnd(int n) {
  rnd_state ^= rnd_state << 13, rnd_state ^= rnd_state >> 7, rnd_state ^= rnd_state << 17;
  return (int)(rnd_state % (uint64_t)n);
}

static int node_attr(Graph *g, Op op, int nin, const int *in, const char *name, const char *attr, const int64_t *ints,
                     int nints) {
  int id = ir_add_node(g, op, nin, in, 1, &name, (SrcLoc){0});
  if (attr) ir_set_attr_ints(g, id, attr, ints, nints);
  ir_fill_default_attrs(g, id);
  CHECK_OK(ir_infer_node(g, id));
  return g->node[id].out[0];
}

static int random_param(Graph *g, const char *name, int rank, const int64_t *dims) {
  TensorType t = {.dt = DT_F32, .rank = rank};
  for (int i = 0; i < rank; i++) t.dim[i] = dims[i];
  float data[64];
  for (int i = 0; i < 64; i++) data[i] = (float)(rnd(2001) - 1000) / 2000.0f;
  return ir_add_const(g, name, t, data, (SrcLoc){0});
}

/* A DAG of 10 to 40 ops over [4, 8] values: elementwise ops, norms,
 * softmax, matmul, transposes, a row sum broadcast back: every kind of
 * group and every way of meeting (values read by several ops, chains that
 * meet, prologue values read again). */
static Graph *random_graph(void) {
  Graph *g = ir_graph_create("random");
  int64_t d[2] = {4, 8}, dw[2] = {8, 8}, dg[1] = {8}, perm[2] = {1, 0}, axes[1] = {1};
  int pool[256], np = 0;
  pool[np++] = input(g, "x0", 2, d);
  pool[np++] = input(g, "x1", 2, d);
  int w = random_param(g, "w", 2, dw), gamma = random_param(g, "gamma", 1, dg);
  int nn = 10 + rnd(31);
  static const Op unary[] = {OP_TANH, OP_NEG, OP_RELU, OP_SIGMOID};
  for (int i = 0; i < nn; i++) {
    char name[16], name2[20];
    snprintf(name, sizeof name, "v%d", i);
    snprintf(name2, sizeof name2, "v%d_0", i);
    /* mostly recent values, so that chains form */
    int a = pool[np - 1 - rnd(np < 4 ? np : 4)], b = pool[rnd(np)];
    int in2[2] = {a, b}, out;
    switch (rnd(9)) {
    case 0: out = op1(g, unary[rnd(4)], a, name); break;
    case 1: out = op2(g, OP_ADD, a, b, name); break;
    case 2: out = op2(g, OP_MUL, a, b, name); break;
    case 3: out = op2(g, OP_RMS_NORM, a, gamma, name); break;
    case 4: out = op1(g, OP_SOFTMAX, a, name); break;
    case 5: out = op2(g, OP_MATMUL, a, w, name); break;
    case 6: {
      int t = node_attr(g, OP_TRANSPOSE, 1, &a, name2, "perm", perm, 2);
      out = node_attr(g, OP_TRANSPOSE, 1, &t, name, "perm", perm, 2);
      break;
    }
    case 7: {
      int sm = node_attr(g, OP_SUM, 1, &a, name2, "axes", axes, 1);
      ir_set_attr_bool(g, g->val[sm].node, "keepdims", true);
      CHECK_OK(ir_infer_node(g, g->val[sm].node));
      out = op2(g, OP_ADD, b, sm, name);
      break;
    }
    default: out = op2(g, OP_LAYER_NORM, a, gamma, name); break;
    }
    (void)in2;
    pool[np++] = out;
  }
  ir_add_output(g, pool[np - 1]);
  int other = pool[2 + rnd(np - 2)];
  if (other != pool[np - 1]) ir_add_output(g, other);
  return g;
}

static void test_random_graphs(void) {
  static const int64_t budgets[] = {64, 200, 512, 2048, 1 << 20};
  int groups = 0, nodes = 0;
  for (int seed = 1; seed <= 300; seed++) {
    rnd_state = 0x9e3779b97f4a7c15ull * (uint64_t)seed;
    Graph *g = random_graph();
    CHECK(run(g, "dce", 0, false, NULL));
    Graph *f = ir_graph_clone(g);
    char *log = NULL;
    int failures = check_failures;
    CHECK(run(f, "fuse,plan-memory", budgets[rnd(5)], true, &log));
    check_group_invariants(f);
    check_same_numbers(g, f);
    CHECK(!strchr(log, '\001'));
    if (check_failures != failures) fprintf(stderr, "  ^ random graph, seed %d\n", seed);
    groups += f->ngroups;
    nodes += f->nnode;
    free(log);
    ir_graph_destroy(f);
    ir_graph_destroy(g);
  }
  CHECK(groups < nodes); /* fusion did happen */
}

/* Running fuse twice changes nothing the second time. */
static void test_idempotent(void) {
  Graph *g = load("examples/tiny_llama.yaml");
  if (!g) return;
  CHECK(run(g, NULL, 1 << 20, false, NULL));
  char *before = ir_print_str(g);
  PassCtx ctx = {.onchip_bytes = 1 << 20};
  bool changed = true;
  CHECK_OK(pass_fuse(g, &ctx, &changed));
  CHECK(!changed);
  char *after = ir_print_str(g);
  CHECK(before && after && strcmp(before, after) == 0); /* the memory plan stays too */
  /* a different budget regroups, and the stale memory plan goes */
  ctx.onchip_bytes = 64;
  CHECK_OK(pass_fuse(g, &ctx, &changed));
  CHECK(changed && g->arena_bytes == 0);
  for (int v = 0; v < g->nval; v++) CHECK(g->val[v].mem_offset == -1);
  check_group_invariants(g);
  pass_ctx_free(&ctx);
  free(before);
  free(after);
  ir_graph_destroy(g);
}

/* A chain of cheap unary ops fits any byte budget, yet a group stops at 32
 * nodes (code size: NVRTC's time grows faster than the kernel; issue 16 #7),
 * and the explain log names the cap. */
static void test_node_cap(void) {
  Graph *g = ir_graph_create("long_chain");
  int64_t d[1] = {4};
  int v = input(g, "x", 1, d);
  char name[16];
  for (int i = 0; i < 70; i++) {
    snprintf(name, sizeof name, "v%d", i);
    v = op1(g, i % 2 ? OP_NEG : OP_EXP, v, arena_strdup(&g->arena, name));
  }
  ir_add_output(g, v);
  char *log = NULL;
  CHECK(run(g, "fuse", 0, true, &log));
  check_group_invariants(g);
  CHECK(g->ngroups == 3);
  for (int k = 0; k < g->ngroups; k++) CHECK(g->groups[k].nnodes == (k < 2 ? 32 : 6));
  CHECK(strstr(log, "fuse: stopped: adding v32 (exp) to k00_v31 gives 33 nodes > cap 32 nodes a kernel (code size); "
                    "v31 goes to memory"));
  CHECK(strstr(log, "at most 32 nodes a kernel"));
  free(log);
  ir_graph_destroy(g);
}

int main(void) {
  test_node_cap();
  test_examples();
  test_tiny_llama();
  test_mlp();
  test_elementwise_budget();
  test_shared_producer_and_merge();
  test_no_cycle();
  test_reduction_kinds();
  test_idempotent();
  test_random_graphs();
  return check_done("test_fuse");
}
