/* Multi-node fusion groups on the CPU backend, and the kernel lowering that
 * precedes code generation.
 *
 * The groups are formed by hand here (the fuse pass decides which to form;
 * this tests that whatever it forms compiles to the right numbers): an
 * elementwise chain through broadcasting, transpose and reshape; residual
 * add + rms_norm + scale with the residual stored too; softmax over a middle
 * axis with a prologue and an epilogue; matmul + bias + gelu + residual;
 * conv2d + bias + relu; attention after rope with a scaled output; results
 * of different shapes spread over one kernel's tasks; a deep diamond-shaped
 * chain that would take exponential time without the emission memo; and
 * the shapes the backend refuses (a transpose after a matmul).  Results are
 * compared with the interpreter as in test_llvm_ops.c.
 *
 * cg_lower is checked directly: argument order (inputs in order of first
 * use, then stored results), task counts and kernel names.
 */
#include <pthread.h>

#include "tests/unit/test_llvm_harness.h"

#ifdef SMELT_HAVE_LLVM

static const RunOpts R = {.tol32 = 1e-5, .tol16 = 2e-3};

#define D(...) ((const int64_t[]){__VA_ARGS__})

/* Groups every node of t in one group of `kind` anchored at `anchor`. */
static void group_all(TG *t, GroupKind kind, int anchor) {
  int nodes[256];
  for (int i = 0; i < t->g->nnode; i++) nodes[i] = i;
  tg_group(t, kind, nodes, t->g->nnode, anchor);
}

static int scalar_const(TG *t, const char *name, DType dt, double v) {
  char buf[8];
  dt_store(dt, buf, 0, v);
  return ir_add_const(t->g, name, tt(dt, 0, D(0)), buf, here);
}

/* y = gelu(reshape(transpose(x + b), [32, 6])) * s, with x + b stored too. */
static void chain(DType dt, const RunOpts *ro) {
  TG t;
  tg_init(&t, dt == DT_F32 ? "chain f32" : "chain f16", 31);
  int x = tg_input(&t, "x", dt, 3, D(4, 6, 8), DOM_ANY, 0);
  int b = tg_input(&t, "b", dt, 1, D(8), DOM_ANY, 0);
  int s = tg_input(&t, "s", dt, 1, D(6), DOM_ANY, 0);
  int h = tg_val(&t, tg_node(&t, OP_ADD, 2, (int[]){x, b}, "h"));
  int n = tg_node(&t, OP_TRANSPOSE, 1, &h, "t");
  ir_set_attr_ints(t.g, n, "perm", D(0, 2, 1), 3);
  n = tg_node(&t, OP_RESHAPE, 1, (int[]){tg_val(&t, n)}, "r");
  ir_set_attr_ints(t.g, n, "shape", D(32, 6), 2);
  n = tg_node(&t, OP_GELU, 1, (int[]){tg_val(&t, n)}, "g");
  int y = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){tg_val(&t, n), s}, "y"));
  ir_add_output(t.g, y);
  ir_add_output(t.g, h);
  group_all(&t, GK_ELEMWISE, t.g->nnode - 1);
  tg_run(&t, ro);
}
static void test_elementwise_chain(DType dt) { chain(dt, &R); }
static void test_elementwise_chain_opts(const RunOpts *ro) {
  chain(DT_F32, ro);
  chain(DT_F16, ro);
}

/* a = x + r (stored: the residual stream), y = rms_norm(a, g) * s; and the
 * lowering of that group. */
static void test_residual_rms(DType dt) {
  TG t;
  tg_init(&t, dt == DT_F32 ? "residual rms_norm f32" : dt == DT_F16 ? "residual rms_norm f16" : "residual rms_norm bf16",
          32);
  int x = tg_input(&t, "x", dt, 2, D(9, 40), DOM_ANY, 0);
  int r = tg_input(&t, "r", dt, 2, D(9, 40), DOM_ANY, 0);
  int g = tg_input(&t, "g", dt, 1, D(40), DOM_ANY, 0);
  int s = tg_input(&t, "s", dt, 1, D(40), DOM_ANY, 0);
  int a = tg_val(&t, tg_node(&t, OP_ADD, 2, (int[]){x, r}, "layer.0/a"));
  int nn = tg_node(&t, OP_RMS_NORM, 2, (int[]){a, g}, "layer.0/n");
  int y = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){tg_val(&t, nn), s}, "layer.0/y"));
  ir_add_output(t.g, a);
  ir_add_output(t.g, y);
  group_all(&t, GK_REDUCTION, nn);
  if (dt == DT_F32) {
    /* the lowering, before the run consumes the graph */
    for (int i = 0; i < t.g->nnode; i++) {
      ir_fill_default_attrs(t.g, i);
      CHECK_OK(ir_infer_node(t.g, i));
    }
    Kernel *ks = NULL;
    int nk = 0;
    CHECK_OK(cg_lower(t.g, &ks, &nk));
    CHECK(nk == 1);
    if (nk == 1) {
      CHECK(strcmp(ks[0].name, "k00_layer.0_a_n_y") == 0);
      CHECK(ks[0].nargs == 6 && ks[0].nouts == 2);
      const int want[6] = {x, r, g, s, a, y};
      for (int i = 0; i < 6 && i < ks[0].nargs; i++) CHECK(ks[0].args[i] == want[i]);
      CHECK(ks[0].ntasks == 9);
      CHECK(ks[0].bytes == (double)(4 * (9 * 40 * 4) + 2 * 40 * 4));
      CHECK(ks[0].flops > 0);
    }
    cg_kernels_free(ks, nk);
  }
  RunOpts ro = R;
  /* the reference rounds a to bf16 before normalising it, the kernel does
   * not: that is one bf16 rounding (2^-9) of difference by design */
  if (dt == DT_BF16) ro.tol16 = 4e-3;
  tg_run(&t, &ro);
}

/* y = softmax(x * 0.5, axis=1) + bias, over the middle axis of [4,7,5];
 * also unoptimised and for a baseline CPU (no F16C, no SSE4.1 floor). */
static void test_softmax_middle(Op op, const RunOpts *ro) {
  TG t;
  tg_init(&t, op == OP_SOFTMAX ? "softmax middle axis" : "log_softmax middle axis", 33);
  int x = tg_input(&t, "x", DT_F32, 3, D(4, 7, 5), DOM_WIDE, 0);
  int bias = tg_input(&t, "bias", DT_F32, 2, D(7, 1), DOM_ANY, 0);
  int half = scalar_const(&t, "half", DT_F32, 0.5);
  int p = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){x, half}, "p"));
  int sm = tg_node(&t, op, 1, &p, "sm");
  ir_set_attr_int(t.g, sm, "axis", 1);
  tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, sm), bias}, "y");
  group_all(&t, GK_REDUCTION, sm);
  tg_run(&t, ro);
}

/* y = gelu(x @ w + b) + res, the weight a constant. */
static void test_matmul_epilogue(DType dt, bool tb, const RunOpts *base) {
  TG t;
  tg_init(&t, tb ? "matmul+bias+gelu+residual (w transposed)" : "matmul+bias+gelu+residual", 34);
  int x = tg_input(&t, "x", dt, 3, D(2, 10, 16), DOM_ANY, 0);
  int w = tb ? tg_const(&t, "w", dt, 2, D(300, 16), DOM_ANY) : tg_const(&t, "w", dt, 2, D(16, 300), DOM_ANY);
  int b = tg_const(&t, "b", dt, 1, D(300), DOM_ANY);
  int res = tg_input(&t, "res", dt, 3, D(2, 10, 300), DOM_ANY, 0);
  int mm = tg_node(&t, OP_MATMUL, 2, (int[]){x, w}, "mm");
  ir_set_attr_bool(t.g, mm, "transpose_b", tb);
  int h = tg_val(&t, tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, mm), b}, "h"));
  int gl = tg_node(&t, OP_GELU, 1, &h, "act");
  ir_set_attr_enum(t.g, gl, "approximate", "tanh");
  tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, gl), res}, "y");
  group_all(&t, GK_CONTRACTION, mm);
  RunOpts ro = *base;
  ro.tol16 = 4e-3; /* the reference rounds after each of four ops */
  tg_run(&t, &ro);
}

/* relu(conv2d(x, w) + bias[O,1,1]), with a cast prologue on x. */
static void test_conv_epilogue(void) {
  TG t;
  tg_init(&t, "cast+conv2d+bias+relu", 35);
  int x16 = tg_input(&t, "x16", DT_F16, 4, D(2, 3, 8, 9), DOM_ANY, 0);
  int cx = tg_node(&t, OP_CAST, 1, &x16, "x");
  ir_set_attr_dtype(t.g, cx, "to", DT_F32);
  int w = tg_const(&t, "w", DT_F32, 4, D(4, 3, 3, 3), DOM_ANY);
  int b = tg_const(&t, "b", DT_F32, 3, D(4, 1, 1), DOM_ANY);
  int cv = tg_node(&t, OP_CONV2D, 2, (int[]){tg_val(&t, cx), w}, "conv");
  ir_set_attr_ints(t.g, cv, "pads", D(1, 1, 1, 1), 4);
  int h = tg_val(&t, tg_node(&t, OP_ADD, 2, (int[]){tg_val(&t, cv), b}, "h"));
  tg_node(&t, OP_RELU, 1, &h, "y");
  group_all(&t, GK_CONTRACTION, cv);
  tg_run(&t, &R);
}

/* y = attention(rope(q, pos), k, v, causal) * 2, and a mean-pooled epilogue
 * shape: sum with keepdims then sqrt. */
static void test_attention_rope(void) {
  TG t;
  tg_init(&t, "rope+attention+scale", 36);
  int q = tg_input(&t, "q", DT_F32, 4, D(1, 4, 6, 8), DOM_ANY, 0);
  int k = tg_input(&t, "k", DT_F32, 4, D(1, 2, 6, 8), DOM_ANY, 0);
  int v = tg_input(&t, "v", DT_F32, 4, D(1, 2, 6, 8), DOM_ANY, 0);
  int pos = tg_input(&t, "pos", DT_I32, 1, D(6), DOM_SMALLPOS, 100);
  int two = scalar_const(&t, "two", DT_F32, 2.0);
  int rq = tg_val(&t, tg_node(&t, OP_ROPE, 2, (int[]){q, pos}, "rq"));
  int at = tg_node(&t, OP_ATTENTION, 3, (int[]){rq, k, v}, "att");
  ir_set_attr_bool(t.g, at, "causal", true);
  tg_node(&t, OP_MUL, 2, (int[]){tg_val(&t, at), two}, "y");
  group_all(&t, GK_OPAQUE, at);
  tg_run(&t, &R);

  tg_init(&t, "sum keepdims + sqrt", 37);
  int x = tg_input(&t, "x", DT_F32, 3, D(3, 5, 7), DOM_POS, 0);
  int s = tg_node(&t, OP_SUM, 1, &x, "s");
  ir_set_attr_ints(t.g, s, "axes", D(1), 1);
  ir_set_attr_bool(t.g, s, "keepdims", true);
  tg_node(&t, OP_SQRT, 1, (int[]){tg_val(&t, s)}, "y");
  group_all(&t, GK_REDUCTION, s);
  tg_run(&t, &R);
}

/* Results of three shapes in one elementwise kernel, spread over its tasks
 * in proportion; the largest decides the task count. */
static void test_mixed_shapes(void) {
  TG t;
  tg_init(&t, "mixed result shapes", 38);
  int x = tg_input(&t, "x", DT_F32, 2, D(5, 16), DOM_ANY, 0);
  int c = tg_input(&t, "c", DT_F32, 3, D(3, 1, 1), DOM_ANY, 0);
  int e = tg_val(&t, tg_node(&t, OP_EXP, 1, &x, "e"));
  int n = tg_node(&t, OP_RESHAPE, 1, &e, "flat");
  ir_set_attr_ints(t.g, n, "shape", D(80), 1);
  int big = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){e, c}, "big")); /* [3,5,16] */
  ir_add_output(t.g, e);
  ir_add_output(t.g, tg_val(&t, n));
  ir_add_output(t.g, big);
  group_all(&t, GK_ELEMWISE, t.g->nnode - 1);
  tg_run(&t, &R);
}

/* v[i+1] = v[i] * v[i] * 0.5 + v[i] thirty times: every value is read twice
 * at the same coordinates, 2^30 copies without the memo. */
static void test_diamond(void) {
  TG t;
  tg_init(&t, "deep diamond chain", 39);
  int v = tg_input(&t, "x", DT_F32, 1, D(64), DOM_ANY, 0);
  int half = scalar_const(&t, "h", DT_F32, 0.01);
  for (int i = 0; i < 30; i++) {
    char a[16], b[16], c[16];
    snprintf(a, sizeof a, "sq%d", i);
    snprintf(b, sizeof b, "sc%d", i);
    snprintf(c, sizeof c, "v%d", i);
    int sq = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){v, v}, a));
    int sc = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){sq, half}, b));
    v = tg_val(&t, tg_node(&t, OP_ADD, 2, (int[]){sc, v}, c));
  }
  group_all(&t, GK_ELEMWISE, t.g->nnode - 1);
  RunOpts ro = R;
  ro.tol32 = 1e-4; /* ninety f32 roundings in a row */
  tg_run(&t, &ro);
}

/* layer_norm whose prologue result is also stored with another shape:
 * the broadcast operand e = exp(b) [D] goes to its own loop nest. */
static void test_norm_side_result(void) {
  TG t;
  tg_init(&t, "layer_norm with a side result", 40);
  int x = tg_input(&t, "x", DT_F32, 2, D(6, 24), DOM_ANY, 0);
  int b = tg_input(&t, "b", DT_F32, 1, D(24), DOM_ANY, 0);
  int gm = tg_input(&t, "gamma", DT_F32, 1, D(24), DOM_ANY, 0);
  int e = tg_val(&t, tg_node(&t, OP_EXP, 1, &b, "e"));
  int h = tg_val(&t, tg_node(&t, OP_MUL, 2, (int[]){x, e}, "h"));
  int ln = tg_node(&t, OP_LAYER_NORM, 2, (int[]){h, gm}, "y");
  ir_add_output(t.g, e);
  ir_add_output(t.g, tg_val(&t, ln));
  group_all(&t, GK_REDUCTION, ln);
  tg_run(&t, &R);
}

/* Shapes a kernel cannot take: the fuse pass must not form them, and the
 * backend says so instead of computing something else. */
static void test_unsupported(void) {
  TG t;
  tg_init(&t, "transpose after matmul", 41);
  int x = tg_input(&t, "x", DT_F32, 2, D(4, 8), DOM_ANY, 0);
  int w = tg_const(&t, "w", DT_F32, 2, D(8, 6), DOM_ANY);
  int mm = tg_node(&t, OP_MATMUL, 2, (int[]){x, w}, "mm");
  tg_node(&t, OP_TRANSPOSE, 1, (int[]){tg_val(&t, mm)}, "y");
  group_all(&t, GK_CONTRACTION, mm);
  tg_run(&t, &(RunOpts){.expect_unsupported = true});

  tg_init(&t, "two anchors", 42);
  x = tg_input(&t, "x", DT_F32, 2, D(4, 8), DOM_ANY, 0);
  int s1 = tg_node(&t, OP_SOFTMAX, 1, &x, "s1");
  tg_node(&t, OP_SOFTMAX, 1, (int[]){tg_val(&t, s1)}, "s2");
  group_all(&t, GK_REDUCTION, s1);
  Kernel *ks = NULL;
  int nk = 0;
  for (int i = 0; i < t.g->nnode; i++) {
    ir_fill_default_attrs(t.g, i);
    CHECK_OK(ir_infer_node(t.g, i));
  }
  ir_add_output(t.g, t.g->node[1].out[0]);
  smelt_status st = cg_lower(t.g, &ks, &nk);
  CHECK(st && st_code(st) == ST_UNSUPPORTED);
  st_free(st);
  ir_graph_destroy(t.g);
}

/* Kernel order follows the graph, names carry the YAML names. */
static void test_lower_order(void) {
  Graph *g = ir_graph_create("order");
  int x = ir_add_input(g, "x", tt(DT_F32, 2, D(3, 20000)), here);
  const char *n1[1] = {"block/a"}, *n2[1] = {"block/b"}, *n3[1] = {"other/c"};
  int a = ir_add_node(g, OP_EXP, 1, &x, 1, n1, here);
  int b = ir_add_node(g, OP_SOFTMAX, 1, (int[]){g->node[a].out[0]}, 1, n2, here);
  int c = ir_add_node(g, OP_NEG, 1, (int[]){g->node[b].out[0]}, 1, n3, here);
  for (int i = 0; i < g->nnode; i++) {
    ir_fill_default_attrs(g, i);
    CHECK_OK(ir_infer_node(g, i));
  }
  ir_add_output(g, g->node[c].out[0]);
  /* groups created out of order: the kernels still follow the graph */
  int order[3] = {c, a, b};
  for (int i = 0; i < 3; i++) {
    int gi = ir_add_group(g, order[i] == b ? GK_REDUCTION : GK_ELEMWISE);
    g->groups[gi].nodes = ir_graph_alloc(g, sizeof(int));
    g->groups[gi].nodes[0] = order[i];
    g->groups[gi].nnodes = 1;
    g->groups[gi].anchor = order[i];
    g->node[order[i]].group = gi;
  }
  Kernel *ks = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &ks, &nk));
  CHECK(nk == 3);
  if (nk == 3) {
    CHECK(strcmp(ks[0].name, "k01_block_a") == 0);
    CHECK(strcmp(ks[1].name, "k02_block_b") == 0);
    CHECK(strcmp(ks[2].name, "k00_other_c") == 0);
    /* exp: 3 rows of 20000 in chunks of 8192 -> 3 * 3 tasks; softmax: 3 rows */
    CHECK(ks[0].ntasks == 9);
    CHECK(ks[1].ntasks == 3);
    CHECK(ks[0].nargs == 2 && ks[0].nouts == 1 && ks[0].args[0] == x);
  }
  cg_kernels_free(ks, nk);
  /* a node outside every group is an error, not a silent skip */
  g->node[a].group = -1;
  smelt_status st = cg_lower(g, &ks, &nk);
  CHECK(st != NULL);
  st_free(st);
  ir_graph_destroy(g);
}

/* The JIT: unknown names are NULL (with a reason from cg_jit_find), and a
 * corrupt object is an error, not a crash. */
static void test_jit_errors(void) {
  CgJit *jit = NULL;
  static const char junk[64] = "definitely not an ELF object";
  smelt_status st = cg_jit_create(junk, sizeof junk, &jit);
  if (!st) {
    /* ORC may accept the bytes lazily; the lookup must then fail */
    CHECK(cg_jit_lookup(jit, "k00") == NULL);
    cg_jit_destroy(jit);
  }
  st_free(st);
}

/* Compiles, loads and runs y = exp(x) * k on its own graph; the result is
 * checked against libm here (not through the harness, whose counters are
 * not thread-safe). */
typedef struct {
  float k;
  bool ok;
} ThreadJob;

static void *compile_and_run(void *arg) {
  ThreadJob *job = arg;
  job->ok = false;
  Graph *g = ir_graph_create("thread");
  int x = ir_add_input(g, "x", tt(DT_F32, 1, D(1000)), here);
  int k = ir_add_const(g, "k", tt(DT_F32, 0, D(0)), &job->k, here);
  const char *n1[1] = {"e"}, *n2[1] = {"y"};
  int e = ir_add_node(g, OP_EXP, 1, &x, 1, n1, here);
  int y = ir_add_node(g, OP_MUL, 2, (int[]){g->node[e].out[0], k}, 1, n2, here);
  Kernel *ks = NULL;
  int nk = 0;
  void *obj = NULL;
  size_t len = 0;
  CgJit *jit = NULL;
  smelt_status st = NULL;
  for (int i = 0; i < 2 && !st; i++) {
    ir_fill_default_attrs(g, i);
    st = ir_infer_node(g, i);
  }
  ir_add_output(g, g->node[y].out[0]);
  if (!st) st = cg_single_node_groups(g);
  if (!st) st = cg_lower(g, &ks, &nk);
  if (!st) st = cg_llvm_compile(g, ks, nk, NULL, &obj, &len, NULL);
  if (!st) st = cg_jit_create(obj, len, &jit);
  if (!st) {
    float in[1000], mid[1000], out[1000];
    for (int i = 0; i < 1000; i++) in[i] = (float)i / 500 - 1;
    void *a0[2] = {in, mid}, *a1[3] = {mid, &job->k, out};
    CgKernelFn f0 = NULL, f1 = NULL;
    void *p0 = cg_jit_lookup(jit, ks[0].name), *p1 = cg_jit_lookup(jit, ks[1].name);
    memcpy(&f0, &p0, sizeof f0);
    memcpy(&f1, &p1, sizeof f1);
    if (f0 && f1) {
      f0(a0, 0, ks[0].ntasks);
      f1(a1, 0, ks[1].ntasks);
      job->ok = true;
      for (int i = 0; i < 1000; i++)
        if (fabs(out[i] - expf(in[i]) * job->k) > 1e-5 * fabs(expf(in[i]) * job->k)) job->ok = false;
    }
  }
  st_free(st);
  cg_jit_destroy(jit);
  free(obj);
  cg_kernels_free(ks, nk);
  ir_graph_destroy(g);
  return NULL;
}

/* Compiles on four threads at once: no state is shared between calls. */
static void test_threads(void) {
  pthread_t th[4];
  ThreadJob jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i].k = (float)(i + 1);
    CHECK(pthread_create(&th[i], NULL, compile_and_run, &jobs[i]) == 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK(jobs[i].ok);
  }
}

int main(void) {
  test_elementwise_chain(DT_F32);
  test_elementwise_chain(DT_F16);
  test_residual_rms(DT_F32);
  test_residual_rms(DT_F16);
  test_residual_rms(DT_BF16);
  test_softmax_middle(OP_SOFTMAX, &R);
  test_softmax_middle(OP_LOG_SOFTMAX, &R);
  test_matmul_epilogue(DT_F32, false, &R);
  test_matmul_epilogue(DT_F32, true, &R);
  test_matmul_epilogue(DT_F16, false, &R);
  RunOpts o0 = R, base = R;
  o0.no_opt = true;
  base.cpu = "x86-64";
  test_softmax_middle(OP_SOFTMAX, &o0);
  test_matmul_epilogue(DT_F16, true, &o0);
  test_elementwise_chain_opts(&o0);
#if defined(__x86_64__)
  test_softmax_middle(OP_SOFTMAX, &base);
  test_matmul_epilogue(DT_F16, false, &base);
  test_elementwise_chain_opts(&base);
#endif
  test_threads();
  test_conv_epilogue();
  test_attention_rope();
  test_mixed_shapes();
  test_diamond();
  test_norm_side_result();
  test_unsupported();
  test_lower_order();
  test_jit_errors();
  printf("test_llvm_groups: %d kernels run\n", tg_kernels_run);
  return check_done("test_llvm_groups");
}

#else

int main(void) {
  printf("test_llvm_groups: skipped (built without SMELT_LLVM)\n");
  return 0;
}

#endif
