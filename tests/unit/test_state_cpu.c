/* The CPU kernels of the causal-LM ops (codegen/llvm/state_ops.c and the
 * cache mode of attention in opaque.c), one kernel per node:
 *   - through the harness (test_llvm_harness.h: against the interpreter,
 *     guards around every buffer, uneven task splits): argmax over each
 *     axis with keepdims, NaN and infinities (f32, f16, bf16, i32, u8),
 *     topk over each axis, largest and smallest, k from 1 to the whole
 *     axis, with NaN, infinities and ties (f32, f16, bf16, i32, u8), also
 *     with only the indices stored, and a k beyond the CPU kernel's limit
 *     refused; arange (i32, i64), scatter out of place (a copy then the rows; indices
 *     may repeat), attention with cache: true (GQA, i32 and i64 positions,
 *     f32/f16/bf16, a 4th input that is positions and not a mask), also
 *     with rope of q and k computed in its operand loads (one group);
 *   - scatter into a state, called directly: the runtime gives the state and
 *     the scatter's result the same memory, so the kernel is run that way
 *     (rows not at idx keep what the state held; indices outside the axis,
 *     negative or too large, are skipped; no guard byte changes) and with two
 *     distinct buffers, which shows that it writes only the rows at idx (no
 *     copy of the destination: the other rows of the result keep their
 *     sentinel, the destination is not touched);
 *   - the kernel body does not mark the state and the scatter's result
 *     noalias (unoptimised IR text).
 */
#include <stdarg.h>

#include "tests/unit/test_llvm_harness.h"

#ifdef SMELT_HAVE_LLVM

static const DType FLOATS[] = {DT_F32, DT_F16, DT_BF16};
static const RunOpts R = {.tol32 = 1e-5, .tol16 = 2e-3};

#define D(...) ((const int64_t[]){__VA_ARGS__})

static char label_buf[256];
static const char *L(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(label_buf, sizeof label_buf, fmt, ap);
  va_end(ap);
  return label_buf;
}

static void t_argmax(DType dt, int axis, bool keep, Domain dom) {
  TG t;
  tg_init(&t, L("argmax %s axis=%d keepdims=%d dom=%d", dt_name(dt), axis, keep, dom), 41);
  int x = tg_input(&t, "x", dt, 3, D(3, 5, 7), dom, 0);
  int n = tg_node(&t, OP_ARGMAX, 1, &x, "y");
  ir_set_attr_int(t.g, n, "axis", axis);
  ir_set_attr_bool(t.g, n, "keepdims", keep);
  tg_run(&t, &R);
}

/* topk of x [3, 5, 7] along axis; only_indices: the values are not a
 * result of the graph (the kernel then stores the indices alone). */
static void t_topk(DType dt, int axis, int64_t k, bool largest, Domain dom, bool only_indices) {
  TG t;
  tg_init(&t, L("topk %s axis=%d k=%lld largest=%d dom=%d%s", dt_name(dt), axis, (long long)k, largest, dom,
                only_indices ? " (indices only)" : ""),
          43);
  int x = tg_input(&t, "x", dt, 3, D(3, 5, 7), dom, 0);
  const char *names[2] = {"v", "i"};
  int n = ir_add_node(t.g, OP_TOPK, 1, &x, 2, names, here);
  ir_set_attr_int(t.g, n, "axis", axis);
  ir_set_attr_int(t.g, n, "k", k);
  ir_set_attr_bool(t.g, n, "largest", largest);
  if (only_indices) ir_add_output(t.g, t.g->node[n].out[1]);
  tg_run(&t, &R);
}

/* A k beyond what the CPU kernel keeps per row is refused at compile time. */
static void t_topk_too_large(void) {
  TG t;
  tg_init(&t, "topk k=5000 (beyond the CPU kernel's 4096)", 44);
  int x = tg_input(&t, "x", DT_F32, 2, D(1, 6000), DOM_ANY, 0);
  const char *names[2] = {"v", "i"};
  int n = ir_add_node(t.g, OP_TOPK, 1, &x, 2, names, here);
  ir_set_attr_int(t.g, n, "k", 5000);
  RunOpts ro = R;
  ro.expect_unsupported = true;
  tg_run(&t, &ro);
}

static void t_arange(DType dt) {
  TG t;
  tg_init(&t, L("arange %s", dt_name(dt)), 42);
  int s = tg_input(&t, "s", dt, 1, D(1), DOM_HUGE, 0);
  int n = tg_node(&t, OP_ARANGE, 1, &s, "y");
  ir_set_attr_int(t.g, n, "size", 37);
  tg_run(&t, &R);
}

static void t_scatter(DType dt, DType it, int axis, const int64_t *dd, const int64_t *sd, int rank) {
  TG t;
  tg_init(&t, L("scatter out of place %s idx %s axis=%d", dt_name(dt), dt_name(it), axis), 43);
  int ax = axis < 0 ? axis + rank : axis;
  int d = tg_input(&t, "d", dt, rank, dd, DOM_ANY, 0);
  int i = tg_input(&t, "i", it, 1, &sd[ax], DOM_SMALLPOS, dd[ax]);
  int s = tg_input(&t, "s", dt, rank, sd, DOM_ANY, 0);
  int n = tg_node(&t, OP_SCATTER, 3, (int[]){d, i, s}, "y");
  ir_set_attr_int(t.g, n, "axis", axis);
  tg_run(&t, &R);
}

static void t_attention_cache(DType dt, DType pt, int64_t H, int64_t Hkv, int64_t S, int64_t T, int64_t Dv) {
  TG t;
  tg_init(&t, L("attention cache %s pos %s H%lld/%lld S%lld T%lld Dv%lld", dt_name(dt), dt_name(pt), (long long)H,
                (long long)Hkv, (long long)S, (long long)T, (long long)Dv),
          44);
  int q = tg_input(&t, "q", dt, 4, D(2, H, S, 8), DOM_ANY, 0);
  int k = tg_input(&t, "k", dt, 4, D(2, Hkv, T, 8), DOM_ANY, 0);
  int v = tg_input(&t, "v", dt, 4, D(2, Hkv, T, Dv), DOM_ANY, 0);
  int p = tg_input(&t, "p", pt, 1, D(S), DOM_SMALLPOS, T);
  int n = tg_node(&t, OP_ATTENTION, 4, (int[]){q, k, v, p}, "y");
  ir_set_attr_bool(t.g, n, "cache", true);
  tg_run(&t, &R);
}

/* rope of q and of k computed in attention's operand loads (one group,
 * anchored at the attention), as a fused prologue would be. */
static void t_attention_cache_rope(DType dt) {
  TG t;
  tg_init(&t, L("attention cache with rope prologue %s", dt_name(dt)), 45);
  int q = tg_input(&t, "q", dt, 4, D(1, 4, 3, 8), DOM_ANY, 0);
  int k = tg_input(&t, "k", dt, 4, D(1, 2, 10, 8), DOM_ANY, 0);
  int v = tg_input(&t, "v", dt, 4, D(1, 2, 10, 8), DOM_ANY, 0);
  int p = tg_input(&t, "p", DT_I32, 1, D(3), DOM_SMALLPOS, 10);
  int kp = tg_input(&t, "kp", DT_I64, 1, D(10), DOM_SMALLPOS, 10);
  int rq = tg_node(&t, OP_ROPE, 2, (int[]){q, p}, "qr");
  int rk = tg_node(&t, OP_ROPE, 2, (int[]){k, kp}, "kr");
  int n = tg_node(&t, OP_ATTENTION, 4, (int[]){tg_val(&t, rq), tg_val(&t, rk), v, p}, "y");
  ir_set_attr_bool(t.g, n, "cache", true);
  for (int i = 0; i < t.g->nnode; i++) ir_fill_default_attrs(t.g, i);
  tg_group(&t, GK_OPAQUE, (int[]){rq, rk, n}, 3, n);
  /* the fused rope is not rounded to f16/bf16 before attention reads it,
   * the interpreter's is: a few ulps of bf16 apart */
  static const RunOpts fused = {.tol32 = 1e-5, .tol16 = 8e-3};
  tg_run(&t, &fused);
}

/* ---- scatter into a state, called directly ---- */

enum { NH = 2, CAP = 8, HD = 4, NS = 3 };

typedef struct {
  Graph *g;
  int state, pos, src, kc, node;
  Kernel *ks;
  int nk, ki; /* ki: the scatter's kernel */
  void *obj;
  size_t len;
} StateModel;

static bool state_model(StateModel *sm) {
  memset(sm, 0, sizeof *sm);
  Graph *g = sm->g = ir_graph_create("state_scatter");
  g->file = "test_state_cpu";
  sm->state = ir_add_state(g, "k_cache", tt(DT_F32, 4, D(1, NH, CAP, HD)), here);
  sm->pos = ir_add_input(g, "pos", tt(DT_I32, 1, D(NS)), here);
  sm->src = ir_add_input(g, "k", tt(DT_F32, 4, D(1, NH, NS, HD)), here);
  const char *names[1] = {"kc"};
  sm->node = ir_add_node(g, OP_SCATTER, 3, (int[]){sm->state, sm->pos, sm->src}, 1, names, here);
  ir_set_attr_int(g, sm->node, "axis", 2);
  sm->kc = g->node[sm->node].out[0];
  /* something reads the update: y = kc + kc */
  names[0] = "y";
  int y = ir_add_node(g, OP_ADD, 2, (int[]){sm->kc, sm->kc}, 1, names, here);
  ir_add_output(g, g->node[y].out[0]);
  for (int i = 0; i < g->nnode; i++) {
    ir_fill_default_attrs(g, i);
    CHECK_OK(ir_infer_node(g, i));
  }
  CHECK_OK(cg_single_node_groups(g));
  CHECK_OK(ir_verify(g));
  CHECK_OK(cg_lower(g, &sm->ks, &sm->nk));
  sm->ki = -1;
  for (int i = 0; i < sm->nk; i++)
    if (g->groups[sm->ks[i].group].nodes[0] == sm->node) sm->ki = i;
  CHECK(sm->ki >= 0);
  if (sm->ki < 0 || check_failures) return false;
  CHECK_OK(cg_llvm_compile(g, sm->ks, sm->nk, NULL, &sm->obj, &sm->len, NULL));
  return sm->obj != NULL;
}

static void state_model_free(StateModel *sm) {
  free(sm->obj);
  cg_kernels_free(sm->ks, sm->nk);
  ir_graph_destroy(sm->g);
}

typedef struct {
  unsigned char mem[GUARD + NH * CAP * HD * 4 + GUARD];
} CacheBuf;

static float *cache_data(CacheBuf *b) { return (float *)(b->mem + GUARD); }
static bool cache_guards_ok(const CacheBuf *b) {
  for (size_t i = 0; i < GUARD; i++)
    if (b->mem[i] != GUARD_BYTE || b->mem[GUARD + NH * CAP * HD * 4 + i] != GUARD_BYTE) return false;
  return true;
}
static void cache_fill(CacheBuf *b, float base) {
  memset(b->mem, GUARD_BYTE, sizeof b->mem);
  float *c = cache_data(b);
  for (int i = 0; i < NH * CAP * HD; i++) c[i] = base + (float)i;
}

/* Runs the scatter kernel with pos, the state's memory `dst` and the
 * result's memory `out` (the same buffer when in place). */
static void run_scatter(StateModel *sm, CgKernelFn fn, const int32_t *pos, const float *src, CacheBuf *dst,
                        CacheBuf *out) {
  const Kernel *k = &sm->ks[sm->ki];
  void *args[8];
  CHECK(k->nargs == 4 && k->nouts == 1);
  for (int a = 0; a < k->nargs && a < 8; a++) {
    int v = k->args[a];
    args[a] = v == sm->state ? (void *)cache_data(dst)
              : v == sm->kc  ? (void *)cache_data(out)
              : v == sm->pos ? (void *)pos
                             : (void *)src;
  }
  /* uneven task ranges and an empty one, as the harness does */
  int64_t n = k->ntasks, s1 = n / 3;
  fn(args, s1, n);
  fn(args, n, n);
  fn(args, 0, s1);
}

/* What the cache must hold after writing src at pos over `before`. */
static void expect_rows(const float *before, const int32_t *pos, const float *src, float *want) {
  memcpy(want, before, sizeof(float) * NH * CAP * HD);
  for (int i = 0; i < NS; i++) {
    if (pos[i] < 0 || pos[i] >= CAP) continue;
    for (int h = 0; h < NH; h++)
      for (int d = 0; d < HD; d++) want[(h * CAP + pos[i]) * HD + d] = src[(h * NS + i) * HD + d];
  }
}

static void test_scatter_state(void) {
  StateModel sm;
  if (!state_model(&sm)) {
    state_model_free(&sm);
    return;
  }
  CgJit *jit = NULL;
  CHECK_OK(cg_jit_create(sm.obj, sm.len, &jit));
  void *p = NULL;
  if (jit) CHECK_OK(cg_jit_find(jit, sm.ks[sm.ki].name, &p));
  if (p) {
    CgKernelFn fn;
    memcpy(&fn, &p, sizeof fn);
    float src[NH * NS * HD], want[NH * CAP * HD], before[NH * CAP * HD];
    for (int i = 0; i < NH * NS * HD; i++) src[i] = -100.0f - (float)i;
    static const int32_t cases[][NS] = {{2, 5, 7}, {0, -1, 8}, {CAP, -5, 3}, {6, 6, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
      const int32_t *pos = cases[c];
      /* in place: one buffer is the state and the result */
      CacheBuf st;
      cache_fill(&st, 1000.0f);
      memcpy(before, cache_data(&st), sizeof before);
      run_scatter(&sm, fn, pos, src, &st, &st);
      expect_rows(before, pos, src, want);
      if (memcmp(cache_data(&st), want, sizeof want) != 0) {
        fprintf(stderr, "scatter in place, pos {%d, %d, %d}: the state is not the old one with the rows written\n",
                pos[0], pos[1], pos[2]);
        check_failures++;
      }
      CHECK(cache_guards_ok(&st));
      /* distinct buffers: only the rows at pos are written, dst is not read into out */
      CacheBuf dst, out;
      cache_fill(&dst, 1000.0f);
      cache_fill(&out, 5000.0f);
      memcpy(before, cache_data(&out), sizeof before);
      float dst0[NH * CAP * HD];
      memcpy(dst0, cache_data(&dst), sizeof dst0);
      run_scatter(&sm, fn, pos, src, &dst, &out);
      expect_rows(before, pos, src, want);
      if (memcmp(cache_data(&out), want, sizeof want) != 0) {
        fprintf(stderr, "scatter into a state, pos {%d, %d, %d}: rows other than those at pos were written\n",
                pos[0], pos[1], pos[2]);
        check_failures++;
      }
      CHECK(memcmp(cache_data(&dst), dst0, sizeof dst0) == 0);
      CHECK(cache_guards_ok(&dst) && cache_guards_ok(&out));
    }
  }
  cg_jit_destroy(jit);

  /* the body's parameters: the state and the result are not noalias, the
   * others are */
  char *ir = NULL;
  CHECK_OK(cg_llvm_ir_text(sm.g, sm.ks, sm.nk, NULL, false, &ir));
  if (ir) {
    char want[160];
    snprintf(want, sizeof want, "@%s.body(", sm.ks[sm.ki].name);
    const char *def = strstr(ir, want);
    CHECK(def != NULL);
    if (def) {
      const char *eol = strchr(def, '\n');
      int noalias = 0;
      for (const char *s = def; (s = strstr(s, "noalias")) && (!eol || s < eol); s++) noalias++;
      if (noalias != 2) {
        fprintf(stderr, "scatter into a state: %d noalias parameters, want 2 (pos and k): %.*s\n", noalias,
                eol ? (int)(eol - def) : 200, def);
        check_failures++;
      }
    }
    free(ir);
  }
  state_model_free(&sm);
}

int main(void) {
  (void)tg_const; /* the harness's, unused here */
  for (int d = 0; d < 3; d++) {
    t_argmax(FLOATS[d], -1, false, DOM_ANY);
    t_argmax(FLOATS[d], 1, true, DOM_SPECIAL);
    t_argmax(FLOATS[d], 0, false, DOM_SPECIAL);
  }
  t_argmax(DT_I32, -1, true, DOM_ANY);
  t_argmax(DT_U8, 1, false, DOM_ANY);
  t_argmax(DT_F32, 2, false, DOM_SPECIAL);
  for (int d = 0; d < 3; d++) {
    t_topk(FLOATS[d], -1, 3, true, DOM_ANY, false);
    t_topk(FLOATS[d], 1, 5, false, DOM_SPECIAL, false);
    t_topk(FLOATS[d], 0, 2, true, DOM_SPECIAL, false);
  }
  t_topk(DT_F32, -1, 7, false, DOM_SPECIAL, false); /* k = the whole axis: a sort */
  t_topk(DT_F32, 2, 1, true, DOM_SPECIAL, true);
  t_topk(DT_I32, -1, 4, true, DOM_ANY, false); /* small integers: many ties */
  t_topk(DT_U8, 1, 3, false, DOM_ANY, true);
  t_topk_too_large();
  t_arange(DT_I32);
  t_arange(DT_I64);
  for (int d = 0; d < 3; d++) t_scatter(FLOATS[d], DT_I32, 2, D(1, 2, 9, 4), D(1, 2, 3, 4), 4);
  t_scatter(DT_F32, DT_I64, 0, D(7, 5), D(4, 5), 2);
  t_scatter(DT_I32, DT_I32, -1, D(3, 6), D(3, 2), 2);
  for (int d = 0; d < 3; d++) {
    t_attention_cache(FLOATS[d], DT_I32, 4, 2, 3, 11, 8);
    t_attention_cache(FLOATS[d], DT_I64, 2, 2, 1, 16, 5);
  }
  t_attention_cache(DT_F32, DT_I32, 4, 1, 6, 6, 8);
  for (int d = 0; d < 3; d++) t_attention_cache_rope(FLOATS[d]);
  test_scatter_state();
  printf("test_state_cpu: %d kernels run through the harness\n", tg_kernels_run);
  return check_done("test_state_cpu");
}

#else

int main(void) {
  printf("SKIP: test_state_cpu: built without SMELT_LLVM\n");
  return CHECK_SKIPPED;
}

#endif
