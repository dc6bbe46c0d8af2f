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
 * Then M = N = K = 4096 (f16, no epilogue), every candidate: checked on 512
 * sampled elements against a double-precision dot product on the host, and
 * timed with events (rt_cuda_time_kernels, 20 runs after a warm-up), printed
 * as TFLOP/s; plus the mma.sync kernel's default for comparison.
 *
 * Without a GPU, or on one that is not compute capability 9.0 (wgmma and
 * TMA need sm_90a), it prints SKIP and passes.
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
  char path[] = "/tmp/smelt-wgg-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  char as[64], bs[64], rs[64];
  int64_t zr = c->za > c->zb ? c->za : c->zb;
  if (c->za) snprintf(as, sizeof as, "[%lld, %lld, %lld]", (long long)c->za, (long long)c->M, (long long)c->K);
  else snprintf(as, sizeof as, "[%lld, %lld]", (long long)c->M, (long long)c->K);
  if (c->zb) snprintf(bs, sizeof bs, "[%lld, %lld, %lld]", (long long)c->zb, (long long)c->N, (long long)c->K);
  else snprintf(bs, sizeof bs, "[%lld, %lld]", (long long)c->N, (long long)c->K);
  if (zr) snprintf(rs, sizeof rs, "[%lld, %lld, %lld]", (long long)zr, (long long)c->M, (long long)c->N);
  else snprintf(rs, sizeof rs, "[%lld, %lld]", (long long)c->M, (long long)c->N);
  fprintf(fp, "smelt: 1\nname: wg\nseed: 9\ndtype: %s\ninputs:\n  x: {shape: %s}\n  w: {shape: %s}\n", c->dt, as, bs);
  if (!strcmp(c->epi, "res")) fprintf(fp, "  r: {shape: %s}\n", rs);
  fprintf(fp, "params:\n  bias: {shape: [%lld], init: {normal: 0.5}}\nnodes:\n", (long long)c->N);
  fprintf(fp, "  - {out: y0, op: matmul, in: [x, w], transpose_b: true}\n");
  const char *last = "y0";
  if (!strcmp(c->epi, "bias_silu")) {
    fprintf(fp, "  - {out: y1, op: add, in: [y0, bias]}\n  - {out: y2, op: silu, in: [y1]}\n");
    last = "y2";
  } else if (!strcmp(c->epi, "res")) {
    fprintf(fp, "  - {out: y1, op: add, in: [y0, r]}\n");
    last = "y1";
  }
  fprintf(fp, "outputs: [%s]\n", last);
  fclose(fp);
  return h_load_temp_model(path, "wg_graph");
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

/* One forced variant of the 4096^3 f16 matmul (graph g, x and w inputs of
 * values xs/ws): run once and checked on sampled elements, then timed.
 * Returns the mean milliseconds, or -1. */
static double time_variant(Exec *e, Graph *g, const char *tok, const char *arch, const uint16_t *xs, const uint16_t *ws,
                           int64_t n) {
  Kernel *k = NULL;
  int nk = 0;
  CgCudaModule *m = NULL;
  const char *force[1] = {tok};
  CgCudaOptions opt = {.args_aligned = true, .arch = arch, .force = force, .max_units = 1};
  smelt_status st = cg_lower(g, &k, &nk);
  if (!st && nk != 1) st = st_error(ST_INTERNAL, "%d kernels", nk);
  if (!st) st = cg_cuda_generate(g, k, nk, &opt, &m);
  if (!st && m->kernels[0].workspace) st = st_error(ST_UNSUPPORTED, "the timing path passes no workspace");
  if (!st) st = e->load(e, m);
  size_t bytes = (size_t)(n * n * 2);
  uint64_t buf[3] = {0, 0, 0};
  for (int i = 0; i < 3 && !st; i++) st = e->alloc(e, bytes, &buf[i]);
  if (!st) st = e->upload(e, buf[0], xs, bytes);
  if (!st) st = e->upload(e, buf[1], ws, bytes);
  double ms = -1;
  if (!st) {
    const CgCudaLaunch *l = &m->kernels[0];
    RtCudaPtr vals[3] = {buf[0], buf[1], buf[2]};
    void *params[3 + CG_MAX_TMAPS];
    _Alignas(64) unsigned char maps[CG_MAX_TMAPS][128];
    for (int i = 0; i < 3; i++) params[i] = &vals[i];
    for (int t = 0; t < l->ntmaps && !st; t++) {
      const CgCudaTmap *tm = &l->tmaps[t];
      st = rt_cuda_tensor_map(e->dev, tm->dtype, tm->rank, vals[tm->arg], tm->dims, tm->strides, tm->box, tm->swizzle,
                              maps[t]);
      params[3 + t] = maps[t];
    }
    RtCudaLaunch rl = {e->fns[0], l->name, {l->grid[0], l->grid[1], l->grid[2]}, {l->block[0], l->block[1], l->block[2]},
                       l->smem, params};
    if (!st) st = rt_cuda_launch(e->dev, &rl, 1);
    if (!st) st = rt_cuda_sync(e->dev);
    uint16_t *y = malloc(bytes);
    if (!st && y) st = e->download(e, y, buf[2], bytes);
    /* sampled elements against a double-precision dot product */
    uint64_t s = 12345;
    int bad = 0;
    for (int i = 0; i < 512 && !st && y; i++) {
      int64_t r = (int64_t)(h_rng(&s) % (uint64_t)n), c = (int64_t)(h_rng(&s) % (uint64_t)n);
      double ref = 0;
      for (int64_t kk = 0; kk < n; kk++) ref += (double)half_to_float(xs[r * n + kk]) * half_to_float(ws[c * n + kk]);
      double got = half_to_float(y[r * n + c]);
      if (!(fabs(got - ref) <= 4e-3 * (1 + fabs(ref)))) {
        if (bad++ < 4) fprintf(stderr, "%s: y[%lld, %lld] = %g, expected %g\n", tok, (long long)r, (long long)c, got, ref);
      }
    }
    free(y);
    if (bad) check_failures++;
    if (!st) st = rt_cuda_time_kernels(e->dev, &rl, 1, 20, &ms);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", tok, st_message(st));
    st_free(st);
    check_failures++;
    ms = -1;
  }
  for (int i = 0; i < 3; i++)
    if (buf[i]) e->free(e, buf[i]);
  if (m) e->unload(e);
  cg_cuda_module_free(m);
  cg_kernels_free(k, nk);
  return ms;
}

static void timing(Exec *e) {
  const int64_t n = 4096;
  WgCase c = {"f16", 0, 0, n, n, n, ""};
  Graph *g = wg_graph(&c);
  CHECK(g != NULL);
  if (!g) return;
  uint16_t *xs = malloc((size_t)(n * n * 2)), *ws = malloc((size_t)(n * n * 2));
  uint64_t s = 77;
  for (int64_t i = 0; xs && ws && i < n * n; i++) {
    double u = (double)(h_rng(&s) >> 11) / 9007199254740992.0 * 2 - 1, v = (double)(h_rng(&s) >> 11) / 9007199254740992.0 * 2 - 1;
    dt_store(DT_F16, xs, (size_t)i, u);
    dt_store(DT_F16, ws, (size_t)i, v);
  }
  char toks[16][CG_VARIANT_LEN];
  int nt = xs && ws ? variants(g, "sm_90a", "wgmma:", toks, 16) : 0;
  CHECK(nt >= 1);
  double flops = 2.0 * (double)n * n * n;
  for (int i = 0; i < nt; i++) {
    double ms = time_variant(e, g, toks[i], "sm_90a", xs, ws, n);
    if (ms > 0) printf("4096^3 f16 %-40s %8.3f ms %7.1f TFLOP/s%s\n", toks[i], ms, flops / ms * 1e-9, i == 0 ? "  (default)" : "");
  }
  char mma[4][CG_VARIANT_LEN];
  if (variants(g, NULL, "mma:", mma, 4) >= 1) {
    double ms = time_variant(e, g, mma[0], NULL, xs, ws, n);
    if (ms > 0) printf("4096^3 f16 %-40s %8.3f ms %7.1f TFLOP/s  (mma.sync, for comparison)\n", mma[0], ms, flops / ms * 1e-9);
  }
  free(xs);
  free(ws);
  ir_graph_destroy(g);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  Exec e;
  const char *skip = NULL;
  smelt_status st = h_exec_cuda(&e, &skip);
  if (st) {
    fprintf(stderr, "test_cuda_wgmma: %s\n", st_message(st));
    st_free(st);
    return 1;
  }
  if (skip) {
    printf("SKIP: %s\n", skip);
    return 0;
  }
  const RtCudaInfo *info = rt_cuda_device_info(e.dev);
  printf("device %d: %s (%s, %d SMs), NVRTC %s\n", info->ordinal, info->name, info->arch, info->sm_count,
         cg_cuda_nvrtc_version(e.nvrtc));
  if (info->cc != 90) {
    printf("SKIP: wgmma and TMA need a compute capability 9.0 GPU (this is %d.%d)\n", info->cc / 10, info->cc % 10);
    h_exec_close(&e);
    return 0;
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
  timing(&e);
  h_exec_close(&e);
  return check_done("test_cuda_wgmma");
}
