/* The CUDA quantised decode matmuls (codegen/cuda/qgemv.c, qmma.c)
 * without a GPU: NVRTC compiles them and the CPU emulation
 * (tests/gpu/cuda_emu.hpp) runs them against the reference interpreter,
 * on the cases of tests/gpu/quant_cases.h (gpu/test_cuda_quant.c runs the
 * same on the GPU).  Checked:
 *   - every matmul kernel's variant is qmma's (the heuristic) for the
 *     cases it takes (worked out by hand: takes_qmma), qgemv's for the
 *     others, for sm_90a and for portable builds; qgemv is a candidate
 *     for all;
 *   - NVRTC compiles the module for sm_90a and sm_80 (fp8 takes the
 *     cvt.rn.f16x2 path there, the integer decoders elsewhere);
 *   - emulated, every stored element is the interpreter's within the
 *     harness's tolerance by dtype, guard bytes intact, with buffers
 *     aligned and 8 bytes off (A's element loads);
 *   - tuning candidate lists that start with the default, every token
 *     parsing back (qgemv:w=..,c=..,u=.., qmma:w=..,s=..), each forced on
 *     four cases (check_forced);
 *   - fp8 with zero points is left to the simple kernel (neither family's);
 *   - NVRTC also compiles the kernels with SMELT_CUDA_PREFETCH=all (the
 *     whole weight slice's bulk L2 prefetch before the launch wait);
 *   - gated pairs (silu(h[:, 0::2]) * h[:, 1::2]) in the matmul's
 *     epilogue, one kernel a case, with each family's pair mode
 *     (check_pairs);
 *   - qgemv's half mode (h=1): NVRTC for sm_90a and sm_80, then emulated
 *     on every f16 case it takes and on large x (check_half).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codegen/cuda/cg_cuda.h"
#include "codegen/cuda/cu_families.h"
#include "codegen/lower.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/gpu/quant_cases.h"
#include "tests/unit/check.h"

/* A qgemv or qmma token parses back to itself. */
static void check_token(const char *tok) {
  char back[CG_VARIANT_LEN];
  int w, c, u, h = 0, per = 1, sk = 1;
  if (!strncmp(tok, "qgemv:", 6)) {
    CHECK(sscanf(tok, "qgemv:w=%d,c=%d,u=%d", &w, &c, &u) == 3);
    const char *hs = strstr(tok, ",h="), *ps = strstr(tok, ",p="), *ss = strstr(tok, ",sk=");
    if (hs) CHECK(sscanf(hs, ",h=%d", &h) == 1);
    if (ps) CHECK(sscanf(ps, ",p=%d", &per) == 1);
    if (ss) CHECK(sscanf(ss, ",sk=%d", &sk) == 1);
    char pt[16] = "", skt[16] = "";
    if (per > 1) snprintf(pt, sizeof pt, ",p=%d", per);
    if (sk > 1) snprintf(skt, sizeof skt, ",sk=%d", sk);
    snprintf(back, sizeof back, "qgemv:w=%d,c=%d,u=%d%s%s%s", w, c, u, h == 1 ? ",h=1" : "", pt, skt);
  } else {
    CHECK(sscanf(tok, "qmma:w=%d,s=%d", &w, &u) == 2);
    snprintf(back, sizeof back, "qmma:w=%d,s=%d", w, u);
  }
  CHECK(strcmp(back, tok) == 0);
}

/* Every matmul kernel is qmma's (its heuristic) when the case is, else
 * qgemv's, for arch; the f16 cases qmma takes also list qgemv candidates. */
static void check_variants(Graph *g, const char *arch) {
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  int nmm = 0;
  for (int i = 0; i < nk; i++) {
    if (!is_matmul_kernel(g, &k[i])) continue;
    int ci = -1;
    CHECK(sscanf(g->val[g->node[g->groups[k[i].group].anchor].out[0]].name, "c%d/", &ci) == 1 && ci >= 0 && ci < NCASES);
    if (ci < 0 || ci >= NCASES) continue;
    nmm++;
    const char *want = takes_qmma(&cases[ci]) ? "qmma:" : "qgemv:";
    char got[32][CG_VARIANT_LEN];
    int n = cg_cuda_variants(g, &k[i], arch, got, 32), nq = 0;
    if (n < 1 || strncmp(got[0], want, strlen(want)) != 0) {
      fprintf(stderr, "%s (case %d, %s): heuristic %s, not %s\n", k[i].name, ci, arch ? arch : "portable",
              n ? got[0] : "(none)", want);
      check_failures++;
    }
    for (int j = 0; j < n; j++)
      if (!strncmp(got[j], "qgemv:", 6) || !strncmp(got[j], "qmma:", 5)) check_token(got[j]), nq += !strncmp(got[j], "qgemv:", 6);
    CHECK(nq > 0); /* qgemv computes every case */
  }
  CHECK(nmm == NCASES);
  cg_kernels_free(k, nk);
}

/* fp8 weights with zero points are not qgemv's (qg_eligible): the
 * heuristic picks another kernel. */
static void check_not_taken(void) {
  static const QCase c = {DT_F8E4M3, DT_F32, DT_F32, 1, 128, 40, 32, false, false, DT_F32};
  Graph *g = ir_graph_create("qgemv-not");
  g->file = "test_cuda_qgemv";
  add_case(g, 0, &c);
  CHECK_OK(ir_verify(g));
  PassCtx ctx = {.target = "cuda", .arch = "sm_90a"};
  CHECK_OK(pass_run_pipeline(g, &ctx, "fuse", NULL, NULL));
  pass_ctx_free(&ctx);
  Kernel *k = NULL;
  int nk = 0, nmm = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  for (int i = 0; i < nk; i++) {
    if (!is_matmul_kernel(g, &k[i])) continue;
    nmm++;
    char got[32][CG_VARIANT_LEN];
    int n = cg_cuda_variants(g, &k[i], "sm_90a", got, 32);
    for (int j = 0; j < n; j++)
      if (!strncmp(got[j], "qgemv:", 6) || !strncmp(got[j], "qmma:", 5)) {
        fprintf(stderr, "%s: fp8 with zero points has the candidate %s\n", k[i].name, got[j]);
        check_failures++;
      }
  }
  CHECK(nmm == 1);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
}

static bool same_token(const char *forced, const char *used, const char *arch) {
  (void)arch;
  return strcmp(forced, used) == 0;
}

/* A forced h=1 token ran as itself, or as the float widening where half
 * mode does not apply. */
static bool same_or_float(const char *forced, const char *used, const char *arch) {
  (void)arch;
  size_t n = strlen(used);
  return strcmp(forced, used) == 0 || (strncmp(forced, used, n) == 0 && strcmp(forced + n, ",h=1") == 0);
}

int main(void) {
  char dir[] = "/tmp/smelt-qgemv-cache-XXXXXX";
  bool dir_ok = false;
  CgCudaCompileOptions copts = {0};
  CgNvrtc *nvrtc = h_nvrtc_open(dir, &copts, &dir_ok);
  Graph *g = cases_graph(NULL, 0);
  check_variants(g, "sm_90a");
  check_variants(g, NULL);
  check_not_taken();

  /* NVRTC: sm_90a with aligned arguments, sm_80 with the run-time tests */
  Kernel *k = NULL;
  int nk = 0;
  CHECK_OK(cg_lower(g, &k, &nk));
  const char **force = calloc((size_t)nk + 1, sizeof *force);
  const char *archs[] = {"sm_90a", "sm_80"};
  for (int a = 0; a < 2; a++) {
    CgCudaOptions opt = {.args_aligned = a == 0, .max_units = 2, .force = force, .arch = archs[a]};
    check_failures += h_generate_and_compile(nvrtc, &copts, g, k, nk, &opt, "qgemv cases", same_token);
  }
  /* the whole-slice L2 prefetch before the programmatic-launch wait
   * (SMELT_CUDA_PREFETCH=all: cp.async.bulk.prefetch.L2 on sm_90a) */
  setenv("SMELT_CUDA_PREFETCH", "all", 1);
  {
    CgCudaOptions opt = {.args_aligned = true, .max_units = 2, .force = force, .arch = "sm_90a"};
    check_failures += h_generate_and_compile(nvrtc, &copts, g, k, nk, &opt, "qgemv cases, whole-slice prefetch", same_token);
  }
  unsetenv("SMELT_CUDA_PREFETCH");
  /* half mode through NVRTC (its f16x2 asm; e4m3 pairs by cvt on sm_90a,
   * by the decoders on sm_80), every matmul forced to an h=1 token: the
   * cases it does not take run the float widening (same_or_float) */
  for (int a = 0; a < 2; a++) {
    const char **hf = calloc((size_t)nk + 1, sizeof *hf);
    for (int i = 0; i < nk; i++)
      if (is_matmul_kernel(g, &k[i])) hf[i] = "qgemv:w=4,c=2,u=4,h=1";
    CgCudaOptions opt = {.args_aligned = a == 0, .max_units = 2, .force = hf, .arch = archs[a]};
    check_failures += h_generate_and_compile(nvrtc, &copts, g, k, nk, &opt, "qgemv cases, half mode", same_or_float);
    free(hf);
  }
  /* other parameters: the candidates of the first kernel of each family */
  char toks[2][16][CG_VARIANT_LEN];
  int ntok[2];
  family_tokens(g, "sm_90a", toks, ntok);
  int nq[2] = {0, 0};
  for (int fam = 0; fam < 2; fam++)
    for (int j = 0; j < ntok[fam]; j++) nq[fam] += strncmp(toks[fam][j], fam ? "qmma:" : "qgemv:", fam ? 5 : 6) == 0;
  CHECK(nq[0] >= 4 && nq[1] >= 4);

  Exec e;
  const char *skip = NULL;
  CHECK_OK(h_exec_emulated(&e, &skip));
  HStats stats = {0};
  if (skip) {
    printf("SKIP: emulated runs: %s\n", skip);
  } else {
    for (size_t off = 0; off <= 8; off += 8) {
      Graph *c = ir_graph_clone(g);
      CgCudaOptions opt = {.max_units = 1, .arch = "sm_90a"};
      char what[64];
      snprintf(what, sizeof what, "qgemv cases, offset %zu", off);
      CHECK(h_check_graph(&e, c, NULL, &opt, off, false, what, &stats) == 0);
      ir_graph_destroy(c);
    }
    /* each qgemv and qmma candidate but the defaults (run above) forced on four cases */
    check_all_forced(&e, "sm_90a", toks, ntok, &stats);
    /* gated pairs in the epilogue (pair mode of both families) */
    check_pairs(&e, "sm_90a", &stats);
    check_pairs_split(&e, "sm_90a", &stats);
    /* rms_norm prologues (norm mode of qgemv) */
    check_norms(&e, "sm_90a", &stats);
    /* qgemv's half mode on every f16 case it takes, and on large x */
    check_half(&e, "sm_90a", &stats);
    h_exec_close(&e);
    printf("emulated qgemv: %d values (%d elements) compared with the interpreter, %d failures, %d guard failures, "
           "worst %.2f of tolerance\n", stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
  }
  free(force);
  cg_kernels_free(k, nk);
  ir_graph_destroy(g);
  if (nvrtc) cg_cuda_nvrtc_close(nvrtc);
  if (dir_ok) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  return check_done("test_cuda_qgemv");
}
