/* The GEMV and tensor-core (mma.sync) matmul variants, every one the tuner
 * may try, without a GPU.
 *
 * For each small shape (ragged against every tile and slice: M = 1..8 for
 * the GEMV, 33..70 for mma; K and N multiples of 8 but not of the tiles;
 * f16, bf16, f32; B as [N, K] and [K, N]; batched; fused epilogues) the
 * candidate tokens (cg_cuda_variants for sm_90a and for portable builds,
 * the families' own lists) and a few hand-picked ones (split-K into 3 or 5
 * slices, which no heuristic picks) become one graph with one matmul per
 * token, each kernel forced to its token (CgCudaOptions.force).  That graph
 *   - runs in the CPU emulation (tests/gpu/cuda_emu.hpp) against the
 *     reference interpreter (h_check_graph: every stored element, guard
 *     regions), with run-time alignment tests, with every buffer 8 bytes
 *     off (the plain-load fallbacks) and with args_aligned.  Then once
 *     more on one zeroed workspace, which must be all zero again after the
 *     kernels ran (a kernel that left counters or partial sums behind would
 *     break the next kernel that keeps its counters there);
 *   - is generated for sm_90a (arguments aligned) and for sm_80 (run-time
 *     alignment tests and fallbacks): every kernel records the token it was
 *     forced to (l->variant), and NVRTC compiles each for its arch.
 * Around that: token syntax (round trips, rejection of malformed tokens),
 * the default first in each candidate list, every candidate parsing back.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/cuda/cu_families.h"
#include "codegen/lower.h"
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

#define MAX_TOKENS 24

static CgNvrtc *nvrtc;
static CgCudaCompileOptions copts;

typedef struct {
  const char *dt;
  int64_t batch; /* 0: rank-2 operands */
  int64_t M, K, N;
  bool tb;
  const char *epi; /* "", "bias_silu", "gelu_res", "mul", "glu" (N: half the matmul's columns),
                    * "norm" (rms_norm of x in the GEMV's loads) */
  const char *extra[3]; /* tokens beyond the candidate lists */
  bool all_runs;        /* also with args_aligned */
} Case;

/* Ends the model being written to fp (outputs y0 .. y<count-1>), loads
 * it through the pipeline for a CUDA-only target (its epilogue and
 * prologue rules) and checks that each product is one kernel. */
static Graph *finish_cuda_model(FILE *fp, const char *path, int count, const char *what) {
  fprintf(fp, "outputs: [");
  for (int i = 0; i < count; i++) fprintf(fp, "%sy%d", i ? ", " : "", i);
  fprintf(fp, "]\n");
  fclose(fp);
  Graph *g = h_load_temp_model_for(path, what, "cuda");
  if (!g) check_failures++;
  else CHECK(g->ngroups == count);
  return g;
}

/* A model with `count` gated pairs as merge-matmuls leaves them: x @ w<i>
 * of 2 N columns interleaved, silu(columns 0, 2, ...) * (columns 1, 3, ...),
 * through the pipeline for a CUDA-only target, where fuse puts both
 * halves and the product into the matmul's epilogue (one kernel each). */
static Graph *glu_graph(const Case *c, int count) {
  char path[] = "/tmp/smelt-glu-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  long long M = c->M, K = c->K, N2 = 2 * c->N;
  fprintf(fp, "smelt: 1\nname: glu\nseed: 3\ndtype: %s\ninputs:\n  x: {shape: [%lld, %lld]}\n", c->dt, M, K);
  for (int i = 0; i < count; i++)
    fprintf(fp, "  w%d: {shape: [%lld, %lld]}\n", i, c->tb ? N2 : K, c->tb ? K : N2);
  fprintf(fp, "nodes:\n");
  for (int i = 0; i < count; i++)
    fprintf(fp,
            "  - {out: mm%d, op: matmul, in: [x, w%d]%s}\n"
            "  - {out: g%d, op: slice, in: [mm%d], axis: -1, start: 0, end: %lld, step: 2}\n"
            "  - {out: u%d, op: slice, in: [mm%d], axis: -1, start: 1, end: %lld, step: 2}\n"
            "  - {out: s%d, op: silu, in: [g%d]}\n  - {out: y%d, op: mul, in: [s%d, u%d]}\n",
            i, i, c->tb ? ", transpose_b: true" : "", i, i, N2, i, i, N2, i, i, i, i, i);
  /* the halves and the product are in the matmul's kernel */
  return finish_cuda_model(fp, path, count, "glu model");
}

/* A model with `count` products rms_norm(x, gamma) @ w<i>^T + r, each norm
 * with its own eps (cse keeps them apart), through the pipeline for a
 * CUDA-only target, where fuse computes each norm in its GEMV's loads (the
 * row's mean square in every warp) and the add in its epilogue: one
 * kernel each. */
static Graph *norm_graph(const Case *c, int count) {
  char path[] = "/tmp/smelt-norm-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return NULL;
  FILE *fp = fdopen(fd, "w");
  long long M = c->M, K = c->K, N = c->N;
  fprintf(fp, "smelt: 1\nname: normmm\nseed: 3\ndtype: %s\ninputs:\n  x: {shape: [%lld, %lld]}\n", c->dt, M, K);
  fprintf(fp, "  gamma: {shape: [%lld]}\n  r: {shape: [%lld]}\n", K, N);
  for (int i = 0; i < count; i++) fprintf(fp, "  w%d: {shape: [%lld, %lld]}\n", i, N, K);
  fprintf(fp, "nodes:\n");
  for (int i = 0; i < count; i++)
    fprintf(fp,
            "  - {out: h%d, op: rms_norm, in: [x, gamma], eps: %g}\n"
            "  - {out: mm%d, op: matmul, in: [h%d, w%d], transpose_b: true}\n"
            "  - {out: y%d, op: add, in: [mm%d, r]}\n",
            i, 1e-5 * (i + 1), i, i, i, i, i);
  /* each norm in its matmul's kernel */
  return finish_cuda_model(fp, path, count, "norm model");
}

/* A model with `count` matmuls x @ w<i>, each with the case's epilogue. */
static Graph *case_graph(const Case *c, int count) {
  if (!strcmp(c->epi, "glu")) return glu_graph(c, count);
  if (!strcmp(c->epi, "norm")) return norm_graph(c, count);
  return h_matmul_model("gemm", c->dt, c->batch, c->M, c->K, c->N, false, c->tb, c->epi, count);
}

static bool family_tested(const char *tok) { return !strncmp(tok, "gemv:", 5) || !strncmp(tok, "mma:", 4); }

/* The tokens to try for case c: candidates for sm_90a and portable builds
 * (GEMV and mma only), then the case's extra ones. */
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
      char got[32][CG_VARIANT_LEN];
      int ng = cg_cuda_variants(g, &k[i], archs[a], got, 32);
      CHECK(ng > 0);
      /* the first is the heuristic's: for portable builds GEMV for M <= 8, else mma (tensor cores
       * apply to every case here); sm_90a may prefer wgmma */
      if (ng > 0 && !archs[a]) CHECK(!strncmp(got[0], c->M <= 8 ? "gemv:" : "mma:", c->M <= 8 ? 5 : 4));
      for (int j = 0; j < ng; j++) {
        if (family_tested(got[j])) h_add_token(toks, &n, MAX_TOKENS, got[j]);
        /* a norm in the loads: only the GEMV computes it, the tuner is not offered the simple kernel */
        if (!strcmp(c->epi, "norm")) CHECK(strcmp(got[j], "simple") != 0);
      }
    }
  }
  for (int j = 0; j < 3 && c->extra[j]; j++) h_add_token(toks, &n, MAX_TOKENS, c->extra[j]);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
  return n;
}

/* A kernel forced to `forced` used it. */
static bool same_token(const char *forced, const char *used, const char *arch) {
  (void)arch;
  return strcmp(forced, used) == 0;
}

/* Generates g for arch with the forced tokens and checks that every
 * matmul kernel recorded its token; then NVRTC compiles it for arch (two
 * units, compiled in parallel). */
static void generate_and_compile(Graph *g, const char **force, int nk, const char *arch, bool args_aligned,
                                 const char *what) {
  Kernel *k = NULL;
  int n = 0;
  CHECK_OK(cg_lower(g, &k, &n));
  CHECK(n == nk);
  CgCudaOptions opt = {.args_aligned = args_aligned, .max_units = 2, .force = force, .arch = arch};
  check_failures += h_generate_and_compile(nvrtc, &copts, g, k, n, &opt, what, same_token);
  cg_kernels_free(k, n);
}

/* Runs every kernel of g (forced) once, in order, on one zeroed workspace
 * of the largest size any of them asks for, and checks the workspace is all
 * zero afterwards (the contract of FmtCudaLaunch.workspace: the next kernel,
 * whatever it keeps where, finds zeros). */
static void check_workspace(Exec *e, Graph *g, const char **force, const char *what) {
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  CgCudaOptions opt = {.max_units = 1, .force = force, .arch = "sm_90a", .emulation = e->load == he_load};
  FmtCudaModule *m = NULL;
  smelt_status st = cg_cuda_generate(g, k, nk, &opt, &m);
  uint64_t *buf = calloc((size_t)g->nval, sizeof *buf), ws = 0, wsb = 0;
  unsigned char *wsh = NULL;
  if (!st) st = e->load(e, m);
  bool loaded = !st;
  for (int i = 0; !st && i < nk; i++) {
    if (m->kernels[i].workspace > wsb) wsb = m->kernels[i].workspace;
    for (int a = 0; !st && a < k[i].nargs; a++) {
      int v = k[i].args[a];
      if (buf[v]) continue;
      const TensorType *t = &g->val[v].type;
      st = e->alloc(e, ir_type_bytes(t), &buf[v]);
      void *h = h_random(t, -1, 1, (uint64_t)v + 3);
      if (!st) st = e->upload(e, buf[v], h, ir_type_bytes(t));
      free(h);
    }
  }
  if (!st && wsb) {
    wsh = calloc(1, (size_t)wsb);
    st = e->alloc(e, (size_t)wsb, &ws);
    if (!st) st = e->upload(e, ws, wsh, (size_t)wsb);
  }
  for (int i = 0; !st && i < nk; i++) {
    uint64_t args[257];
    int na = k[i].nargs < 256 ? k[i].nargs : 256;
    for (int a = 0; a < na; a++) args[a] = buf[k[i].args[a]];
    if (m->kernels[i].workspace) args[na++] = ws;
    st = e->launch(e, i, args, na);
  }
  if (!st && wsb) st = e->download(e, wsh, ws, (size_t)wsb);
  for (uint64_t b = 0; !st && b < wsb; b++)
    if (wsh[b]) {
      fprintf(stderr, "%s: the kernels left workspace byte %llu of %llu non-zero\n", what, (unsigned long long)b,
              (unsigned long long)wsb);
      check_failures++;
      break;
    }
  CHECK(wsb > 0); /* every case has split-K variants */
  if (st) {
    fprintf(stderr, "%s: %s\n", what, st_message(st));
    st_free(st);
    check_failures++;
  }
  if (loaded) e->unload(e);
  for (int v = 0; v < g->nval; v++)
    if (buf[v]) e->free(e, buf[v]);
  if (ws) e->free(e, ws);
  free(buf), free(wsh);
  fmt_cuda_module_free(m);
  cg_kernels_free(k, nk);
}

static void run_case(Exec *e, const Case *c, HStats *stats, int *ntested) {
  char toks[MAX_TOKENS][CG_VARIANT_LEN];
  int n = case_tokens(c, toks);
  char what[160];
  snprintf(what, sizeof what, "%s %s[%lld x %lld] x [%lld x %lld]%s %s", c->dt, c->batch ? "batched " : "",
           (long long)c->M, (long long)c->K, (long long)(c->tb ? c->N : c->K), (long long)(c->tb ? c->K : c->N),
           c->tb ? "^T" : "", c->epi);
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
    struct {
      bool aligned_opt;
      size_t offset;
    } runs[] = {{false, 0}, {false, 8}, {true, 0}};
    /* args_aligned (no run-time test): the GEMV's fast path without the test (some cases); the
     * tensor-core kernel's epilogue on pairs of columns (every case) */
    for (int r = 0; r < (c->all_runs ? 3 : 2); r++) {
      CgCudaOptions opt = {.args_aligned = runs[r].aligned_opt, .max_units = 1, .force = force, .arch = "sm_90a"};
      Graph *cl = ir_graph_clone(g);
      CHECK(h_check_graph(e, cl, NULL, &opt, runs[r].offset, false, what, stats) == 0);
      ir_graph_destroy(cl);
    }
    check_workspace(e, g, force, what);
  }
  /* both code paths compiled: aligned arguments for sm_90a, run-time tests and fallbacks for sm_80 */
  generate_and_compile(g, force, nk, "sm_90a", true, what);
  generate_and_compile(g, force, nk, "sm_80", false, what);
  printf("%-52s %d variants:", what, n);
  for (int i = 0; i < n; i++) printf(" %s", toks[i]);
  printf("\n");
  *ntested += n;
  free(force);
  ir_graph_destroy(g);
}

/* ---- token syntax ---- */

static void test_tokens(void) {
  CuGemvParams gp;
  char out[CG_VARIANT_LEN];
  CHECK(cu_gemv_parse("gemv:w=4,c=2,u=4,sk=3", &gp));
  CHECK(gp.warps == 4 && gp.cols == 2 && gp.unroll == 4 && gp.splitk == 3);
  cu_gemv_format(&gp, out);
  CHECK(!strcmp(out, "gemv:w=4,c=2,u=4,sk=3"));
  static const char *const bad_gemv[] = {
      "gemv:w=4,c=2,u=4",        "gemv:w=4,c=2,u=4,sk=1,x=1", "gemv:w=0,c=2,u=4,sk=1", "gemv:w=4,c=3,u=4,sk=1",
      "gemv:w=4,c=2,u=9,sk=1",   "gemv:w=4,c=2,u=4,sk=0",     "mma:w=4,c=2,u=4,sk=1",  "gemv:w=4,c=2,u=4,sk=1 ",
      "gemv:w=33,c=2,u=4,sk=1",  "",
  };
  for (size_t i = 0; i < sizeof bad_gemv / sizeof *bad_gemv; i++) {
    bool ok = cu_gemv_parse(bad_gemv[i], &gp);
    if (ok) fprintf(stderr, "accepted bad GEMV token '%s'\n", bad_gemv[i]);
    CHECK(!ok);
  }
  CuMmaParams mp;
  CHECK(cu_mma_parse("mma:bm=128,bn=256,bk=32,wm=64,wn=64,st=4,sk=2", &mp));
  CHECK(mp.BM == 128 && mp.BN == 256 && mp.BK == 32 && mp.WM == 64 && mp.WN == 64 && mp.stages == 4 && mp.splitk == 2);
  cu_mma_format(&mp, out);
  CHECK(!strcmp(out, "mma:bm=128,bn=256,bk=32,wm=64,wn=64,st=4,sk=2"));
  static const char *const bad_mma[] = {
      "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3",       /* no sk */
      "mma:bm=128,bn=128,bk=32,wm=64,wn=24,st=3,sk=1",  /* wn not a multiple of 16 */
      "mma:bm=128,bn=128,bk=24,wm=64,wn=32,st=3,sk=1",  /* bk not a multiple of 16 */
      "mma:bm=96,bn=128,bk=32,wm=64,wn=32,st=3,sk=1",   /* bm not a multiple of wm */
      "mma:bm=128,bn=256,bk=32,wm=128,wn=64,st=3,sk=1", /* 256 accumulators per thread */
      "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=1,sk=1",  /* one stage */
      "mma:bm=256,bn=256,bk=32,wm=16,wn=16,st=3,sk=1",  /* 8192 threads */
      "mma:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=0",
      "gemv:bm=128,bn=128,bk=32,wm=64,wn=32,st=3,sk=1",
  };
  for (size_t i = 0; i < sizeof bad_mma / sizeof *bad_mma; i++) {
    bool ok = cu_mma_parse(bad_mma[i], &mp);
    if (ok) fprintf(stderr, "accepted bad mma token '%s'\n", bad_mma[i]);
    CHECK(!ok);
  }
}

/* The defaults for the shapes of the benchmarks: what the heuristic gives
 * W2 and W4 (a change here is a change of the untuned performance). */
static void test_defaults(void) {
  CuGemm gm;
  memset(&gm, 0, sizeof gm);
  TensorType bt = {.dt = DT_F16, .rank = 2};
  gm.bt = gm.at = gm.yt = &bt; /* only the dtype is read */
  gm.Z = 1;
  gm.tb = true;
  CuMmaParams p;
  gm.M = 2048, gm.N = 11008, gm.K = 4096;
  cu_mma_default_params(&gm, &p);
  CHECK(p.BM == 128 && p.BN == 256 && p.WM == 64 && p.WN == 64 && p.splitk == 1);
  /* W4 prefill: 4 x 2 tiles of 128 x 128 leave most SMs idle: split K */
  gm.M = 512, gm.N = 256, gm.K = 2048;
  cu_mma_default_params(&gm, &p);
  CHECK(p.BM == 128 && p.BN == 128 && p.splitk >= 8);
  char toks[16][CG_VARIANT_LEN];
  int n = cu_mma_candidates(&gm, toks, 16);
  CHECK(n >= 4 && n <= 12);
  char d[CG_VARIANT_LEN];
  cu_mma_format(&p, d);
  CHECK(n > 0 && !strcmp(toks[0], d));
  for (int i = 0; i < n; i++) CHECK(cu_mma_parse(toks[i], &p));
  /* decode: W4's k/v projection (1 MB) is split along K to fill the GPU;
   * W2's down projection (N = 4096 columns, 90 MB) is not */
  CuGemvParams gp;
  gm.M = 1, gm.N = 256, gm.K = 2048;
  cu_gemv_default_params(NULL, &gm, &gp);
  CHECK(gp.splitk > 1);
  gm.N = 4096, gm.K = 11008;
  cu_gemv_default_params(NULL, &gm, &gp);
  CHECK(gp.splitk == 1);
}

int main(void) {
  char dir[] = "/tmp/smelt-gemm-cache-XXXXXX";
  bool dir_ok;
  nvrtc = h_nvrtc_open(dir, &copts, &dir_ok);
  CHECK(dir_ok);
  test_tokens();
  test_defaults();
  static const Case cases[] = {
      /* GEMV, B [N, K]: 3 chunks of K; a long K with a partial last step; f32 (4 lanes a chunk); batched */
      {"f16", 0, 3, 24, 40, true, "bias_silu", {"gemv:w=2,c=8,u=3,sk=3", "gemv:w=1,c=1,u=1,sk=1"}, true},
      {"f16", 0, 1, 1000, 72, true, "gelu_res", {"gemv:w=4,c=2,u=4,sk=5", "gemv:w=3,c=4,u=2,sk=2"}, false},
      {"f32", 0, 2, 40, 24, true, "bias_silu", {"gemv:w=2,c=2,u=2,sk=3"}, false},
      {"f16", 2, 5, 64, 48, true, "", {"gemv:w=4,c=2,u=4,sk=3"}, false},
      /* GEMV in pair mode: a gated pair's halves and product in the epilogue */
      {"f16", 0, 1, 40, 20, true, "glu", {"gemv:w=2,c=4,u=2,sk=3", "gemv:w=1,c=2,u=1,sk=5"}, true},
      {"bf16", 0, 6, 24, 12, true, "glu", {"gemv:w=4,c=8,u=3,sk=2"}, false},
      {"f32", 0, 8, 48, 16, true, "glu", {"gemv:w=2,c=2,u=2,sk=3"}, false},
      /* GEMV in norm mode: rms_norm(x) computed in the loads (a partial last step, split-K) */
      {"f16", 0, 1, 1000, 72, true, "norm", {"gemv:w=4,c=2,u=4,sk=5", "gemv:w=1,c=1,u=1,sk=1"}, true},
      {"bf16", 0, 5, 64, 24, true, "norm", {"gemv:w=2,c=4,u=2,sk=3"}, false},
      {"f32", 0, 3, 40, 40, true, "norm", {"gemv:w=2,c=2,u=2,sk=3"}, false},
      /* GEMV, B [K, N] */
      {"bf16", 0, 8, 200, 40, false, "mul", {"gemv:w=8,c=2,u=3,sk=3"}, true},
      {"f16", 0, 5, 520, 24, false, "bias_silu", {"gemv:w=2,c=4,u=2,sk=5"}, false},
      /* tensor cores: ragged M, N, K against every tile; split-K; batched */
      {"f16", 0, 70, 200, 136, true, "bias_silu", {"mma:bm=64,bn=64,bk=32,wm=32,wn=32,st=3,sk=3"}, true},
      {"bf16", 0, 70, 200, 136, false, "gelu_res", {"mma:bm=32,bn=128,bk=64,wm=32,wn=32,st=2,sk=5"}, true},
      {"f16", 0, 33, 512, 40, true, "", {"mma:bm=64,bn=64,bk=16,wm=16,wn=32,st=5,sk=3"}, true},
      {"f16", 2, 40, 64, 48, false, "mul", {"mma:bm=64,bn=64,bk=32,wm=32,wn=32,st=3,sk=2"}, true},
      /* 10 x 2 tiles of 32 x 32: two raster groups of 8 and 2 tile rows */
      {"bf16", 0, 300, 48, 40, true, "bias_silu", {"mma:bm=32,bn=32,bk=16,wm=16,wn=16,st=2,sk=2"}, true},
  };
  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  if (skip) printf("SKIP: emulated runs: %s\n", skip);
  HStats stats = {0};
  int ntested = 0;
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(skip ? NULL : &e, &cases[i], &stats, &ntested);
  if (!skip) {
    printf("emulated: %d variants, %d values (%d elements) compared with the interpreter, %d failures, %d guard failures, worst %.2f of tolerance\n",
           ntested, stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
    h_exec_close(&e);
  }
  cg_cuda_nvrtc_close(nvrtc);
  rmdir(dir);
  return check_done("test_cuda_gemm_variants");
}
