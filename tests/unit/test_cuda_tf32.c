/* The TF32 tensor-core matmul (codegen/cuda/tf32.c), every variant the
 * tuner may try, without a GPU.
 *
 * For each small f32 shape (ragged M, N, K against every tile; B as
 * [N, K] and [K, N]; A as [K, M] (transpose_a); batched; fused epilogues:
 * bias + silu, gelu + residual, relu * r, or a plain negation) the tf32
 * candidates (cg_cuda_variants_tf32 for sm_90a and for portable builds)
 * and a few hand-picked tokens become one graph with one matmul per token,
 * each kernel forced to its token.  That graph
 *   - runs in the CPU emulation (tests/gpu/cuda_emu.hpp) against the
 *     reference interpreter: every output within a TF32 tolerance
 *     (relative L2 error <= 2e-3), and NOT equal to the f32 result (the
 *     operands really are rounded); guard regions around every buffer
 *     untouched.  Runs with args_aligned, and for some cases with run-time
 *     alignment tests and every buffer 4 bytes off (the plain-load
 *     fallbacks, the epilogue per element);
 *   - for the plain cases, also against an independent TF32 reference
 *     computed here in double precision from operands rounded the way
 *     cvt.rna rounds (to nearest, ties away from zero): only f32
 *     accumulation differs, so the error is ~1e-7, which a kernel that
 *     truncated instead (or rounded only one operand) would not meet;
 *   - is generated for sm_90a (arguments aligned) and, for the cases that
 *     run unaligned (every candidate among them), for sm_80 (run-time
 *     alignment tests): every kernel records the token it was forced to
 *     (sm_80 may take fewer stages), and NVRTC compiles each for its arch.
 * Around that: token syntax, and that without allow_tf32 nothing chooses
 * tf32 (heuristic, candidate lists, a tuning-table row) and a forced tf32
 * token is refused.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/cuda/cu_families.h"
#include "codegen/cuda/table.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

#define MAX_TOKENS 16
/* TF32 against f32 for K up to ~512 and operands in [-1, 1) */
#define TF32_TOL 2e-3
/* below this the result would be the f32 product: no rounding happened */
#define TF32_MIN_ERR 1e-5
/* against the TF32 reference: f32 accumulation only */
#define TF32_REF_TOL 2e-6

static CgNvrtc *nvrtc;
static CgCudaCompileOptions copts;

typedef struct {
  int64_t batch; /* 0: rank-2 operands */
  int64_t M, K, N;
  bool ta, tb;
  const char *epi;      /* "", "bias_silu", "gelu_res", "mul" */
  const char *extra[2]; /* tokens beyond the candidate lists */
  bool unaligned;       /* also without args_aligned, every buffer 4 bytes off; and compiled for sm_80 */
} Case;

/* A model with `count` matmuls x @ w<i>, each with the case's epilogue. */
static Graph *case_graph(const Case *c, int count) {
  return h_matmul_model("tf32", "f32", c->batch, c->M, c->K, c->N, c->ta, c->tb, c->epi, count);
}

/* The variant kernel "mm0" of g gets with the given options (no force). */
static void chosen_variant(Graph *g, bool allow, const CgTuneTable *table, char out[CG_VARIANT_LEN]) {
  out[0] = 0;
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CgCudaOptions opt = {.args_aligned = true, .max_units = 1, .arch = "sm_90a", .allow_tf32 = allow, .table = table};
  FmtCudaModule *m = NULL;
  CHECK_OK(cg_cuda_generate(g, k, nk, &opt, &m));
  for (int i = 0; m && i < nk; i++)
    if (h_matmul_index(g, &k[i]) == 0) snprintf(out, CG_VARIANT_LEN, "%s", m->kernels[i].variant);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
}

/* The tf32 tokens to try for case c: candidates for sm_90a and portable
 * builds, then the case's extra ones.  Checks on the way that without
 * allow_tf32 neither the lists nor the heuristic name tf32, and that with
 * it the heuristic does (M > 8: the GEMV is not eligible). */
static int case_tokens(const Case *c, char (*toks)[CG_VARIANT_LEN]) {
  int n = 0;
  Graph *g = case_graph(c, 1);
  if (!g) {
    check_failures++;
    return 0;
  }
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  for (int i = 0; i < nk; i++) {
    if (h_matmul_index(g, &k[i]) != 0) continue;
    const char *archs[] = {"sm_90a", NULL};
    for (int a = 0; a < 2; a++) {
      char got[64][CG_VARIANT_LEN];
      int ng = cg_cuda_variants(g, &k[i], archs[a], got, 64);
      CHECK(ng > 0);
      for (int j = 0; j < ng; j++) CHECK(strncmp(got[j], "tf32:", 5) != 0);
      ng = cg_cuda_variants_tf32(g, &k[i], archs[a], got, 64);
      CHECK(ng > 1);
      if (ng > 0) CHECK(!strncmp(got[0], "tf32:", 5)); /* the heuristic's first */
      for (int j = 0; j < ng; j++)
        if (!strncmp(got[j], "tf32:", 5)) h_add_token(toks, &n, MAX_TOKENS, got[j]);
    }
  }
  for (int j = 0; j < 2 && c->extra[j]; j++) h_add_token(toks, &n, MAX_TOKENS, c->extra[j]);
  cg_kernels_free(k, nk);
  /* what the compiler picks on its own */
  char v[CG_VARIANT_LEN];
  chosen_variant(g, false, NULL, v);
  CHECK(v[0] && strncmp(v, "tf32:", 5) != 0);
  chosen_variant(g, true, NULL, v);
  CHECK(!strncmp(v, "tf32:", 5));
  ir_graph_destroy(g);
  return n;
}

/* A kernel forced to tf32 token `forced` used `used`: the same tile;
 * sm_80 (163 KiB of shared memory) may run a big tile with fewer stages. */
static bool same_tile(const char *forced, const char *used, const char *arch) {
  CuTf32Params want, got;
  return cu_tf32_parse(forced, &want) && cu_tf32_parse(used, &got) && want.BM == got.BM && want.BN == got.BN &&
         want.BK == got.BK && want.WM == got.WM && want.WN == got.WN && got.stages >= 2 && got.stages <= want.stages &&
         (got.stages == want.stages || strcmp(arch, "sm_80") == 0);
}

/* Generates g for arch with the forced tokens and checks that every
 * matmul kernel recorded its token; then NVRTC compiles it for arch. */
static void generate_and_compile(Graph *g, const char **force, int nk, const char *arch, bool args_aligned,
                                 const char *what) {
  Kernel *k = NULL;
  int n = 0;
  CHECK_OK(cg_lower(g, &k, &n));
  CHECK(n == nk);
  CgCudaOptions opt = {.args_aligned = args_aligned, .max_units = 2, .force = force, .arch = arch, .allow_tf32 = true};
  check_failures += h_generate_and_compile(nvrtc, &copts, g, k, n, &opt, what, same_tile);
  cg_kernels_free(k, n);
}

/* cvt.rna.tf32.f32: to nearest, ties away from zero, 10 mantissa bits. */
static float round_tf32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;
  u &= 0xffffe000u;
  memcpy(&x, &u, 4);
  return x;
}

/* -(x @ w) in double from TF32-rounded operands: the plain case's y. */
static double *tf32_reference(const Case *c, const float *x, const float *w) {
  int64_t Z = c->batch ? c->batch : 1, M = c->M, N = c->N, K = c->K;
  double *y = calloc((size_t)(Z * M * N), sizeof *y);
  for (int64_t z = 0; y && z < Z; z++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t n = 0; n < N; n++) {
        double s = 0;
        for (int64_t k = 0; k < K; k++) {
          float a = x[z * M * K + (c->ta ? k * M + m : m * K + k)];
          float b = w[z * K * N + (c->tb ? n * K + k : k * N + n)];
          s += (double)round_tf32(a) * (double)round_tf32(b);
        }
        y[(z * M + m) * N + n] = -s;
      }
  return y;
}

/* Runs g (matmul kernels forced to their tokens) on the emulation and
 * compares every output with the interpreter; guard regions of H_GUARD
 * bytes around each buffer (offset: bytes added to every buffer). */
static void run_graph(Exec *e, const Case *c, Graph *g, const char **force, char (*toks)[CG_VARIANT_LEN],
                      bool args_aligned, size_t offset, const char *what, double *worst, double *least) {
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CgCudaOptions opt = {.args_aligned = args_aligned, .max_units = 1, .force = force, .arch = "sm_90a", .allow_tf32 = true,
                       .emulation = e->load == he_load};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, nk, &opt, &m);
  Interp *it = NULL;
  void **data = calloc((size_t)g->nval, sizeof(void *));
  uint64_t *buf = calloc((size_t)g->nval, sizeof(uint64_t));
  bool *stored = calloc((size_t)g->nval, sizeof(bool));
  bool loaded = false;
  if (!st) st = h_interp_random(g, NULL, data, &it);
  if (!st) st = e->load(e, m);
  loaded = !st;
  if (!st) st = h_upload_guarded(e, g, k, nk, data, offset, buf, stored);
  for (int i = 0; i < nk && !st; i++) {
    CHECK(m->kernels[i].workspace == 0);
    uint64_t args[256];
    int na = k[i].nargs < 256 ? k[i].nargs : 256;
    for (int a = 0; a < na; a++) args[a] = buf[k[i].args[a]] + H_GUARD + offset;
    st = e->launch(e, i, args, na);
    if (st) st = st_prefix(st, "kernel %s", k[i].name);
  }
  /* the plain case's independent reference needs x and each w<i> */
  int xv = -1;
  for (int i = 0; i < g->ninputs; i++)
    if (!strcmp(g->val[g->inputs[i]].name, "x")) xv = g->inputs[i];
  for (int v = 0; v < g->nval && !st; v++) {
    if (!stored[v] || g->val[v].name[0] != 'y') continue;
    const TensorType *t = &g->val[v].type;
    unsigned char *host = NULL;
    ssize_t guard = 0;
    st = h_download_guarded(e, g, v, buf[v], offset, &host, &guard);
    if (st) {
      free(host);
      break;
    }
    if (guard) {
      fprintf(stderr, "%s: '%s': a guard byte was overwritten\n", what, g->val[v].name);
      check_failures++;
    }
    const float *got = (const float *)(host + H_GUARD + offset);
    int64_t n = ir_type_numel(t);
    double err = h_rel_l2(got, (const float *)ir_interp_value(it, v), NULL, n);
    if (err > *worst) *worst = err;
    if (err < *least) *least = err;
    int i = atoi(g->val[v].name + 1);
    if (err > TF32_TOL || err < TF32_MIN_ERR) {
      fprintf(stderr, "%s%s: '%s' (%s): relative L2 error %.3g against f32, expected %g..%g\n", what,
              offset ? " (offset buffers)" : args_aligned ? " (args_aligned)" : "", g->val[v].name, toks[i], err,
              TF32_MIN_ERR, TF32_TOL);
      check_failures++;
    }
    char wname[16];
    snprintf(wname, sizeof wname, "w%d", i);
    int wv = -1;
    for (int j = 0; j < g->ninputs; j++)
      if (!strcmp(g->val[g->inputs[j]].name, wname)) wv = g->inputs[j];
    if (!c->epi[0] && xv >= 0 && wv >= 0) {
      double *ref = tf32_reference(c, data[xv], data[wv]);
      double e32 = ref ? h_rel_l2(got, NULL, ref, n) : INFINITY;
      if (e32 > TF32_REF_TOL) {
        fprintf(stderr, "%s: '%s' (%s): relative L2 error %.3g against the TF32 reference (rna rounding), limit %g\n",
                what, g->val[v].name, toks[i], e32, TF32_REF_TOL);
        check_failures++;
      }
      free(ref);
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

static void run_case(Exec *e, const Case *c, int *ntested, double *worst, double *least) {
  char toks[MAX_TOKENS][CG_VARIANT_LEN];
  int n = case_tokens(c, toks);
  char what[160];
  snprintf(what, sizeof what, "f32 %s[%lld x %lld]%s x [%lld x %lld]%s %s", c->batch ? "batched " : "",
           (long long)(c->ta ? c->K : c->M), (long long)(c->ta ? c->M : c->K), c->ta ? "^T" : "",
           (long long)(c->tb ? c->N : c->K), (long long)(c->tb ? c->K : c->N), c->tb ? "^T" : "", c->epi);
  Graph *g = n ? case_graph(c, n) : NULL;
  if (!g) {
    fprintf(stderr, "%s: no graph\n", what);
    check_failures++;
    return;
  }
  int nk = 0;
  smelt_status st = NULL;
  const char **force = h_force_table(g, toks, &nk, &st);
  CHECK_OK(st);
  if (!force) {
    ir_graph_destroy(g);
    return;
  }
  if (e) {
    /* args_aligned (no run-time test; the epilogue on pairs of columns when N is even); then for
     * some cases run-time alignment tests with every buffer 4 bytes off (plain loads instead of
     * cp.async, the epilogue per element).  The emulation copies with plain loads either way. */
    run_graph(e, c, g, force, toks, true, 0, what, worst, least);
    if (c->unaligned) run_graph(e, c, g, force, toks, false, 4, what, worst, least);
  }
  /* sm_90a, arguments aligned: every case; sm_80 with run-time alignment tests: the cases that run
   * unaligned (between them every candidate, the 128- and 256-row tiles included) */
  generate_and_compile(g, force, nk, "sm_90a", true, what);
  if (c->unaligned) generate_and_compile(g, force, nk, "sm_80", false, what);
  printf("%-50s %d variants:", what, n);
  for (int i = 0; i < n; i++) printf(" %s", toks[i]);
  printf("\n");
  *ntested += n;
  free(force);
  ir_graph_destroy(g);
}

/* ---- token syntax, and TF32 only when allowed ---- */

static void test_tokens(void) {
  CuTf32Params p;
  char out[CG_VARIANT_LEN];
  CHECK(cu_tf32_parse("tf32:bm=128,bn=256,bk=32,wm=64,wn=64,st=3", &p));
  CHECK(p.BM == 128 && p.BN == 256 && p.BK == 32 && p.WM == 64 && p.WN == 64 && p.stages == 3);
  cu_tf32_format(&p, out);
  CHECK(!strcmp(out, "tf32:bm=128,bn=256,bk=32,wm=64,wn=64,st=3"));
  CHECK(cu_tf32_parse("tf32:bm=32,bn=8,bk=16,wm=16,wn=8,st=2", &p));
  static const char *const bad[] = {
      "tf32:bm=128,bn=128,bk=32,wm=64,wn=32",           /* no st */
      "tf32:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1", /* no split-K */
      "tf32:bm=128,bn=128,bk=32,wm=64,wn=12,st=3",      /* wn not a multiple of 8 */
      "tf32:bm=128,bn=128,bk=24,wm=64,wn=32,st=3",      /* bk not a multiple of 16 */
      "tf32:bm=128,bn=128,bk=128,wm=64,wn=32,st=3",     /* bk > 64 */
      "tf32:bm=96,bn=128,bk=32,wm=64,wn=32,st=3",       /* bm not a multiple of wm */
      "tf32:bm=128,bn=256,bk=32,wm=128,wn=64,st=3",     /* 256 accumulators per thread */
      "tf32:bm=128,bn=128,bk=32,wm=64,wn=32,st=1",      /* one stage */
      "tf32:bm=256,bn=256,bk=32,wm=16,wn=8,st=3",       /* 16384 threads */
      "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1",
      "tf32:bm=128,bn=128,bk=32,wm=64,wn=32,st=3 ",
      "",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    bool ok = cu_tf32_parse(bad[i], &p);
    if (ok) fprintf(stderr, "accepted bad tf32 token '%s'\n", bad[i]);
    CHECK(!ok);
  }
  CuMmaParams mp;
  CHECK(!cu_mma_parse("tf32:bm=128,bn=256,bk=32,wm=64,wn=64,st=3", &mp));
  /* the defaults: W2-like 2048 x 11008 x 4096 gets the big tile; every candidate parses */
  CuGemm gm;
  memset(&gm, 0, sizeof gm);
  TensorType t = {.dt = DT_F32, .rank = 2};
  gm.at = gm.bt = gm.yt = &t;
  gm.Z = 1, gm.tb = true, gm.M = 2048, gm.N = 11008, gm.K = 4096;
  cu_tf32_default_params(&gm, &p);
  CHECK(p.BM == 128 && p.BN == 256 && p.WM == 64 && p.WN == 64);
  char toks[16][CG_VARIANT_LEN];
  int n = cu_tf32_candidates(&gm, toks, 16);
  CHECK(n >= 6);
  cu_tf32_format(&p, out);
  CHECK(n > 0 && !strcmp(toks[0], out));
  for (int i = 0; i < n; i++) CHECK(cu_tf32_parse(toks[i], &p));
}

/* Without allow_tf32: a forced tf32 token is an error, and a tuning-table
 * row naming tf32 is passed over (the heuristic's f32 kernel instead); an
 * f16 matmul never gets tf32 even when allowed, nor does a decode (M <= 8:
 * the GEMV) or a matmul with rows of a size not a multiple of 4. */
static void test_only_when_allowed(void) {
  Case c = {0, 40, 64, 48, false, true, "", {NULL}, false};
  Graph *g = case_graph(&c, 1);
  if (!g) {
    check_failures++;
    return;
  }
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  const char **force = calloc((size_t)nk, sizeof *force);
  for (int i = 0; i < nk; i++) force[i] = h_matmul_index(g, &k[i]) == 0 ? "tf32:bm=64,bn=64,bk=32,wm=32,wn=32,st=3" : NULL;
  CgCudaOptions opt = {.args_aligned = true, .max_units = 1, .arch = "sm_90a", .force = force};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, nk, &opt, &m);
  CHECK(st && st_code(st) == ST_INVALID_INPUT);
  st_free(st);
  fmt_cuda_module_free(m);
  free(force);
  /* a table row for this shape naming tf32 */
  CgTuneKey key;
  for (int i = 0; i < nk; i++)
    if (h_matmul_index(g, &k[i]) == 0) CHECK(cg_cuda_tune_key(g, &k[i], &key));
  CgTuneTable *tab = cg_tune_table_new();
  CgTuneRow row = {.m_lo = 1, .m_hi = 64};
  snprintf(row.op, sizeof row.op, "%s", key.op);
  snprintf(row.dtype, sizeof row.dtype, "%s", key.dtype);
  snprintf(row.arch, sizeof row.arch, "sm_90a");
  snprintf(row.rest, sizeof row.rest, "%s", key.rest);
  snprintf(row.variant, sizeof row.variant, "tf32:bm=32,bn=64,bk=16,wm=16,wn=32,st=2");
  cg_tune_table_put(tab, &row);
  char v[CG_VARIANT_LEN];
  chosen_variant(g, false, tab, v);
  CHECK(!strcmp(v, "simple"));
  chosen_variant(g, true, tab, v);
  CHECK(!strcmp(v, "tf32:bm=32,bn=64,bk=16,wm=16,wn=32,st=2"));
  cg_tune_table_free(tab);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
  /* decode: the GEMV; K = 30 (rows of 120 bytes): simple */
  static const Case others[] = {{0, 4, 64, 48, false, true, "", {NULL}, false}, {0, 40, 30, 48, false, true, "", {NULL}, false}};
  for (int i = 0; i < 2; i++) {
    g = case_graph(&others[i], 1);
    if (!g) {
      check_failures++;
      continue;
    }
    chosen_variant(g, true, NULL, v);
    CHECK(!strncmp(v, i == 0 ? "gemv:" : "simple", i == 0 ? 5 : 6));
    ir_graph_destroy(g);
  }
}

int main(void) {
  char dir[] = "/tmp/smelt-tf32-cache-XXXXXX";
  bool dir_ok;
  nvrtc = h_nvrtc_open(dir, &copts, &dir_ok);
  CHECK(dir_ok);
  test_tokens();
  test_only_when_allowed();
  static const Case cases[] = {
      /* ragged M, N, K against every tile (K = 200: a partial last k-tile of every BK); tiles whose
       * rows of chunks the threads do not divide (B: 18 chunks a row for 96 threads; A [K, M]: 12 for 32) */
      {0, 70, 200, 136, false, true, "bias_silu", {"tf32:bm=64,bn=64,bk=16,wm=16,wn=32,st=5"}, true},
      {0, 70, 200, 136, false, false, "gelu_res",
       {"tf32:bm=32,bn=64,bk=64,wm=32,wn=16,st=2", "tf32:bm=32,bn=72,bk=16,wm=32,wn=24,st=2"}, false},
      /* K = 512, plain: against the TF32 reference too */
      {0, 33, 512, 40, false, true, "", {"tf32:bm=32,bn=32,bk=16,wm=16,wn=8,st=3"}, true},
      /* A given as [K, M]; N odd with B [N, K] (per-element epilogue) */
      {0, 36, 100, 44, true, false, "", {"tf32:bm=32,bn=32,bk=32,wm=16,wn=16,st=4", "tf32:bm=48,bn=32,bk=16,wm=48,wn=32,st=2"},
       false},
      {0, 50, 96, 37, false, true, "mul", {NULL}, true},
      /* A [K, M] and B [N, K] together, batched */
      {3, 68, 20, 24, true, true, "gelu_res", {NULL}, false},
      /* batched; 10 x 2 tiles of 32 x 32: raster groups of 8 and 2 tile rows */
      {2, 40, 64, 48, false, false, "", {"tf32:bm=32,bn=32,bk=16,wm=16,wn=16,st=2"}, false},
      {0, 300, 48, 40, false, true, "bias_silu", {"tf32:bm=32,bn=32,bk=16,wm=16,wn=16,st=2"}, true},
  };
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) printf("SKIP: emulated runs: %s\n", skip);
  int ntested = 0;
  double worst = 0, least = INFINITY;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(skip ? NULL : &e, &cases[i], &ntested, &worst, &least);
  if (!skip) {
    printf("emulated: %d variants, relative L2 error against f32 %.3g .. %.3g (limit %g)\n", ntested, least, worst,
           TF32_TOL);
    h_exec_close(&e);
  }
  cg_cuda_nvrtc_close(nvrtc);
  rmdir(dir);
  return check_done("test_cuda_tf32");
}
