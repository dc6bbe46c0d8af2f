/* Unit tests of the plan-memory pass.
 *
 * check_plan() recomputes, independently of the pass, which values live
 * between kernels and for which steps, and checks the plan against that:
 * every intermediate has an offset and nothing else has one, offsets are
 * 64-byte aligned and inside the arena, no two intermediates whose lifetimes
 * overlap share a byte (except an in-place pair: an elementwise kernel's
 * output over an input whose last reader it is, same size, same offset),
 * and unplanned_bytes is the sum of the intermediates.  It runs on every
 * example after the default pipeline, with and without fusion, on random
 * DAGs, and on small chains whose plan is worked out by hand below.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/unit/check.h"

/* step of every node: one per group, or one per node outside groups */
static int *steps_of(const Graph *g) {
  int *step = malloc(sizeof(int) * ((size_t)g->nnode + 1));
  int s = -1;
  for (int i = 0; i < g->nnode; i++) {
    int k = g->node[i].group;
    if (k < 0 || i == 0 || k != g->node[i - 1].group) s++;
    step[i] = s;
  }
  return step;
}

static bool is_output(const Graph *g, int v) {
  for (int i = 0; i < g->noutputs; i++)
    if (g->outputs[i] == v) return true;
  return false;
}

/* Lifetime of v as an intermediate: *first, *last (steps); false if v is
 * not one. */
static bool lifetime(const Graph *g, const int *step, int v, int *first, int *last) {
  if (g->val[v].kind != VK_NODE || is_output(g, v)) return false;
  int s = step[g->val[v].node], l = -1;
  for (int i = 0; i < g->nnode; i++)
    for (int j = 0; j < g->node[i].nin; j++)
      if (g->node[i].in[j] == v && step[i] != s && step[i] > l) l = step[i];
  *first = s;
  *last = l;
  return l >= 0;
}

static bool positionwise(const Node *n) {
  FusionClass fc = ir_op_info(n->op)->fclass;
  return n->nout == 1 && (fc == FC_ELEMWISE || fc == FC_BROADCAST) && n->op != OP_EXPAND && n->op != OP_BATCH_NORM;
}

/* The kernel that produces v reads every input only at the positions it
 * writes: an elementwise group without injective members, or such a node
 * on its own. */
static bool may_write_in_place(const Graph *g, int v) {
  const Node *n = &g->node[g->val[v].node];
  if (n->group < 0) return positionwise(n);
  const Group *gr = &g->groups[n->group];
  if (gr->kind != GK_ELEMWISE) return false;
  for (int i = 0; i < gr->nnodes; i++)
    if (!positionwise(&g->node[gr->nodes[i]])) return false;
  return true;
}

/* Fills the counts of intermediates and in-place pairs; checks the plan. */
static void check_plan(const Graph *g, int *out_n, int *out_inplace) {
  int failures = check_failures;
  int *step = steps_of(g);
  int64_t sum = 0;
  int n = 0, inplace = 0;
  for (int v = 0; v < g->nval; v++) {
    int f, l;
    bool inter = lifetime(g, step, v, &f, &l);
    const Value *x = &g->val[v];
    if (!inter) {
      CHECK(x->mem_offset == -1);
      continue;
    }
    n++;
    int64_t bytes = (int64_t)ir_type_bytes(&x->type);
    sum += bytes;
    CHECK(x->mem_offset >= 0 && x->mem_offset % 64 == 0);
    CHECK(x->mem_offset + bytes <= g->arena_bytes);
    for (int w = 0; w < v; w++) {
      int f2, l2;
      if (!lifetime(g, step, w, &f2, &l2)) continue;
      if (f > l2 || f2 > l) continue; /* never alive together */
      int64_t b2 = (int64_t)ir_type_bytes(&g->val[w].type), o1 = x->mem_offset, o2 = g->val[w].mem_offset;
      if (o1 + bytes <= o2 || o2 + b2 <= o1) continue; /* apart */
      /* the one allowed overlap: written in place at the step where the
       * other dies, same offset and size */
      const TensorType *t1 = &x->type, *t2 = &g->val[w].type;
      bool same_shape = t1->rank == t2->rank && !memcmp(t1->dim, t2->dim, sizeof(int64_t) * (size_t)t1->rank);
      bool pair = o1 == o2 && bytes == b2 && same_shape &&
                  ((l2 == f && f2 < f && may_write_in_place(g, v)) || (l == f2 && f < f2 && may_write_in_place(g, w)));
      CHECK(pair);
      if (!pair)
        fprintf(stderr, "  %s [%d,%d] @%lld and %s [%d,%d] @%lld overlap\n", x->name, f, l, (long long)o1,
                g->val[w].name, f2, l2, (long long)o2);
      inplace += pair;
    }
  }
  CHECK(g->unplanned_bytes == sum);
  if (check_failures != failures) fprintf(stderr, "  ^ in graph %s\n", g->name);
  free(step);
  if (out_n) *out_n = n;
  if (out_inplace) *out_inplace = inplace;
}

static Graph *load(const char *path) {
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, NULL, &g);
  if (st) {
    fprintf(stderr, "%s: %s\n", path, st_message(st));
    st_free(st);
    check_failures++;
  }
  return g;
}

static char *run(Graph *g, const char *passes) {
  PassCtx ctx = {.onchip_bytes = 1 << 20};
  CHECK_OK(pass_run_pipeline(g, &ctx, passes, NULL, NULL));
  char *log = strdup(ctx.log ? ctx.log : "");
  pass_ctx_free(&ctx);
  return log;
}

static void test_examples(void) {
  const char *examples[] = {"examples/mlp.yaml", "examples/cnn.yaml", "examples/gpt2_block.yaml",
                            "examples/tiny_llama.yaml"};
  const char *pipelines[] = {NULL, "canonicalize,const-fold,simplify,cse,dce,fuse-attention,plan-memory"};
  for (int e = 0; e < 4; e++)
    for (int p = 0; p < 2; p++) {
      Graph *g = load(examples[e]);
      if (!g) continue;
      free(run(g, pipelines[p]));
      int n = 0;
      check_plan(g, &n, NULL);
      CHECK(n > 0 && g->arena_bytes > 0 && g->arena_bytes <= g->unplanned_bytes);
      if (strstr(examples[e], "tiny_llama")) CHECK(g->arena_bytes < g->unplanned_bytes / 2);
      ir_graph_destroy(g);
    }
}

/* ---- chains worked out by hand ---- */

static int add_node(Graph *g, Op op, int in, const char *name) {
  int id = ir_add_node(g, op, 1, &in, 1, &name, (SrcLoc){0});
  return id;
}

static int finish(Graph *g, int id) {
  ir_fill_default_attrs(g, id);
  CHECK_OK(ir_infer_node(g, id));
  return g->node[id].out[0];
}

static int transpose(Graph *g, int in, const char *name) {
  int id = add_node(g, OP_TRANSPOSE, in, name);
  int64_t perm[2] = {1, 0};
  ir_set_attr_ints(g, id, "perm", perm, 2);
  return finish(g, id);
}

static int unary(Graph *g, Op op, int in, const char *name) { return finish(g, add_node(g, op, in, name)); }

static int input16(Graph *g) {
  TensorType t = {.dt = DT_F32, .rank = 2, .dim = {16, 16}}; /* 1 KiB */
  return ir_add_input(g, "x", t, (SrcLoc){0});
}

/* x -> a -> b -> c -> d (output) with transposes, each its own kernel (no
 * fuse): a [0,1], b [1,2], c [2,3], 1 KiB each.  Largest first, ties by
 * first step: a at 0; b meets a at step 1, so 1024; c meets b only: the gap
 * at 0 fits.  Arena 2048 of 3072. */
static void test_chain(void) {
  Graph *g = ir_graph_create("chain");
  int x = input16(g);
  int a = transpose(g, x, "a"), b = transpose(g, a, "b"), c = transpose(g, b, "c"), d = transpose(g, c, "d");
  ir_add_output(g, d);
  char *log = run(g, "plan-memory");
  check_plan(g, NULL, NULL);
  CHECK(g->val[a].mem_offset == 0 && g->val[b].mem_offset == 1024 && g->val[c].mem_offset == 0);
  CHECK(g->val[d].mem_offset == -1 && g->val[x].mem_offset == -1);
  CHECK(g->arena_bytes == 2048 && g->unplanned_bytes == 3072);
  CHECK(strstr(log, "plan-memory: 3 intermediates between 4 kernels, 3072 B without sharing, arena 2048 B"));
  free(log);
  ir_graph_destroy(g);
}

/* The same chain with elementwise ops: each writes over its input, which
 * dies there, so a, b and c share one buffer. */
static void test_in_place(void) {
  Graph *g = ir_graph_create("inplace");
  int x = input16(g);
  int a = unary(g, OP_EXP, x, "a"), b = unary(g, OP_NEG, a, "b"), c = unary(g, OP_RELU, b, "c");
  int d = unary(g, OP_SQRT, c, "d");
  ir_add_output(g, d);
  char *log = run(g, "plan-memory");
  int inplace = 0;
  check_plan(g, NULL, &inplace);
  CHECK(g->val[a].mem_offset == 0 && g->val[b].mem_offset == 0 && g->val[c].mem_offset == 0);
  CHECK(g->arena_bytes == 1024 && g->unplanned_bytes == 3072 && inplace == 2);
  CHECK(strstr(log, "plan-memory: b is written in place over a, which b (neg) reads last"));
  CHECK(strstr(log, "2 written in place"));
  free(log);
  ir_graph_destroy(g);

  /* an input read again later is not overwritten: b = -a runs while e =
   * |a| still has to read a, so b gets a place of its own; e is a's last
   * reader and takes its place.  {a, e} [0,3] at 0, b [1,3] at 1024. */
  g = ir_graph_create("inplace_blocked");
  x = input16(g);
  a = unary(g, OP_EXP, x, "a");
  b = unary(g, OP_NEG, a, "b");
  int e = unary(g, OP_ABS, a, "e");
  int in2[2] = {b, e};
  const char *fn = "f";
  int fid = ir_add_node(g, OP_ADD, 2, in2, 1, &fn, (SrcLoc){0});
  ir_add_output(g, finish(g, fid));
  log = run(g, "plan-memory");
  check_plan(g, NULL, &inplace);
  CHECK(inplace == 1 && g->val[a].mem_offset == 0 && g->val[e].mem_offset == 0 && g->val[b].mem_offset == 1024);
  CHECK(g->arena_bytes == 2048 && g->unplanned_bytes == 3072);
  CHECK(strstr(log, "plan-memory: e is written in place over a, which e (abs) reads last") &&
        !strstr(log, "over b"));
  free(log);
  ir_graph_destroy(g);
}

/* Tiny tensors still start on 64-byte boundaries: a [0,1] at 0, b [1,2]
 * meets it, so at 64; the arena ends after b's 8 bytes. */
static void test_alignment(void) {
  Graph *g = ir_graph_create("align");
  TensorType t = {.dt = DT_F32, .rank = 2, .dim = {1, 2}};
  int x = ir_add_input(g, "x", t, (SrcLoc){0});
  int a = transpose(g, x, "a"), b = transpose(g, a, "b"), c = transpose(g, b, "c");
  ir_add_output(g, c);
  free(run(g, "plan-memory"));
  check_plan(g, NULL, NULL);
  CHECK(g->val[a].mem_offset == 0 && g->val[b].mem_offset == 64);
  CHECK(g->arena_bytes == 72 && g->unplanned_bytes == 16);
  ir_graph_destroy(g);
}

/* With fusion, values inside a kernel have no place in memory: the chain
 * of elementwise ops is one kernel and nothing lives between kernels. */
static void test_fused_chain(void) {
  Graph *g = ir_graph_create("fused");
  int x = input16(g);
  int a = unary(g, OP_EXP, x, "a"), b = unary(g, OP_NEG, a, "b");
  ir_add_output(g, b);
  char *log = run(g, "fuse,plan-memory");
  check_plan(g, NULL, NULL);
  CHECK(g->ngroups == 1 && g->val[a].mem_offset == -1 && g->arena_bytes == 0 && g->unplanned_bytes == 0);
  CHECK(strstr(log, "plan-memory: no intermediates between 1 kernel; no arena"));
  /* planning again changes nothing */
  PassCtx ctx = {0};
  bool changed = true;
  CHECK_OK(pass_plan_memory(g, &ctx, &changed));
  CHECK(!changed);
  pass_ctx_free(&ctx);
  free(log);
  ir_graph_destroy(g);
}

/* Random DAGs of elementwise ops, transposes and matmuls over [8, 8]
 * values, planned with and without fusion: check_plan must hold for every
 * one, and in-place writes must happen in some. */
static uint64_t rnd_state;
static int rnd(int n) {
  rnd_state ^= rnd_state << 13, rnd_state ^= rnd_state >> 7, rnd_state ^= rnd_state << 17;
  return (int)(rnd_state % (uint64_t)n);
}

static void test_random(void) {
  int inplace_total = 0;
  for (int seed = 1; seed <= 200; seed++) {
    rnd_state = 0x2545f4914f6cdd1dull * (uint64_t)seed;
    Graph *g = ir_graph_create("random");
    TensorType t8 = {.dt = DT_F32, .rank = 2, .dim = {8, 8}};
    int pool[128], np = 0;
    pool[np++] = ir_add_input(g, "x", t8, (SrcLoc){0});
    int w = ir_add_const(g, "w", t8, NULL, (SrcLoc){0});
    int nn = 5 + rnd(40);
    for (int i = 0; i < nn; i++) {
      char name[16];
      snprintf(name, sizeof name, "v%d", i);
      int a = pool[np - 1 - rnd(np < 3 ? np : 3)], b = pool[rnd(np)];
      int in2[2] = {a, b};
      const char *nm = name;
      switch (rnd(5)) {
      case 0: pool[np++] = unary(g, rnd(2) ? OP_NEG : OP_RELU, a, name); break;
      case 1: pool[np++] = finish(g, ir_add_node(g, OP_ADD, 2, in2, 1, &nm, (SrcLoc){0})); break;
      case 2: pool[np++] = transpose(g, a, name); break;
      case 3:
        in2[1] = w;
        pool[np++] = finish(g, ir_add_node(g, OP_MATMUL, 2, in2, 1, &nm, (SrcLoc){0}));
        break;
      default: pool[np++] = unary(g, OP_ABS, a, name); break;
      }
    }
    ir_add_output(g, pool[np - 1]);
    if (rnd(2)) ir_add_output(g, pool[1 + rnd(np - 1)]);
    free(run(g, "dce"));
    Graph *f = ir_graph_clone(g);
    free(run(g, "plan-memory"));
    free(run(f, "fuse,plan-memory"));
    int failures = check_failures, ip1 = 0, ip2 = 0;
    check_plan(g, NULL, &ip1);
    check_plan(f, NULL, &ip2);
    inplace_total += ip1 + ip2;
    if (check_failures != failures) fprintf(stderr, "  ^ random graph, seed %d\n", seed);
    ir_graph_destroy(f);
    ir_graph_destroy(g);
  }
  CHECK(inplace_total > 0);
}

int main(void) {
  test_examples();
  test_chain();
  test_in_place();
  test_alignment();
  test_fused_chain();
  test_random();
  return check_done("test_plan_memory");
}
