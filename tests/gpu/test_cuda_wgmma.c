/* The Hopper matmul (codegen/cuda/wgmma.c) on the GPU against the reference
 * interpreter, and its speed.
 *
 * Every wgmma candidate the backend lists for a shape (cg_cuda_variants on
 * sm_90a) is forced in turn (CgCudaOptions.force) and run through
 * tests/gpu/harness.h: buffers with guard regions, results compared element
 * by element with the interpreter (f16 4e-3, bf16 3e-2 of 1 + |ref|).
 * Shapes take M from {1, 7, 64, 127, 128, 2048}, N from {8, 120, 256, 4096,
 * 11008, 45 (odd: scalar stores)}, K from {8, 64, 72, 4096}, ragged against
 * every tile, f16 and bf16, without an epilogue, with bias + silu and with a
 * residual add, and three kinds of batch (A batched: rows folded; both
 * batched and only B batched: 3-D tensor maps).  The reference costs
 * M N K multiply-adds on the CPU (about 0.4 G/s), so products stay below
 * 6 x 10^8.
 *
 * Split-K ("...,sk=N") forced onto ragged M, N and K, odd N, the three
 * batch kinds, bf16 and the fused epilogues: checked the same way, then run
 * three times on one workspace, which must be all zero after every run
 * (other kernels share it), with bit-identical results (the slices are
 * added in slice order whichever finishes last).
 *
 * Then M = N = K = 4096 and the W4 prefill matmuls (M = 512: QKV, out,
 * down, gate-up; f16, no epilogue), every candidate: checked on 516 sampled
 * elements against a double-precision dot product on the host, and timed
 * with events (rt_cuda_time_kernels, 20 runs after a warm-up), printed as
 * TFLOP/s (split-K variants: the workspace zero again after the check run
 * and after the timed runs); at 4096^3 also the mma.sync kernel's default
 * for comparison.
 *
 * Without a GPU, or on one that is not compute capability 9.0 (wgmma and
 * TMA need sm_90a), it prints SKIP and exits 77 (skipped).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

typedef struct {
  const char *dt;
  int64_t za, zb; /* 0: no batch dim; else the operand's leading dim */
  int64_t M, K, N;
  const char *epi; /* "", "bias_silu" (bias [N], silu), "res" (+ r of the result's shape) */
} WgCase;

/* x [za?, M, K] @ w [zb?, N, K]^T (both inputs), then the epilogue. */
static Graph *wg_graph(const WgCase *c) {
  return h_batched_matmul_model(9, c->dt, c->za, c->zb, c->M, c->K, c->N, c->epi, true);
}

/* The variants of the graph's one kernel for arch whose token starts with
 * prefix. */
static int variants(Graph *g, const char *arch, const char *prefix, char (*out)[CG_VARIANT_LEN], int max) {
  Kernel *k = NULL;
  int nk = 0;
  smelt_status st = cg_lower(g, &k, &nk);
  if (st) {
    fprintf(stderr, "cg_lower: %s\n", st_message(st));
    st_free(st);
    check_failures++;
    return 0;
  }
  char all[64][CG_VARIANT_LEN];
  int n = nk == 1 ? cg_cuda_variants(g, &k[0], arch, all, 64) : 0, got = 0;
  for (int i = 0; i < n && got < max; i++)
    if (!strncmp(all[i], prefix, strlen(prefix))) memcpy(out[got++], all[i], CG_VARIANT_LEN);
  cg_kernels_free(k, nk);
  return got;
}

static float half_to_float(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}

/* One forced variant of the f16 matmul [M, K] x [N, K]^T (graph g, x and
 * w inputs of values xs/ws): run once and checked on sampled elements,
 * then timed; a split-K variant gets a zeroed workspace, which must be
 * zero again after the check run and after the timed runs.  Returns the
 * mean milliseconds, or -1. */
static double time_variant(Exec *e, Graph *g, const char *tok, const char *arch, const uint16_t *xs, const uint16_t *ws,
                           int64_t M, int64_t N, int64_t K) {
  Kernel *k = NULL;
  int nk = 0;
  FmtCudaModule *m = NULL;
  const char *force[1] = {tok};
  CgCudaOptions opt = {.args_aligned = true, .arch = arch, .force = force, .max_units = 1};
  smelt_status st = cg_lower(g, &k, &nk);
  if (!st && nk != 1) st = st_error(ST_INTERNAL, "%d kernels", nk);
  if (!st) st = cg_cuda_generate(g, k, nk, &opt, &m);
  if (!st) st = e->load(e, m);
  size_t bytes[3] = {(size_t)(M * K * 2), (size_t)(N * K * 2), (size_t)(M * N * 2)};
  uint64_t buf[4] = {0, 0, 0, 0}, wsb = m && !st ? m->kernels[0].workspace : 0;
  for (int i = 0; i < 3 && !st; i++) st = e->alloc(e, bytes[i], &buf[i]);
  if (!st) st = e->upload(e, buf[0], xs, bytes[0]);
  if (!st) st = e->upload(e, buf[1], ws, bytes[1]);
  unsigned char *wsh = wsb ? calloc(1, (size_t)wsb) : NULL;
  if (!st && wsb) st = wsh ? e->alloc(e, (size_t)wsb, &buf[3]) : st_error(ST_NO_MEMORY, "out of memory");
  if (!st && wsb) st = e->upload(e, buf[3], wsh, (size_t)wsb);
  double ms = -1;
  int bad = 0;
  if (!st) {
    const FmtCudaLaunch *l = &m->kernels[0];
    RtCudaPtr vals[4] = {buf[0], buf[1], buf[2], buf[3]};
    int na = wsb ? 4 : 3;
    void *params[4 + FMT_MAX_TMAPS];
    _Alignas(64) unsigned char maps[FMT_MAX_TMAPS][128];
    for (int i = 0; i < na; i++) params[i] = &vals[i];
    for (int t = 0; t < l->ntmaps && !st; t++) {
      const FmtCudaTmap *tm = &l->tmaps[t];
      st = rt_cuda_tensor_map(e->dev, tm->dtype, tm->rank, vals[tm->arg], tm->dims, tm->strides, tm->box, tm->swizzle,
                              maps[t]);
      params[na + t] = maps[t];
    }
    RtCudaLaunch rl = {e->fns[0], l->name, {l->grid[0], l->grid[1], l->grid[2]}, {l->block[0], l->block[1], l->block[2]},
                       l->smem, params, false, NULL, NULL};
    if (!st) st = rt_cuda_launch(e->dev, &rl, 1);
    if (!st) st = rt_cuda_sync(e->dev);
    uint16_t *y = malloc(bytes[2]);
    if (!st && y) st = e->download(e, y, buf[2], bytes[2]);
    /* sampled elements (and the corners) against a double-precision dot product on the host */
    uint64_t s = 12345;
    for (int i = 0; i < 516 && !st && y; i++) {
      int64_t r = i < 4 ? (i & 1) * (M - 1) : (int64_t)(h_rng(&s) % (uint64_t)M);
      int64_t c = i < 4 ? (i >> 1) * (N - 1) : (int64_t)(h_rng(&s) % (uint64_t)N);
      double ref = 0;
      for (int64_t kk = 0; kk < K; kk++) ref += (double)half_to_float(xs[r * K + kk]) * half_to_float(ws[c * K + kk]);
      double got = half_to_float(y[r * N + c]);
      if (!(fabs(got - ref) <= 4e-3 * (1 + fabs(ref)))) {
        if (bad++ < 4) fprintf(stderr, "%s: y[%lld, %lld] = %g, expected %g\n", tok, (long long)r, (long long)c, got, ref);
      }
    }
    free(y);
    for (int pass = 0; pass < 2 && !st; pass++) {
      if (pass == 1) st = rt_cuda_time_kernels(e->dev, &rl, 1, 20, &ms);
      if (!st && wsb) st = e->download(e, wsh, buf[3], (size_t)wsb);
      for (uint64_t b = 0; !st && b < wsb; b++)
        if (wsh[b]) {
          fprintf(stderr, "%s: workspace byte %llu left non-zero (%s)\n", tok, (unsigned long long)b,
                  pass ? "after the timed runs" : "after one run");
          bad++;
          break;
        }
    }
    if (bad) check_failures++;
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", tok, st_message(st));
    st_free(st);
    check_failures++;
    ms = -1;
  }
  if (bad) ms = -1;
  for (int i = 0; i < 4; i++)
    if (buf[i]) e->free(e, buf[i]);
  free(wsh);
  if (m) e->unload(e);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return ms;
}

/* Every wgmma candidate of the f16 [M, K] x [N, K]^T matmul, timed
 * (time_variant), the default first; with `mma`, also the mma.sync
 * kernel's default. */
static void timing(Exec *e, const char *label, int64_t M, int64_t N, int64_t K, bool mma) {
  WgCase c = {"f16", 0, 0, M, K, N, ""};
  Graph *g = wg_graph(&c);
  CHECK(g != NULL);
  if (!g) return;
  uint16_t *xs = malloc((size_t)(M * K * 2)), *ws = malloc((size_t)(N * K * 2));
  uint64_t s = 77;
  for (int64_t i = 0; xs && i < M * K; i++) dt_store(DT_F16, xs, (size_t)i, (double)(h_rng(&s) >> 11) / 9007199254740992.0 * 2 - 1);
  for (int64_t i = 0; ws && i < N * K; i++) dt_store(DT_F16, ws, (size_t)i, (double)(h_rng(&s) >> 11) / 9007199254740992.0 * 2 - 1);
  char toks[32][CG_VARIANT_LEN];
  int nt = xs && ws ? variants(g, "sm_90a", "wgmma:", toks, 32) : 0;
  CHECK(nt >= 1);
  double flops = 2.0 * (double)M * N * K;
  for (int i = 0; i < nt; i++) {
    double ms = time_variant(e, g, toks[i], "sm_90a", xs, ws, M, N, K);
    if (ms > 0) printf("%s f16 %-44s %8.4f ms %7.1f TFLOP/s%s\n", label, toks[i], ms, flops / ms * 1e-9, i == 0 ? "  (default)" : "");
  }
  char other[4][CG_VARIANT_LEN];
  if (mma && variants(g, NULL, "mma:", other, 4) >= 1) {
    double ms = time_variant(e, g, other[0], NULL, xs, ws, M, N, K);
    if (ms > 0) printf("%s f16 %-44s %8.4f ms %7.1f TFLOP/s  (mma.sync, for comparison)\n", label, other[0], ms, flops / ms * 1e-9);
  }
  free(xs);
  free(ws);
  ir_graph_destroy(g);
}

/* Split-K variant tok of g, run three times on one workspace: the
 * workspace is all zero after every run (other kernels share it), and the
 * output is bit for bit the same each time (the slices are added in slice
 * order, whichever finishes last).  Returns the failures. */
static int split_repeat(Exec *e, Graph *g, const char *tok, const char *what) {
  Kernel *k = NULL;
  int nk = 0;
  FmtCudaModule *m = NULL;
  const char *force[1] = {tok};
  CgCudaOptions opt = {.args_aligned = true, .arch = "sm_90a", .force = force, .max_units = 1};
  smelt_status st = cg_lower(g, &k, &nk);
  if (!st && nk != 1) st = st_error(ST_INTERNAL, "%d kernels", nk);
  if (!st) st = cg_cuda_generate(g, k, nk, &opt, &m);
  if (!st && m->kernels[0].workspace == 0) st = st_error(ST_INTERNAL, "a split-K variant without a workspace");
  if (!st) st = e->load(e, m);
  bool loaded = !st;
  int fails = 0, na = 0;
  uint64_t args[65] = {0};
  void *first = NULL, *out = NULL;
  unsigned char *wsh = NULL;
  size_t ybytes = 0;
  uint64_t wsb = 0;
  if (!st && k[0].nargs > 64) st = st_error(ST_INTERNAL, "too many arguments");
  for (int a = 0; !st && a < k[0].nargs; a++) {
    const Value *v = &g->val[k[0].args[a]];
    size_t bytes = ir_type_bytes(&v->type);
    void *host = v->kind == VK_CONST ? NULL : h_random(&v->type, -1, 1, (uint64_t)a + 11);
    st = e->alloc(e, bytes, &args[a]);
    if (!st) st = e->upload(e, args[a], v->kind == VK_CONST ? v->data : host, bytes);
    free(host);
    na = a + 1;
  }
  if (!st) {
    wsb = m->kernels[0].workspace;
    wsh = calloc(1, (size_t)wsb);
    st = wsh ? e->alloc(e, (size_t)wsb, &args[na]) : st_error(ST_NO_MEMORY, "out of memory");
    if (!st) st = e->upload(e, args[na], wsh, (size_t)wsb);
    int y = k[0].args[k[0].nargs - 1];
    ybytes = ir_type_bytes(&g->val[y].type);
    first = malloc(ybytes), out = malloc(ybytes);
    if (!st && (!first || !out)) st = st_error(ST_NO_MEMORY, "out of memory");
  }
  for (int rep = 0; rep < 3 && !st; rep++) {
    st = e->launch(e, 0, args, na + 1);
    if (!st) st = e->sync(e);
    if (!st) st = e->download(e, rep ? out : first, args[na - 1], ybytes);
    if (!st && rep && memcmp(first, out, ybytes) != 0) {
      fprintf(stderr, "%s %s: run %d differs from run 1\n", what, tok, rep + 1);
      fails++;
    }
    if (!st) st = e->download(e, wsh, args[na], (size_t)wsb);
    for (uint64_t b = 0; !st && b < wsb; b++)
      if (wsh[b]) {
        fprintf(stderr, "%s %s: run %d left workspace byte %llu non-zero\n", what, tok, rep + 1, (unsigned long long)b);
        fails++;
        break;
      }
  }
  if (st) {
    fprintf(stderr, "%s %s: %s\n", what, tok, st_message(st));
    st_free(st);
    fails++;
  }
  for (int a = 0; a <= na && a < 65; a++)
    if (args[a]) e->free(e, args[a]);
  free(first), free(out), free(wsh);
  if (loaded) e->unload(e);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return fails;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_wgmma");
  if (rc >= 0) return rc;
  const RtCudaInfo *info = rt_cuda_device_info(e.dev);
  if (info->cc != 90) {
    printf("SKIP: wgmma and TMA need a compute capability 9.0 GPU (this is %d.%d)\n", info->cc / 10, info->cc % 10);
    h_exec_close(&e);
    return CHECK_SKIPPED;
  }
  static const WgCase cases[] = {
      {"f16", 0, 0, 1, 8, 8, ""},
      {"bf16", 0, 0, 1, 4096, 256, "bias_silu"},
      {"f16", 0, 0, 7, 72, 120, "res"},
      {"bf16", 0, 0, 7, 64, 11008, ""},
      {"f16", 0, 0, 64, 4096, 256, "bias_silu"},
      {"bf16", 0, 0, 64, 72, 4096, "res"},
      {"f16", 0, 0, 127, 4096, 120, ""},
      {"f16", 0, 0, 127, 72, 11008, "bias_silu"},
      {"bf16", 0, 0, 128, 8, 4096, "res"},
      {"f16", 0, 0, 128, 4096, 256, "res"},
      {"f16", 0, 0, 2048, 64, 4096, "bias_silu"},
      {"bf16", 0, 0, 2048, 72, 120, ""},
      {"f16", 0, 0, 256, 72, 11008, "res"},
      {"f16", 0, 0, 129, 4096, 45, "bias_silu"},   /* N odd: scalar stores */
      {"f16", 3, 0, 50, 72, 120, "bias_silu"},     /* A batched: rows folded */
      {"bf16", 4, 0, 600, 136, 264, "res"},        /* rows folded across tiles */
      {"bf16", 2, 2, 70, 64, 40, "res"},           /* both batched: 3-D maps */
      {"f16", 3, 3, 200, 264, 300, "bias_silu"},
      {"f16", 0, 3, 33, 16, 24, ""},               /* only B batched */
  };
  HStats stats = {0};
  int runs = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const WgCase *c = &cases[i];
    char what[160];
    snprintf(what, sizeof what, "%s %s[%lld,%lld] x %s[%lld,%lld]^T%s%s", c->dt, c->za ? "batched " : "", (long long)c->M,
             (long long)c->K, c->zb ? "batched " : "", (long long)c->N, (long long)c->K, c->epi[0] ? " + " : "", c->epi);
    Graph *g = wg_graph(c);
    if (!g) {
      fprintf(stderr, "%s: could not build the model\n", what);
      check_failures++;
      continue;
    }
    char toks[16][CG_VARIANT_LEN];
    int nt = variants(g, "sm_90a", "wgmma:", toks, 16);
    if (nt < 1) fprintf(stderr, "%s: no wgmma candidate\n", what);
    CHECK(nt >= 1);
    for (int v = 0; v < nt; v++) {
      const char *force[1] = {toks[v]};
      CgCudaOptions opt = {.args_aligned = true, .arch = "sm_90a", .force = force};
      Graph *cl = ir_graph_clone(g);
      int before = stats.failures;
      CHECK(h_check_graph(&e, cl, NULL, &opt, 0, false, what, &stats) == 0);
      printf("%-48s %-40s %s\n", what, toks[v], stats.failures == before ? "ok" : "FAILED");
      ir_graph_destroy(cl);
      runs++;
    }
    ir_graph_destroy(g);
  }
  printf("%d wgmma runs, %d values (%d elements) compared with the interpreter: %d failures, %d guard failures, worst %.2f of tolerance\n",
         runs, stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
  /* split-K forced on ragged M, N and K, odd N, the three batch kinds,
   * bf16 and the fused epilogues: checked against the interpreter, then
   * run three times for a zero workspace and identical results */
  static const struct {
    WgCase c;
    const char *tok;
  } split[] = {
      {{"f16", 0, 0, 200, 1000, 264, "res"}, "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=3"},
      {{"bf16", 0, 0, 127, 520, 45, "bias_silu"}, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=5"},
      {{"f16", 0, 0, 129, 4096, 45, ""}, "wgmma:bm=128,bn=128,bk=64,st=6,c=2,sk=16"},
      {{"f16", 3, 0, 50, 264, 120, "bias_silu"}, "wgmma:bm=128,bn=128,bk=64,st=4,c=2,sk=2"},
      {{"bf16", 2, 2, 70, 512, 40, "res"}, "wgmma:bm=64,bn=128,bk=64,st=4,c=1,sk=8"},
      {{"f16", 3, 3, 200, 1032, 300, "bias_silu"}, "wgmma:bm=128,bn=256,bk=64,st=3,c=2,sk=4"},
      {{"f16", 0, 3, 33, 200, 24, ""}, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=4"},
      {{"f16", 0, 0, 320, 200, 576, ""}, "wgmma:bm=64,bn=64,bk=64,st=4,c=1,sk=3"},  /* 135 units: blocks take two */
      {{"bf16", 0, 0, 300, 448, 136, "res"}, "wgmma:bm=256,bn=128,bk=64,st=4,c=2,sk=7"},
      {{"f16", 0, 0, 512, 2048, 2560, "bias_silu"}, "wgmma:bm=128,bn=256,bk=64,st=4,c=2,sk=3"},
  };
  for (size_t i = 0; i < sizeof split / sizeof *split; i++) {
    const WgCase *c = &split[i].c;
    char what[160];
    snprintf(what, sizeof what, "%s %s[%lld,%lld] x %s[%lld,%lld]^T%s%s", c->dt, c->za ? "batched " : "", (long long)c->M,
             (long long)c->K, c->zb ? "batched " : "", (long long)c->N, (long long)c->K, c->epi[0] ? " + " : "", c->epi);
    Graph *g = wg_graph(c);
    if (!g) {
      fprintf(stderr, "%s: could not build the model\n", what);
      check_failures++;
      continue;
    }
    const char *force[1] = {split[i].tok};
    CgCudaOptions opt = {.args_aligned = true, .arch = "sm_90a", .force = force};
    Graph *cl = ir_graph_clone(g);
    int before = stats.failures;
    CHECK(h_check_graph(&e, cl, NULL, &opt, 0, false, what, &stats) == 0);
    ir_graph_destroy(cl);
    int rf = split_repeat(&e, g, split[i].tok, what);
    check_failures += rf;
    printf("%-48s %-44s %s\n", what, split[i].tok, stats.failures == before && !rf ? "ok (zero workspace, repeatable)" : "FAILED");
    ir_graph_destroy(g);
  }
  printf("%d split-K checks: %d failures in total\n", (int)(sizeof split / sizeof *split), stats.failures);
  timing(&e, "4096^3", 4096, 4096, 4096, true);
  /* the W4 prefill matmuls (512 tokens): few tiles, where split-K pays */
  timing(&e, "QKV 512x2560x2048", 512, 2560, 2048, false);
  timing(&e, "out 512x2048x2048", 512, 2048, 2048, false);
  timing(&e, "down 512x2048x5632", 512, 2048, 5632, false);
  timing(&e, "gate-up 512x11264x2048", 512, 11264, 2048, false);
  h_exec_close(&e);
  return check_done("test_cuda_wgmma");
}
