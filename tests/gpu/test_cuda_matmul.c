/* The matmul kernels on the GPU against the reference interpreter.
 *
 * Matmuls with fused epilogues (bias + silu, gelu + residual, relu * a
 * tensor) are written as YAML models, fused by the default pipeline,
 * generated, compiled with NVRTC for the GPU present and run with guard
 * regions around every buffer (tests/gpu/harness.h), then compared element
 * by element with the interpreter (f16 4e-3, bf16 3e-2 of 1 + |ref|).
 * Shapes cover every variant: M in {1, 2, 7, 8, 9, 64, 129, 1000} (GEMV up
 * to 8, tensor cores above), K and N multiples of 8 (the mma and GEMV
 * paths, ragged against every tile) and odd (the simple kernel), f16 and
 * bf16, B as [K, N] and as [N, K] (transpose_b), batched with broadcast
 * batch dims.  Some cases run again with every buffer 8 bytes off (the
 * plain-copy fallback) and with args_aligned (no run-time test).
 *
 * Without a GPU it prints "SKIP: no CUDA device" and passes.
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

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
  FeOptions fo = {0};
  Graph *g = NULL;
  smelt_status st = fe_load_yaml(path, &fo, &g);
  unlink(path);
  if (!st) {
    PassCtx ctx = {0};
    st = pass_run_pipeline(g, &ctx, NULL, NULL, NULL);
    pass_ctx_free(&ctx);
  }
  if (st) {
    fprintf(stderr, "%s: %s\n", path, st_message(st));
    st_free(st);
    ir_graph_destroy(g);
    return NULL;
  }
  return g;
}

int main(void) {
  Exec e;
  const char *skip = NULL;
  smelt_status st = h_exec_cuda(&e, &skip);
  if (st) {
    fprintf(stderr, "test_cuda_matmul: %s\n", st_message(st));
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
      CHECK(h_check_graph(&e, cl, NULL, &opt, runs[r].offset, false, what, &stats) == 0);
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
  h_exec_close(&e);
  return check_done("test_cuda_matmul");
}
