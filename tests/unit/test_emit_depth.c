/* Emission depth (issue 16, finding 1): a fused group whose expression is
 * N members deep must not need N C stack frames in the emitters.
 *
 * The fuser caps a group at 32 nodes (passes/fuse.c), so `smelt compile`
 * no longer builds such a group; the groups are formed by hand here, as in
 * test_llvm_groups.c, so that the emitters themselves are tested: a chain
 * of DEPTH (4000) unary ops on a [4] input (neg, abs, relu, sin, ... in turn, as
 * in the finding) in ONE elementwise group.  Each backend runs on a thread
 * whose stack is SMALL_STACK bytes; the emitters used one C frame or more
 * per member (hundreds of bytes each), which overflowed it.
 *   - CPU: compiled with LLVM, run through the JIT and compared with the
 *     interpreter (tests/unit/test_llvm_harness.h).
 *   - CUDA: the source is generated (no NVRTC needed) and must hold the
 *     chain: one statement per member, the input loaded, the result stored.
 * A second chain mixes the other ways an operand is reached (binary ops
 * with a broadcast operand, transpose, reshape, slice, concat, where,
 * gather) at depth MIXED (300 steps), also checked against the interpreter.
 */
#include <pthread.h>

#include "codegen/cuda/cg_cuda.h"
#include "tests/unit/test_llvm_harness.h"

#ifdef SMELT_HAVE_LLVM

#ifndef DEPTH
#define DEPTH 4000
#endif
/* the mixed chain: its transposes and reshapes give each value up to 16
 * coordinate vectors, and the memo is searched linearly */
#define MIXED 300
#define SMALL_STACK (512 << 10) /* LLVM's own passes need some; 1/16 of a default main stack */

#define D(...) ((const int64_t[]){__VA_ARGS__})

static const Op chain_ops[] = {OP_NEG, OP_ABS, OP_RELU, OP_SIN, OP_COS, OP_TANH, OP_SIGMOID, OP_NEG};
/* the CPU chain uses cheap ops: thousands of inlined sin/tanh polynomials
 * only lengthen the compile */
static const Op cheap_ops[] = {OP_NEG, OP_ABS, OP_RELU, OP_NEG, OP_ABS, OP_NEG, OP_RELU, OP_NEG};

/* x [4] -> DEPTH unary ops, all in one elementwise group */
static void build_chain(TG *t, const Op *ops) {
  int v = tg_input(t, "x", DT_F32, 1, D(4), DOM_ANY, 0);
  char name[32];
  for (int i = 0; i < DEPTH; i++) {
    snprintf(name, sizeof name, "v%d", i);
    v = tg_val(t, tg_node(t, ops[i % 8], 1, &v, name));
  }
  ir_add_output(t->g, v);
}

/* x [4, 4] -> MIXED steps, each one of: + b (b a [4] constant, broadcast), a
 * transpose, a reshape to [16] and back, a slice of rows 2..6 of a concat
 * of v and a constant w (axis 0; not v with itself: the CUDA emitter
 * computes each concat operand in its own branch, so a chain of
 * concat(v, v) costs 2^depth), where(v > 0, v, -v), a gather of v's rows by
 * a constant permutation; then sin to keep values bounded. */
static void build_mixed(TG *t) {
  int v = tg_input(t, "x", DT_F32, 2, D(4, 4), DOM_ANY, 0);
  int b = tg_const(t, "b", DT_F32, 1, D(4), DOM_ANY);
  int w = tg_const(t, "w", DT_F32, 2, D(4, 4), DOM_ANY);
  int64_t perm_rows[4] = {2, 0, 3, 1};
  int idx = ir_add_const(t->g, "perm_rows", tt(DT_I64, 1, D(4)), perm_rows, here);
  int zero = ir_add_const(t->g, "zero", tt(DT_F32, 0, D(0)), (float[]){0.0f}, here);
  char name[48];
  for (int i = 0; i < MIXED; i++) {
    int n;
    snprintf(name, sizeof name, "m%d", i);
    switch (i % 7) {
    case 0: n = tg_node(t, OP_ADD, 2, (int[]){v, b}, name); break;
    case 1:
      n = tg_node(t, OP_TRANSPOSE, 1, &v, name);
      ir_set_attr_ints(t->g, n, "perm", D(1, 0), 2);
      break;
    case 2: {
      snprintf(name, sizeof name, "m%d_flat", i);
      n = tg_node(t, OP_RESHAPE, 1, &v, name);
      ir_set_attr_ints(t->g, n, "shape", D(16), 1);
      int fl = tg_val(t, n);
      snprintf(name, sizeof name, "m%d", i);
      n = tg_node(t, OP_RESHAPE, 1, &fl, name);
      ir_set_attr_ints(t->g, n, "shape", D(4, 4), 2);
      break;
    }
    case 3: {
      snprintf(name, sizeof name, "m%d_cat", i);
      n = tg_node(t, OP_CONCAT, 2, (int[]){v, w}, name);
      ir_set_attr_int(t->g, n, "axis", 0);
      int cat = tg_val(t, n);
      snprintf(name, sizeof name, "m%d", i);
      n = tg_node(t, OP_SLICE, 1, &cat, name);
      ir_set_attr_int(t->g, n, "axis", 0);
      ir_set_attr_int(t->g, n, "start", 2);
      ir_set_attr_int(t->g, n, "end", 6);
      break;
    }
    case 4: {
      snprintf(name, sizeof name, "m%d_pos", i);
      int pos = tg_val(t, tg_node(t, OP_GREATER, 2, (int[]){v, zero}, name));
      snprintf(name, sizeof name, "m%d_neg", i);
      int neg = tg_val(t, tg_node(t, OP_NEG, 1, &v, name));
      snprintf(name, sizeof name, "m%d", i);
      n = tg_node(t, OP_WHERE, 3, (int[]){pos, v, neg}, name);
      break;
    }
    case 5:
      n = tg_node(t, OP_GATHER, 2, (int[]){v, idx}, name);
      ir_set_attr_int(t->g, n, "axis", 0);
      break;
    default: n = tg_node(t, OP_SIN, 1, &v, name); break;
    }
    v = tg_val(t, n);
  }
  ir_add_output(t->g, v);
}

static void group_all(TG *t) {
  int n = t->g->nnode;
  int *nodes = malloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) nodes[i] = i;
  tg_group(t, GK_ELEMWISE, nodes, n, -1);
  free(nodes);
}

/* unoptimised: a shorter compile; the emitters are what is tested */
static const RunOpts R = {.tol32 = 1e-5, .tol16 = 2e-3, .no_opt = true};

static void *cpu_chain(void *arg) {
  (void)arg;
  TG t;
  tg_init(&t, "unary chain DEPTH deep (cpu)", 71);
  build_chain(&t, cheap_ops);
  group_all(&t);
  CHECK(tg_run(&t, &R));
  TG u;
  tg_init(&u, "mixed chain 300 deep (cpu)", 72);
  build_mixed(&u);
  group_all(&u);
  CHECK(tg_run(&u, &R));
  return NULL;
}

/* occurrences of s in text */
static int count(const char *text, const char *s) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, s)); p += strlen(s)) n++;
  return n;
}

static void cuda_one(TG *t, const char *what, int want_members) {
  Graph *g = t->g;
  for (int i = 0; i < g->nnode; i++) {
    ir_fill_default_attrs(g, i);
    CHECK_OK(ir_infer_node(g, i));
  }
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CHECK(nk == 1);
  CgCudaOptions opt = {0};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, nk, &opt, &m);
  if (st) {
    fprintf(stderr, "%s: cg_cuda_generate: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
  } else {
    CHECK(m->nunits >= 1);
    const char *src = m->units[0];
    /* every member's result is a temporary commented with its YAML name
     * and op, "// v12 (neg)" (codegen/cuda/emit.c decl) */
    int members = 0;
    static const char *const names[] = {" (neg)", " (abs)", " (relu)", " (sin)", " (cos)", " (tanh)", " (sigmoid)",
                                        " (add)", " (where)", " (greater)"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) members += count(src, names[i]);
    if (members < want_members) fprintf(stderr, "%s: %d of %d members in the source\n", what, members, want_members);
    CHECK(members >= want_members);
    CHECK(count(src, "// x") >= 1);
    fmt_cuda_module_free(m);
  }
  cg_kernels_free(k, nk);
}

static void *cuda_chain(void *arg) {
  (void)arg;
  TG t;
  tg_init(&t, "unary chain (cuda)", 73);
  build_chain(&t, chain_ops);
  group_all(&t);
  cuda_one(&t, "unary chain DEPTH deep (cuda)", DEPTH);
  ir_graph_destroy(t.g);
  TG u;
  tg_init(&u, "mixed chain (cuda)", 74);
  build_mixed(&u);
  group_all(&u);
  /* the data-movement members compute nothing of their own: count the
   * elementwise ones (add, where, neg, greater, sin) */
  int ew = 0;
  for (int i = 0; i < u.g->nnode; i++) {
    Op op = u.g->node[i].op;
    ew += op == OP_ADD || op == OP_WHERE || op == OP_NEG || op == OP_GREATER || op == OP_SIN;
  }
  cuda_one(&u, "mixed chain 300 deep (cuda)", ew);
  ir_graph_destroy(u.g);
  return NULL;
}

static void on_small_stack(void *(*fn)(void *), const char *what) {
  pthread_attr_t a;
  pthread_attr_init(&a);
  CHECK(pthread_attr_setstacksize(&a, SMALL_STACK) == 0);
  pthread_t th;
  CHECK(pthread_create(&th, &a, fn, NULL) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  pthread_attr_destroy(&a);
  printf("%s: done on a %d KiB stack\n", what, SMALL_STACK / 1024);
}

/* argument "cpu" or "cuda": that backend only */
int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : "";
  if (strcmp(only, "cpu") != 0) on_small_stack(cuda_chain, "cuda");
  if (strcmp(only, "cuda") != 0) on_small_stack(cpu_chain, "cpu");
  return check_done("test_emit_depth");
}

#else

int main(void) {
  printf("SKIP: built without LLVM\n");
  return CHECK_SKIPPED;
}

#endif
