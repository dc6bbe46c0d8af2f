/* The matmul kernels on the GPU against the reference interpreter, and
 * the speed of every GEMV / tensor-core variant on the benchmark shapes.
 *
 * 1. The heuristic's choice: matmuls with fused epilogues (bias + silu,
 *    gelu + residual, relu * a tensor) are written as YAML models, fused by
 *    the default pipeline, generated, compiled with NVRTC for the GPU
 *    present and run with guard regions around every buffer
 *    (tests/gpu/harness.h), then compared element by element with the
 *    interpreter (f16 4e-3, bf16 3e-2 of 1 + |ref|).  Shapes cover every
 *    variant: M in {1, 2, 7, 8, 9, 64, 129, 1000} (GEMV up to 8, tensor
 *    cores above), K and N multiples of 8 (the mma and GEMV paths, ragged
 *    against every tile) and odd (the simple kernel), f16 and bf16, B as
 *    [K, N] and as [N, K] (transpose_b), batched with broadcast batch dims.
 *    Some cases run again with every buffer 8 bytes off (the plain-copy
 *    fallback) and with args_aligned (no run-time test).
 * 2. Every candidate (cg_cuda_variants for this GPU's arch, GEMV and mma
 *    families) on mid-sized ragged shapes: one model with one matmul per
 *    candidate, each kernel forced to its candidate (CgCudaOptions.force),
 *    checked with the interpreter as above; the split-K ones share one
 *    workspace, so one that left it dirty spoils the next.
 * 3. The W2 / W4 shapes (decode M = 1..8 and prefill M = 512, 2048; B as
 *    [N, K], the layout the pipeline gives constant weights): every
 *    candidate is run twice (the workspace must be all zero after each
 *    launch), checked on 2048 sampled outputs against a double-precision
 *    dot product on the host (the interpreter would take minutes), and
 *    timed after an L2 scrub (the kernel alone, CUDA events, mean of 10):
 *    GB/s of operands and result moved (against 4280 GB/s, the H200's
 *    measured copy bandwidth) for M <= 8, TFLOP/s above, with registers and
 *    spills per thread.  The last line names the best variant per shape.
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

/* ---- 1. the heuristic's choice ---- */

typedef struct {
  const char *dt;
  int64_t batch_a, batch_b; /* 0: no batch dim; else the operand's leading dim */
  int64_t M, K, N;
  bool tb;
  const char *epi;
} MmCase;

static Graph *mm_graph(const MmCase *c) {
  char path[] = "/tmp/smelt-mm-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  char as[64], bs[64];
  if (c->batch_a) snprintf(as, sizeof as, "[%lld, %lld, %lld]", (long long)c->batch_a, (long long)c->M, (long long)c->K);
  else snprintf(as, sizeof as, "[%lld, %lld]", (long long)c->M, (long long)c->K);
  int64_t r = c->tb ? c->N : c->K, s = c->tb ? c->K : c->N;
  if (c->batch_b) snprintf(bs, sizeof bs, "[%lld, %lld, %lld]", (long long)c->batch_b, (long long)r, (long long)s);
  else snprintf(bs, sizeof bs, "[%lld, %lld]", (long long)r, (long long)s);
  fprintf(fp, "smelt: 1\nname: mm\nseed: 11\ndtype: %s\ninputs:\n  x: {shape: %s}\n", c->dt, as);
  if (!strcmp(c->epi, "gelu_res") || !strcmp(c->epi, "mul")) fprintf(fp, "  r: {shape: [%lld]}\n", (long long)c->N);
  fprintf(fp, "params:\n  w: {shape: %s, init: {normal: 0.05}}\n  bias: {shape: [%lld], init: {normal: 0.5}}\nnodes:\n", bs,
          (long long)c->N);
  fprintf(fp, "  - {out: y0, op: matmul, in: [x, w]%s}\n", c->tb ? ", transpose_b: true" : "");
  const char *last = "y0";
  if (!strcmp(c->epi, "bias_silu")) {
    fprintf(fp, "  - {out: y1, op: add, in: [y0, bias]}\n  - {out: y2, op: silu, in: [y1]}\n");
    last = "y2";
  } else if (!strcmp(c->epi, "gelu_res")) {
    fprintf(fp, "  - {out: y1, op: gelu, in: [y0]}\n  - {out: y2, op: add, in: [y1, r]}\n");
    last = "y2";
  } else if (!strcmp(c->epi, "mul")) {
    fprintf(fp, "  - {out: y1, op: relu, in: [y0]}\n  - {out: y2, op: mul, in: [y1, r]}\n");
    last = "y2";
  }
  fprintf(fp, "outputs: [%s]\n", last);
  fclose(fp);
  return h_load_temp_model(path, path);
}

static void test_heuristic(Exec *e) {
  static const int64_t Ms[] = {1, 2, 7, 8, 9, 64, 129, 1000};
  /* (K, N) pairs: multiples of 8 ragged against 32/128-wide tiles, and odd */
  static const int64_t KN[][2] = {{64, 136}, {264, 520}, {1000, 24}, {37, 45}, {40, 21}};
  static const char *const epis[] = {"bias_silu", "gelu_res", "mul", ""};
  static const char *const dts[] = {"f16", "bf16"};
  MmCase cases[256];
  int nc = 0;
  int pick = 0;
  for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
    for (size_t kn = 0; kn < sizeof KN / sizeof *KN; kn++)
      for (int d = 0; d < 2; d++) {
        pick++;
        MmCase c = {dts[d], 0, 0, Ms[mi], KN[kn][0], KN[kn][1], pick % 3 == 0, epis[pick % 4]};
        cases[nc++] = c;
      }
  /* batched, with broadcast batch dims, through grid.z */
  cases[nc++] = (MmCase){"f16", 3, 3, 129, 64, 136, false, "bias_silu"};
  cases[nc++] = (MmCase){"bf16", 4, 0, 70, 40, 24, true, "gelu_res"};
  cases[nc++] = (MmCase){"f16", 0, 2, 2, 72, 40, false, "mul"}; /* batch only in B: GEMV over z */
  cases[nc++] = (MmCase){"f16", 5, 5, 8, 128, 64, true, ""};
  cases[nc++] = (MmCase){"f16", 2, 2, 33, 37, 45, false, "bias_silu"}; /* simple kernel, batched */
  HStats stats = {0};
  int graphs = 0;
  for (int i = 0; i < nc; i++) {
    const MmCase *c = &cases[i];
    char what[160];
    snprintf(what, sizeof what, "%s %s[%lld]x%lldx%lld%s [%s]", c->dt, c->batch_a || c->batch_b ? "batched " : "",
             (long long)c->M, (long long)c->K, (long long)c->N, c->tb ? " B^T" : "", c->epi);
    Graph *g = mm_graph(c);
    if (!g) {
      fprintf(stderr, "%s: could not build the model\n", what);
      check_failures++;
      continue;
    }
    struct {
      bool aligned_opt;
      size_t offset;
    } runs[] = {{false, 0}, {false, 8}, {true, 0}};
    int nruns = i % 4 == 0 ? 3 : 1;
    for (int r = 0; r < nruns; r++) {
      CgCudaOptions opt = {.args_aligned = runs[r].aligned_opt};
      Graph *cl = ir_graph_clone(g);
      int before = stats.failures;
      CHECK(h_check_graph(e, cl, NULL, &opt, runs[r].offset, false, what, &stats) == 0);
      if (stats.failures != before || r == 0)
        printf("%-52s %s%s\n", what, runs[r].offset ? "(8 bytes off) " : runs[r].aligned_opt ? "(args_aligned) " : "",
               stats.failures == before ? "ok" : "FAILED");
      ir_graph_destroy(cl);
      graphs++;
    }
    ir_graph_destroy(g);
  }
  printf("%d matmul graphs, %d values (%d elements) compared with the interpreter: %d failures, %d guard failures, worst %.2f of tolerance\n",
         graphs, stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
}

/* ---- 2. every candidate on ragged shapes ---- */

typedef struct {
  const char *dt;
  int64_t M, K, N;
  bool tb;
  const char *epi; /* "", "bias_silu", "silu_mul" */
} VarCase;

/* A model of `count` matmuls x @ w<i> (B an input: no pass changes its
 * layout), each with the epilogue: bias_silu silu(. + bias), silu_mul
 * silu(r) * . with r [M, N] (the SwiGLU product), "" a negation. */
static Graph *var_graph(const VarCase *c, int count) {
  char path[] = "/tmp/smelt-mmv-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  long long M = c->M, K = c->K, N = c->N;
  fprintf(fp, "smelt: 1\nname: mmv\nseed: 5\ndtype: %s\ninputs:\n  x: {shape: [%lld, %lld]}\n", c->dt, M, K);
  fprintf(fp, "  bias: {shape: [%lld]}\n  r: {shape: [%lld, %lld]}\n", N, M, N);
  for (int i = 0; i < count; i++) fprintf(fp, "  w%d: {shape: [%lld, %lld]}\n", i, c->tb ? N : K, c->tb ? K : N);
  fprintf(fp, "nodes:\n");
  for (int i = 0; i < count; i++) {
    fprintf(fp, "  - {out: mm%d, op: matmul, in: [x, w%d]%s}\n", i, i, c->tb ? ", transpose_b: true" : "");
    if (!strcmp(c->epi, "bias_silu"))
      fprintf(fp, "  - {out: e%d, op: add, in: [mm%d, bias]}\n  - {out: y%d, op: silu, in: [e%d]}\n", i, i, i, i);
    else if (!strcmp(c->epi, "silu_mul"))
      fprintf(fp, "  - {out: e%d, op: silu, in: [r]}\n  - {out: y%d, op: mul, in: [e%d, mm%d]}\n", i, i, i, i);
    else fprintf(fp, "  - {out: y%d, op: neg, in: [mm%d]}\n", i, i);
  }
  fprintf(fp, "outputs: [");
  for (int i = 0; i < count; i++) fprintf(fp, "%sy%d", i ? ", " : "", i);
  fprintf(fp, "]\n");
  fclose(fp);
  return h_load_temp_model(path, "matmul model");
}

/* The GEMV and mma candidates for the matmul of g's kernel `mm` on arch. */
static int candidates(Graph *g, const Kernel *k, const char *arch, char (*toks)[CG_VARIANT_LEN], int max) {
  char all[64][CG_VARIANT_LEN];
  int n = cg_cuda_variants(g, k, arch, all, 64), got = 0;
  for (int i = 0; i < n && got < max; i++)
    if (!strncmp(all[i], "gemv:", 5) || !strncmp(all[i], "mma:", 4)) memcpy(toks[got++], all[i], CG_VARIANT_LEN);
  return got;
}

static void test_candidates(Exec *e) {
  static const VarCase cases[] = {
      {"f16", 3, 1032, 1000, true, "bias_silu"},  /* GEMV: N ragged against every column block */
      {"bf16", 8, 2056, 520, true, "silu_mul"},
      {"f16", 1, 4104, 264, false, "bias_silu"},  /* GEMV, B [K, N] */
      {"f16", 70, 520, 2056, true, "silu_mul"},   /* mma: 70 rows, split-K candidates */
      {"bf16", 333, 1000, 520, true, ""},         /* mma: ragged against 128 / 256 tiles */
      {"f16", 200, 264, 1000, false, "bias_silu"}, /* mma, B [K, N] */
  };
  const char *arch = rt_cuda_device_info(e->dev)->arch;
  HStats stats = {0};
  int runs = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const VarCase *c = &cases[i];
    char what[160];
    snprintf(what, sizeof what, "%s [%lld x %lld] x [%lld x %lld]%s %s", c->dt, (long long)c->M, (long long)c->K,
             (long long)(c->tb ? c->N : c->K), (long long)(c->tb ? c->K : c->N), c->tb ? "^T" : "", c->epi);
    char toks[32][CG_VARIANT_LEN];
    int n = 0;
    Graph *g1 = var_graph(c, 1);
    Kernel *k = NULL;
    int nk = 0;
    if (g1 && !cg_lower(g1, &k, &nk))
      for (int j = 0; j < nk; j++)
        if (h_matmul_index(g1, &k[j]) == 0) n = candidates(g1, &k[j], arch, toks, 32);
    cg_kernels_free(k, nk);
    ir_graph_destroy(g1);
    Graph *g = n ? var_graph(c, n) : NULL;
    if (!g) {
      fprintf(stderr, "%s: no candidates or no model\n", what);
      check_failures++;
      continue;
    }
    k = NULL, nk = 0;
    CHECK_OK(cg_lower(g, &k, &nk));
    const char **force = calloc((size_t)(nk ? nk : 1), sizeof *force);
    for (int j = 0; j < nk; j++) {
      int mi = h_matmul_index(g, &k[j]);
      force[j] = mi >= 0 && mi < n ? toks[mi] : NULL;
    }
    cg_kernels_free(k, nk);
    for (int r = 0; r < 2; r++) {
      CgCudaOptions opt = {.args_aligned = r == 0, .force = force, .arch = arch};
      Graph *cl = ir_graph_clone(g);
      int before = stats.failures;
      CHECK(h_check_graph(e, cl, NULL, &opt, r ? 8 : 0, false, what, &stats) == 0);
      printf("%-48s %2d variants%s: %s\n", what, n, r ? " (8 bytes off)" : "", stats.failures == before ? "ok" : "FAILED");
      ir_graph_destroy(cl);
      runs++;
    }
    free(force);
    ir_graph_destroy(g);
  }
  printf("candidates: %d models, %d values compared with the interpreter: %d failures, %d guard failures, worst %.2f of tolerance\n",
         runs, stats.values, stats.failures, stats.guard_failures, stats.worst);
}

/* ---- 3. the W2 / W4 shapes, timed ---- */

#define COPY_GBS 4280.0 /* the H200's measured copy bandwidth (SPEC 8) */

typedef struct {
  const char *label;
  int64_t M, K, N;
  const char *epi; /* "" or "silu_mul" */
} PerfCase;

/* An L2 scrub: reads twice the L2's size, so the timed kernel finds its
 * operands in HBM as it would between the layers of a model. */
static const char scrub_source[] =
    "extern \"C\" __global__ void scrub(const int4 *p, unsigned long long n, int *sink) {\n"
    "  int acc = 0;\n"
    "  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (unsigned long long)gridDim.x * blockDim.x) {\n"
    "    const int4 v = p[i];\n"
    "    acc ^= v.x ^ v.y ^ v.z ^ v.w;\n"
    "  }\n"
    "  if (acc == 0x5eed1234) *sink = acc;\n"
    "}\n";

typedef struct {
  RtCudaModule *mod;
  RtCudaPtr buf;
  unsigned long long n16;
  void *params[3];
  RtCudaLaunch launch;
} Scrub;

static smelt_status scrub_init(Exec *e, Scrub *s) {
  memset(s, 0, sizeof *s);
  const RtCudaInfo *info = rt_cuda_device_info(e->dev);
  CgCudaBinary bin;
  memset(&bin, 0, sizeof bin);
  RETURN_IF_ERROR(cg_cuda_compile_source(e->nvrtc, scrub_source, "L2 scrub", info->arch, NULL, &bin));
  smelt_status st = rt_cuda_module_load_image(e->dev, bin.cubin, "L2 scrub", &s->mod);
  cg_cuda_binary_clear(&bin);
  RtCudaFunction fn = NULL;
  if (!st) st = rt_cuda_module_function(s->mod, "scrub", 0, &fn);
  size_t bytes = info->l2_bytes > 0 ? 2 * (size_t)info->l2_bytes : (size_t)128 << 20;
  s->n16 = bytes / 16;
  if (!st) st = rt_cuda_alloc(e->dev, bytes + 16, &s->buf);
  if (!st) st = rt_cuda_memset(e->dev, s->buf, 0, bytes + 16);
  RETURN_IF_ERROR(st);
  static RtCudaPtr sink;
  sink = s->buf + bytes;
  s->params[0] = &s->buf, s->params[1] = &s->n16, s->params[2] = &sink;
  unsigned grid = (unsigned)(info->sm_count > 0 ? info->sm_count * 8 : 1024);
  s->launch = (RtCudaLaunch){fn, "L2 scrub", {grid, 1, 1}, {256, 1, 1}, 0, s->params, false, NULL, NULL};
  return NULL;
}

static void scrub_free(Exec *e, Scrub *s) {
  if (s->buf) rt_cuda_free(e->dev, s->buf);
  rt_cuda_module_unload(s->mod);
}

/* One shape: the model, its inputs on the host and the device. */
typedef struct {
  const PerfCase *c;
  Graph *g;
  Kernel *k;
  int nk, mm;         /* the matmul's kernel */
  int x, w, r, y;     /* value ids */
  void *hx, *hw, *hr; /* host inputs */
  RtCudaPtr *buf;     /* per value */
} Perf;

static void perf_free(Exec *e, Perf *p) {
  if (p->buf)
    for (int v = 0; v < p->g->nval; v++)
      if (p->buf[v]) e->free(e, p->buf[v]);
  free(p->buf), free(p->hx), free(p->hw), free(p->hr);
  cg_kernels_free(p->k, p->nk);
  ir_graph_destroy(p->g);
  memset(p, 0, sizeof *p);
}

static int value_named(const Graph *g, const char *name) {
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].name && !strcmp(g->val[v].name, name)) return v;
  return -1;
}

static bool perf_init(Exec *e, const PerfCase *c, Perf *p) {
  memset(p, 0, sizeof *p);
  p->c = c;
  VarCase vc = {"f16", c->M, c->K, c->N, true, c->epi};
  p->g = var_graph(&vc, 1);
  if (!p->g) return false;
  smelt_status st = cg_lower(p->g, &p->k, &p->nk);
  p->mm = -1;
  for (int i = 0; !st && i < p->nk; i++)
    if (h_matmul_index(p->g, &p->k[i]) == 0) p->mm = i;
  p->x = value_named(p->g, "x"), p->w = value_named(p->g, "w0"), p->r = value_named(p->g, "r");
  p->y = value_named(p->g, "y0");
  if (!st && (p->mm < 0 || p->x < 0 || p->w < 0 || p->r < 0 || p->y < 0)) st = st_error(ST_INTERNAL, "no matmul kernel");
  p->buf = calloc((size_t)p->g->nval, sizeof *p->buf);
  for (int i = 0; !st && i < p->nk; i++)
    for (int a = 0; !st && a < p->k[i].nargs; a++) {
      int v = p->k[i].args[a];
      if (p->buf[v]) continue;
      const TensorType *t = &p->g->val[v].type;
      st = e->alloc(e, ir_type_bytes(t), &p->buf[v]);
      void *h = p->g->val[v].kind == VK_INPUT ? h_random(t, -1, 1, (uint64_t)v + 11) : NULL;
      if (!st && h) st = e->upload(e, p->buf[v], h, ir_type_bytes(t));
      if (v == p->x) p->hx = h;
      else if (v == p->w) p->hw = h;
      else if (v == p->r) p->hr = h;
      else free(h);
    }
  if (st) {
    fprintf(stderr, "%s: %s\n", c->label, st_message(st));
    st_free(st);
    perf_free(e, p);
    return false;
  }
  return true;
}

/* Compares 2048 sampled outputs (and the corners) with double-precision
 * dot products; returns the failures (printed). */
static int perf_check(const Perf *p, const void *out, const char *tok) {
  const PerfCase *c = p->c;
  uint64_t s = 12345;
  int bad = 0;
  for (int i = 0; i < 2052; i++) {
    int64_t m = i < 4 ? (i & 1) * (c->M - 1) : (int64_t)(h_rng(&s) % (uint64_t)c->M);
    int64_t n = i < 4 ? (i >> 1) * (c->N - 1) : (int64_t)(h_rng(&s) % (uint64_t)c->N);
    double acc = 0;
    for (int64_t k = 0; k < c->K; k++)
      acc += dt_load(DT_F16, p->hx, (size_t)(m * c->K + k)) * dt_load(DT_F16, p->hw, (size_t)(n * c->K + k));
    double ref = -acc;
    if (!strcmp(c->epi, "silu_mul")) {
      double rv = dt_load(DT_F16, p->hr, (size_t)(m * c->N + n));
      ref = rv / (1 + exp(-rv)) * acc;
    }
    double got = dt_load(DT_F16, out, (size_t)(m * c->N + n));
    if (!(fabs(got - ref) <= 4e-3 * (1 + fabs(ref)))) {
      if (bad < 3) fprintf(stderr, "%s %s: (%lld, %lld) is %.6g, expected %.6g\n", c->label, tok, (long long)m, (long long)n, got, ref);
      bad++;
    }
  }
  return bad;
}

/* Runs variant tok of p's matmul twice, checks it, times it; *out_ms 0 on failure. */
static int perf_run(Exec *e, Perf *p, const Scrub *sc, const char *tok, double *out_ms, RtCudaResources *out_res) {
  *out_ms = 0;
  memset(out_res, 0, sizeof *out_res);
  const char **force = calloc((size_t)p->nk, sizeof *force);
  force[p->mm] = tok;
  CgCudaOptions opt = {.args_aligned = true, .max_units = 1, .force = force, .arch = rt_cuda_device_info(e->dev)->arch};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(p->g, p->k, p->nk, &opt, &m);
  free(force);
  int fails = 0;
  const Kernel *k = &p->k[p->mm];
  uint64_t ws = 0, wsb = 0;
  void *out = NULL;
  unsigned char *wsh = NULL;
  if (!st && strcmp(m->kernels[p->mm].variant, tok) != 0)
    st = st_error(ST_INTERNAL, "the kernel recorded variant %s", m->kernels[p->mm].variant);
  if (!st) st = e->load(e, m);
  bool loaded = !st;
  for (int i = 0; !st && i < p->nk; i++)
    if (m->kernels[i].workspace > wsb) wsb = m->kernels[i].workspace;
  if (!st && wsb > 0) {
    wsh = calloc(1, (size_t)wsb);
    st = e->alloc(e, (size_t)wsb, &ws);
    if (!st) st = e->upload(e, ws, wsh, (size_t)wsb);
  }
  /* every kernel of the model in order (the matmul's fused group, and any
   * producer the fuser left outside it), twice */
  uint64_t args[257];
  int na = 0;
  for (int rep = 0; rep < 2 && !st; rep++) {
    for (int i = 0; i < p->nk && !st; i++) {
      na = p->k[i].nargs < 256 ? p->k[i].nargs : 256;
      for (int a = 0; a < na; a++) args[a] = p->buf[p->k[i].args[a]];
      if (m->kernels[i].workspace) args[na++] = ws;
      st = e->launch(e, i, args, na);
      if (!st) st = e->sync(e);
    }
    if (!st && wsb) {
      st = e->download(e, wsh, ws, (size_t)wsb);
      for (uint64_t b = 0; !st && b < wsb; b++)
        if (wsh[b]) {
          fprintf(stderr, "%s %s: launch %d left workspace byte %llu non-zero\n", p->c->label, tok, rep + 1, (unsigned long long)b);
          fails++;
          break;
        }
    }
  }
  size_t ybytes = ir_type_bytes(&p->g->val[p->y].type);
  if (!st) {
    out = malloc(ybytes);
    st = e->download(e, out, p->buf[p->y], ybytes);
  }
  if (!st) fails += perf_check(p, out, tok);
  if (!st && !fails) {
    const FmtCudaLaunch *l = &m->kernels[p->mm];
    na = k->nargs;
    for (int a = 0; a < na; a++) args[a] = p->buf[k->args[a]];
    if (l->workspace) args[na++] = ws;
    RtCudaPtr vals[257];
    void *params[257];
    for (int a = 0; a < na; a++) vals[a] = args[a], params[a] = &vals[a];
    RtCudaLaunch list[2] = {sc->launch, {e->fns[p->mm], l->name, {l->grid[0], l->grid[1], l->grid[2]},
                                         {l->block[0], l->block[1], l->block[2]}, l->smem, params, false, NULL, NULL}};
    double ms[2];
    st = rt_cuda_time_kernels(e->dev, list, 2, 10, ms);
    if (!st) *out_ms = ms[1];
    if (!st) st = rt_cuda_function_resources(e->dev, e->fns[p->mm], out_res);
  }
  if (st) {
    fprintf(stderr, "%s %s: %s\n", p->c->label, tok, st_message(st));
    st_free(st);
    fails++;
  }
  if (loaded) e->unload(e);
  if (ws) e->free(e, ws);
  free(wsh), free(out);
  fmt_cuda_module_free(m);
  return fails;
}

/* Compiles every candidate's unit in parallel into the disk cache, so the
 * runs that follow only load. */
static void prewarm(Exec *e, Perf *p, char (*toks)[CG_VARIANT_LEN], int n) {
  const char *arch = rt_cuda_device_info(e->dev)->arch;
  FmtCudaModule **mods = calloc((size_t)n, sizeof *mods);
  char **units = calloc((size_t)n, sizeof(char *));
  int nu = 0;
  for (int i = 0; i < n; i++) {
    const char **force = calloc((size_t)p->nk, sizeof *force);
    force[p->mm] = toks[i];
    CgCudaOptions opt = {.args_aligned = true, .max_units = 1, .force = force, .arch = arch};
    smelt_status st = cg_cuda_generate(p->g, p->k, p->nk, &opt, &mods[i]);
    free(force);
    if (st) {
      st_free(st); /* reported by the run */
      continue;
    }
    units[nu++] = mods[i]->units[0];
  }
  FmtCudaModule all = {.nunits = nu, .units = units};
  CgCudaBinary *bins = NULL;
  smelt_status st = cg_cuda_compile_module(e->nvrtc, &all, &arch, 1, NULL, &bins);
  if (st) st_free(st); /* the runs report it */
  else cg_cuda_binaries_free(bins, nu);
  for (int i = 0; i < n; i++) fmt_cuda_module_free(mods[i]);
  free(mods), free(units);
}

static void test_perf(Exec *e) {
  static const PerfCase cases[] = {
      {"W2 gate M=1", 1, 4096, 11008, ""},
      {"W2 up M=1", 1, 4096, 11008, "silu_mul"},
      {"W2 down M=1", 1, 11008, 4096, ""},
      {"W2 up M=4", 4, 4096, 11008, "silu_mul"},
      {"W2 up M=8", 8, 4096, 11008, "silu_mul"},
      {"W4 q/o M=1", 1, 2048, 2048, ""},
      {"W4 k/v M=1", 1, 2048, 256, ""},
      {"W4 up M=1", 1, 2048, 5632, "silu_mul"},
      {"W4 down M=1", 1, 5632, 2048, ""},
      {"W2 up M=2048", 2048, 4096, 11008, "silu_mul"},
      {"W2 down M=2048", 2048, 11008, 4096, ""},
      {"W4 q/o M=512", 512, 2048, 2048, ""},
      {"W4 k/v M=512", 512, 2048, 256, ""},
      {"W4 up M=512", 512, 2048, 5632, "silu_mul"},
      {"W4 down M=512", 512, 5632, 2048, ""},
  };
  Scrub sc;
  smelt_status st = scrub_init(e, &sc);
  if (st) {
    fprintf(stderr, "L2 scrub: %s\n", st_message(st));
    st_free(st);
    check_failures++;
    return;
  }
  char summary[4096] = "";
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    const PerfCase *c = &cases[i];
    Perf p;
    if (!perf_init(e, c, &p)) {
      check_failures++;
      continue;
    }
    char toks[32][CG_VARIANT_LEN];
    int n = candidates(p.g, &p.k[p.mm], rt_cuda_device_info(e->dev)->arch, toks, 32);
    prewarm(e, &p, toks, n);
    double flops = 2.0 * (double)c->M * (double)c->N * (double)c->K;
    double bytes = 2.0 * ((double)c->N * c->K + (double)c->M * c->K + (double)c->M * c->N * (c->epi[0] ? 2 : 1));
    printf("%s: [%lld x %lld] x [%lld x %lld]^T%s, %d variants\n", c->label, (long long)c->M, (long long)c->K,
           (long long)c->N, (long long)c->K, c->epi[0] ? " silu(r) *" : "", n);
    double best = 0;
    const char *best_tok = "";
    for (int t = 0; t < n; t++) {
      double ms;
      RtCudaResources res;
      int f = perf_run(e, &p, &sc, toks[t], &ms, &res);
      check_failures += f;
      if (f || ms <= 0) {
        printf("  %-48s FAILED\n", toks[t]);
        continue;
      }
      double gbs = bytes / (ms * 1e6), tfs = flops / (ms * 1e9);
      if (c->M <= 8)
        printf("  %-48s %8.4f ms %7.1f GB/s (%3.0f%% of copy) %3d regs %4d B local%s\n", toks[t], ms, gbs,
               100 * gbs / COPY_GBS, res.registers, res.local_bytes, t == 0 ? "  (heuristic)" : "");
      else
        printf("  %-48s %8.4f ms %7.1f TFLOP/s %7.1f GB/s %3d regs %4d B local%s\n", toks[t], ms, tfs, gbs,
               res.registers, res.local_bytes, t == 0 ? "  (heuristic)" : "");
      if (best == 0 || ms < best) best = ms, best_tok = toks[t];
    }
    if (best > 0) {
      size_t len = strlen(summary);
      snprintf(summary + len, sizeof summary - len, "\n  %-16s %8.4f ms %7.1f %s  %s", c->label, best,
               c->M <= 8 ? bytes / (best * 1e6) : flops / (best * 1e9), c->M <= 8 ? "GB/s" : "TFLOP/s", best_tok);
    }
    perf_free(e, &p);
  }
  printf("best variants:%s\n", summary);
  scrub_free(e, &sc);
}

int main(void) {
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_matmul");
  if (rc >= 0) return rc;
  test_heuristic(&e);
  test_candidates(&e);
  test_perf(&e);
  h_exec_close(&e);
  return check_done("test_cuda_matmul");
}
