/* The TF32 tensor-core matmul (codegen/cuda/tf32.c) on the GPU.
 *
 * 1. Every tf32 candidate (cg_cuda_variants_tf32 for this GPU's arch) on
 *    ragged shapes (M, N, K not multiples of the tiles; B as [N, K] and
 *    [K, N]; A as [K, M]; batched; fused epilogues): one model with one
 *    matmul per candidate, each kernel forced to its candidate, run with
 *    guard regions around every buffer and compared with the reference
 *    interpreter: relative L2 error <= 1e-3 (TF32 operands: ~2.6e-4 for
 *    inputs in [-1, 1), whatever K) and >= 1e-5 (the operands really were
 *    rounded: f32 would give ~1e-7).
 * 2. Every candidate at 1024 x 1024 x 1024 (B [K, N]; the interpreter's
 *    full result) and 2048 x 4096 x 4096 (B [N, K], the layout the
 *    pipeline gives weights; 4096 sampled outputs against double-precision
 *    dot products on the host: the interpreter would take minutes), with
 *    its time (CUDA events, mean of 10) in TFLOP/s, registers and spills.
 * 3. The bundle path: an f32 matmul model compiled with --allow-tf32
 *    (smelt_compile, allow_tf32 = 1) records allow_tf32=1 in the manifest
 *    and a tf32 variant (`smelt inspect --kernels`), and a CUDA session
 *    runs it within the TF32 tolerance; compiled without it, no tf32 kernel
 *    and the f32 result (relative L2 <= 1e-5).
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <libgen.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "compiler/driver.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

#define TF32_TOL 1e-3
#define TF32_MIN_ERR 1e-5
#define MAX_TOKENS 24

static double rel_l2(const float *got, const float *ref, int64_t n) { return h_rel_l2(got, ref, NULL, n); }

static int value_named(const Graph *g, const char *name) {
  for (int v = 0; v < g->nval; v++)
    if (g->val[v].name && !strcmp(g->val[v].name, name)) return v;
  return -1;
}

typedef struct {
  int64_t batch, M, K, N;
  bool ta, tb;
  const char *epi; /* "", "bias_silu", "gelu_res", "mul" */
} Case;

/* `count` matmuls x @ w<i> with the case's epilogue, outputs y<i>. */
static Graph *case_graph(const Case *c, int count) {
  return h_matmul_model("gtf32", "f32", c->batch, c->M, c->K, c->N, c->ta, c->tb, c->epi, count);
}

/* The tf32 candidates of case c's matmul for arch (at most max). */
static int case_tokens(const Case *c, const char *arch, char (*toks)[CG_VARIANT_LEN], int max) {
  Graph *g = case_graph(c, 1);
  if (!g) return 0;
  Kernel *k = NULL;
  int nk = 0, n = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  for (int i = 0; i < nk; i++) {
    if (h_matmul_index(g, &k[i]) != 0) continue;
    char got[64][CG_VARIANT_LEN];
    int ng = cg_cuda_variants_tf32(g, &k[i], arch, got, 64);
    for (int j = 0; j < ng && n < max; j++)
      if (!strncmp(got[j], "tf32:", 5)) memcpy(toks[n++], got[j], CG_VARIANT_LEN);
  }
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
  return n;
}

/* Runs g (matmul kernels forced: force per kernel) on the GPU with guard
 * regions and compares every output y<i> with the interpreter. */
static void run_checked(Exec *e, Graph *g, const char **force, char (*toks)[CG_VARIANT_LEN], const char *what,
                        double *worst, double *least) {
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CgCudaOptions opt = {.args_aligned = true, .max_units = 4, .force = force,
                       .arch = rt_cuda_device_info(e->dev)->arch, .allow_tf32 = true};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, nk, &opt, &m);
  for (int i = 0; !st && i < nk; i++)
    if (force[i] && strcmp(m->kernels[i].variant, force[i]) != 0)
      st = st_error(ST_INTERNAL, "kernel %s was forced to %s but used %s", k[i].name, force[i], m->kernels[i].variant);
  Interp *it = NULL;
  void **data = calloc((size_t)g->nval, sizeof(void *));
  uint64_t *buf = calloc((size_t)g->nval, sizeof(uint64_t));
  bool *stored = calloc((size_t)g->nval, sizeof(bool));
  if (!st) st = h_interp_random(g, NULL, data, &it);
  if (!st) st = e->load(e, m);
  bool loaded = !st;
  if (!st) st = h_upload_guarded(e, g, k, nk, data, 0, buf, stored);
  for (int i = 0; i < nk && !st; i++) {
    uint64_t args[256];
    int na = k[i].nargs < 256 ? k[i].nargs : 256;
    for (int a = 0; a < na; a++) args[a] = buf[k[i].args[a]] + H_GUARD;
    st = e->launch(e, i, args, na);
    if (!st) st = e->sync(e);
    if (st) st = st_prefix(st, "kernel %s", k[i].name);
  }
  for (int v = 0; v < g->nval && !st; v++) {
    if (!stored[v] || g->val[v].name[0] != 'y') continue;
    const TensorType *t = &g->val[v].type;
    unsigned char *host = NULL;
    ssize_t guard = 0;
    st = h_download_guarded(e, g, v, buf[v], 0, &host, &guard);
    if (st) {
      free(host);
      break;
    }
    if (guard) {
      fprintf(stderr, "%s: '%s': a guard byte was overwritten\n", what, g->val[v].name);
      check_failures++;
    }
    double err = rel_l2((const float *)(host + H_GUARD), (const float *)ir_interp_value(it, v), ir_type_numel(t));
    if (err > *worst) *worst = err;
    if (err < *least) *least = err;
    if (!(err <= TF32_TOL && err >= TF32_MIN_ERR)) {
      fprintf(stderr, "%s: '%s' (%s): relative L2 error %.3g against f32, expected %g..%g\n", what, g->val[v].name,
              toks[atoi(g->val[v].name + 1)], err, TF32_MIN_ERR, TF32_TOL);
      check_failures++;
    }
    free(host);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
  }
  if (loaded) e->unload(e);
  h_free_guarded(e, g, buf, stored, data);
  ir_interp_destroy(it);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
}

/* ---- 1. every candidate on ragged shapes ---- */

static void test_ragged(Exec *e) {
  static const Case cases[] = {
      {0, 70, 200, 136, false, true, "bias_silu"}, {0, 70, 200, 136, false, false, "gelu_res"},
      {0, 33, 512, 40, false, true, ""},           {0, 36, 100, 44, true, false, ""},
      {0, 50, 96, 37, false, true, "mul"},         {2, 40, 64, 48, false, false, ""},
      {0, 300, 1000, 520, false, true, "bias_silu"}, {3, 132, 260, 264, true, true, "gelu_res"},
  };
  const char *arch = rt_cuda_device_info(e->dev)->arch;
  double worst = 0, least = INFINITY;
  int total = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
    const Case *c = &cases[ci];
    char toks[MAX_TOKENS][CG_VARIANT_LEN];
    int n = case_tokens(c, arch, toks, MAX_TOKENS);
    CHECK(n > 1);
    char what[160];
    snprintf(what, sizeof what, "f32 %s[%lld x %lld]%s x [%lld x %lld]%s %s", c->batch ? "batched " : "",
             (long long)(c->ta ? c->K : c->M), (long long)(c->ta ? c->M : c->K), c->ta ? "^T" : "",
             (long long)(c->tb ? c->N : c->K), (long long)(c->tb ? c->K : c->N), c->tb ? "^T" : "", c->epi);
    Graph *g = n ? case_graph(c, n) : NULL;
    if (!g) {
      check_failures++;
      continue;
    }
    int nk = 0;
    smelt_status st = NULL;
    const char **force = h_force_table(g, toks, &nk, &st);
    CHECK_OK(st);
    if (!force) {
      ir_graph_destroy(g);
      continue;
    }
    run_checked(e, g, force, toks, what, &worst, &least);
    printf("%-52s %d tf32 variants\n", what, n);
    total += n;
    free(force);
    ir_graph_destroy(g);
  }
  printf("ragged: %d variants, relative L2 error against f32 %.3g .. %.3g (limits %g .. %g)\n", total, least, worst,
         TF32_MIN_ERR, TF32_TOL);
}

/* ---- 2. big shapes: every candidate, checked and timed ---- */

/* One matmul y0 = -(x @ w0) of case c, each candidate forced in turn. */
static void test_big(Exec *e, const Case *c, bool use_interp) {
  const char *arch = rt_cuda_device_info(e->dev)->arch;
  char toks[MAX_TOKENS][CG_VARIANT_LEN];
  int n = case_tokens(c, arch, toks, MAX_TOKENS);
  CHECK(n > 1);
  Graph *g = case_graph(c, 1);
  if (!g) {
    check_failures++;
    return;
  }
  Kernel *k = NULL;
  int nk = 0, mm = -1;
  CHECK_OK(cg_lower(g, &k, &nk));
  for (int i = 0; i < nk; i++)
    if (h_matmul_index(g, &k[i]) == 0) mm = i;
  int xv = value_named(g, "x"), wv = value_named(g, "w0"), yv = value_named(g, "y0");
  bool shape_ok = mm >= 0 && nk == 1 && k[0].nargs == 3 && xv >= 0 && wv >= 0 && yv >= 0;
  CHECK(shape_ok);
  if (!shape_ok) {
    cg_kernels_free(k, nk);
    ir_graph_destroy(g);
    return;
  }
  const TensorType *xt = &g->val[xv].type, *wt = &g->val[wv].type, *yt = &g->val[yv].type;
  float *hx = h_random(xt, -1, 1, 21), *hw = h_random(wt, -1, 1, 22);
  int64_t ny = ir_type_numel(yt);
  float *ref = NULL, *got = malloc((size_t)ny * 4);
  /* the reference: the interpreter's whole result, or 4096 sampled outputs in double */
  int64_t samples[4096];
  float sref[4096];
  int ns = 0;
  smelt_status st = NULL;
  if (use_interp) {
    Interp *it = NULL;
    st = ir_interp_create(g, &it);
    if (!st) st = ir_interp_set_input(it, xv, hx);
    if (!st) st = ir_interp_set_input(it, wv, hw);
    for (int i = 0; i < g->ninputs && !st; i++) {
      int v = g->inputs[i];
      if (v == xv || v == wv) continue;
      void *d = h_random(&g->val[v].type, -1, 1, (uint64_t)v);
      st = ir_interp_set_input(it, v, d);
      free(d);
    }
    if (!st) st = ir_interp_run(it);
    if (!st) {
      ref = malloc((size_t)ny * 4);
      memcpy(ref, ir_interp_value(it, yv), (size_t)ny * 4);
    }
    ir_interp_destroy(it);
  } else {
    uint64_t s = 777;
    for (ns = 0; ns < 4096; ns++) {
      int64_t m = (int64_t)(h_rng(&s) % (uint64_t)c->M), nn = (int64_t)(h_rng(&s) % (uint64_t)c->N);
      double acc = 0;
      for (int64_t kk = 0; kk < c->K; kk++)
        acc += (double)hx[c->ta ? kk * c->M + m : m * c->K + kk] * hw[c->tb ? nn * c->K + kk : kk * c->N + nn];
      samples[ns] = m * c->N + nn;
      sref[ns] = (float)-acc;
    }
  }
  uint64_t bx = 0, bw = 0, by = 0;
  if (!st) st = e->alloc(e, ir_type_bytes(xt), &bx);
  if (!st) st = e->alloc(e, ir_type_bytes(wt), &bw);
  if (!st) st = e->alloc(e, ir_type_bytes(yt), &by);
  if (!st) st = e->upload(e, bx, hx, ir_type_bytes(xt));
  if (!st) st = e->upload(e, bw, hw, ir_type_bytes(wt));
  double flops = 2.0 * (double)(c->batch ? c->batch : 1) * c->M * c->N * c->K;
  printf("%lld x %lld x %lld (B %s), %d tf32 variants:\n", (long long)c->M, (long long)c->N, (long long)c->K,
         c->tb ? "[N, K]" : "[K, N]", n);
  for (int t = 0; t < n && !st; t++) {
    const char *force[1] = {toks[t]};
    CgCudaOptions opt = {.args_aligned = true, .max_units = 1, .force = force, .arch = arch, .allow_tf32 = true};
    FmtCudaModule *m = NULL;
    smelt_status ts = cg_cuda_generate(g, k, nk, &opt, &m);
    if (!ts) ts = e->load(e, m);
    bool loaded = !ts;
    uint64_t args[3];
    for (int a = 0; a < k[0].nargs && a < 3; a++) {
      int v = k[0].args[a];
      args[a] = v == xv ? bx : v == wv ? bw : by;
    }
    if (!ts) ts = e->launch(e, 0, args, k[0].nargs);
    if (!ts) ts = e->sync(e);
    if (!ts) ts = e->download(e, got, by, (size_t)ny * 4);
    double err = INFINITY;
    if (!ts && ref) err = rel_l2(got, ref, ny);
    else if (!ts) {
      float gs[4096];
      for (int i = 0; i < ns; i++) gs[i] = got[samples[i]];
      err = rel_l2(gs, sref, ns);
    }
    double ms = 0;
    RtCudaResources res = {0};
    if (!ts) {
      const FmtCudaLaunch *l = &m->kernels[0];
      RtCudaPtr vals[3];
      void *params[3];
      for (int a = 0; a < 3; a++) vals[a] = args[a], params[a] = &vals[a];
      RtCudaLaunch rl = {e->fns[0], l->name, {l->grid[0], l->grid[1], l->grid[2]}, {l->block[0], l->block[1], l->block[2]},
                         l->smem, params, false, NULL, NULL};
      ts = rt_cuda_time_kernels(e->dev, &rl, 1, 10, &ms);
      if (!ts) ts = rt_cuda_function_resources(e->dev, e->fns[0], &res);
    }
    if (ts) {
      fprintf(stderr, "  %s: %s\n", toks[t], st_message(ts));
      st_free(ts);
      check_failures++;
    } else {
      bool ok = err <= TF32_TOL && err >= TF32_MIN_ERR;
      printf("  %-46s %8.4f ms %6.1f TFLOP/s relL2 %.2e %3d regs %4d B local%s%s\n", toks[t], ms, flops / (ms * 1e9),
             err, res.registers, res.local_bytes, t == 0 ? "  (heuristic)" : "", ok ? "" : "  FAILED");
      if (!ok) check_failures++;
    }
    if (loaded) e->unload(e);
    fmt_cuda_module_free(m);
  }
  if (st) {
    fprintf(stderr, "big shape: %s\n", st_message(st));
    st_free(st);
    check_failures++;
  }
  if (bx) e->free(e, bx);
  if (bw) e->free(e, bw);
  if (by) e->free(e, by);
  free(hx), free(hw), free(ref), free(got);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
}

/* ---- 3. the bundle path ---- */

static const char bundle_model[] =
    "smelt: 1\nname: tf32_mm\nseed: 9\ndtype: f32\n"
    "inputs:\n  x: {shape: [300, 512]}\n"
    "params:\n  w: {shape: [520, 512], init: {normal: 0.044}}\n  b: {shape: [520], init: {normal: 0.1}}\n"
    "nodes:\n  - {out: h, op: matmul, in: [x, w], transpose_b: true}\n  - {out: y, op: add, in: [h, b]}\n"
    "outputs: [y]\n";

/* Runs `cmd`; true when it exits 0 and its output has `expect` (and not `reject`). */
static bool cli_has(const char *cmd, const char *expect, const char *reject) {
  FILE *p = popen(cmd, "r");
  if (!p) return false;
  static char out[65536];
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  bool ok = rc == 0 && (!expect || strstr(out, expect)) && (!reject || !strstr(out, reject));
  if (!ok) fprintf(stderr, "%s (exit status %d):\n%s\n", cmd, rc, out);
  return ok;
}

static void test_bundle(const char *smelt) {
  char model[] = "/tmp/smelt-tf32-model-XXXXXX";
  int fd = mkstemp(model);
  if (fd < 0 || write(fd, bundle_model, sizeof bundle_model - 1) != (ssize_t)(sizeof bundle_model - 1)) {
    CHECK(0);
    return;
  }
  close(fd);
  char yaml[64], bundle[64];
  snprintf(yaml, sizeof yaml, "%s.yaml", model);
  CHECK(rename(model, yaml) == 0);
  snprintf(bundle, sizeof bundle, "%s.smelt", model);
  /* the reference */
  FeOptions fo = {0};
  Graph *g = NULL;
  CHECK_OK(fe_load_yaml(yaml, &fo, &g));
  if (!g) return;
  int xv = value_named(g, "x"), yv = value_named(g, "y");
  float *x = h_random(&g->val[xv].type, -1, 1, 5);
  int64_t ny = ir_type_numel(&g->val[yv].type);
  float *ref = malloc((size_t)ny * 4), *y = malloc((size_t)ny * 4);
  Interp *it = NULL;
  CHECK_OK(ir_interp_create(g, &it));
  CHECK_OK(ir_interp_set_input(it, xv, x));
  CHECK_OK(ir_interp_run(it));
  memcpy(ref, ir_interp_value(it, yv), (size_t)ny * 4);
  ir_interp_destroy(it);
  for (int allow = 1; allow >= 0; allow--) {
    smelt_compile_options co = {.targets = "cuda", .allow_tf32 = allow};
    smelt_status st = smelt_compile(yaml, &co, bundle);
    smelt_bundle *b = NULL;
    smelt_session *s = NULL;
    if (!st) st = smelt_bundle_open(bundle, &b);
    if (!st) {
      const char *mv = rt_bundle_manifest_get(b, "allow_tf32");
      CHECK(mv && !strcmp(mv, allow ? "1" : "0"));
    }
    if (!st) st = smelt_session_create(b, "cuda", NULL, &s);
    if (!st) st = smelt_session_bind_input(s, "x", x, ir_type_bytes(&g->val[xv].type));
    if (!st) st = smelt_session_bind_output(s, "y", y, (size_t)ny * 4);
    if (!st) st = smelt_session_run(s);
    if (st) {
      fprintf(stderr, "bundle (allow_tf32 %d): %s\n", allow, smelt_status_message(st));
      smelt_status_free(st);
      check_failures++;
    } else {
      double err = rel_l2(y, ref, ny);
      bool ok = allow ? err <= TF32_TOL && err >= TF32_MIN_ERR : err <= 1e-5;
      printf("bundle compiled %s --allow-tf32: relative L2 error %.3g against f32%s\n", allow ? "with" : "without", err,
             ok ? "" : "  FAILED");
      CHECK(ok);
    }
    smelt_session_destroy(s);
    smelt_bundle_close(b);
    /* the CLI: what inspect --kernels shows */
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "%s compile %s -o %s --target cuda --no-tune-table%s 2>&1 && %s inspect %s --kernels", smelt,
             yaml, bundle, allow ? " --allow-tf32" : "", smelt, bundle);
    bool ok = allow ? cli_has(cmd, "tf32:", NULL) : cli_has(cmd, "simple", "tf32:");
    printf("%-6s %s\n", ok ? "ok" : "FAILED", cmd);
    CHECK(ok);
    snprintf(cmd, sizeof cmd, "%s inspect %s", smelt, bundle);
    CHECK(cli_has(cmd, allow ? "allow_tf32=1" : "allow_tf32=0", NULL));
  }
  unlink(bundle);
  unlink(yaml);
  free(x), free(ref), free(y);
  ir_graph_destroy(g);
}

int main(int argc, char **argv) {
  (void)argc;
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_tf32");
  if (rc >= 0) return rc;
  test_ragged(&e);
  static const Case big[] = {{0, 1024, 1024, 1024, false, false, ""}, {0, 2048, 4096, 4096, false, true, ""}};
  test_big(&e, &big[0], true);
  test_big(&e, &big[1], false);
  /* the smelt binary sits next to this test in the build directory */
  char self[4096], smelt[4200];
  snprintf(self, sizeof self, "%s", argv[0]);
  snprintf(smelt, sizeof smelt, "%s/smelt", dirname(self));
  test_bundle(smelt);
  h_exec_close(&e);
  return check_done("test_cuda_tf32");
}
