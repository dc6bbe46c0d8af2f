/* Every example model end to end on the GPU.
 *
 * Each example model (examples/NAME.yaml) is loaded (in its own dtype and with --dtype f16),
 * optimised by the default pipeline (fusion included), lowered, generated,
 * compiled with NVRTC for the GPU present and run kernel by kernel with
 * guard regions; every value a kernel stores, graph outputs included, is
 * compared with the interpreter run on the same optimised graph, as whole
 * tensors (harness.h: largest error against the largest magnitude, cosine
 * similarity), since f16 rounding differences grow through the layers.
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include <dirent.h>

#include "frontend/frontend.h"
#include "passes/passes.h"
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

int main(void) {
  Exec e;
  const char *skip = NULL;
  smelt_status st = h_exec_cuda(&e, &skip);
  if (st) {
    fprintf(stderr, "test_cuda_examples: %s\n", st_message(st));
    st_free(st);
    return 1;
  }
  if (skip) {
    printf("SKIP: %s\n", skip);
    return CHECK_SKIPPED;
  }
  HStats stats = {0};
  int models = 0;
  /* the examples, and the models of tests/unit/models (fusion cases the
   * CUDA pipeline makes: layout epilogues, sibling kernels) */
  const char *dirs[] = {"examples", "tests/unit/models"};
  for (int di = 0; di < 2; di++) {
    DIR *d = opendir(dirs[di]);
    CHECK(d != NULL);
    struct dirent *ent;
    while (d && (ent = readdir(d)) != NULL) {
      size_t len = strlen(ent->d_name);
      if (len < 6 || strcmp(ent->d_name + len - 5, ".yaml") != 0) continue;
      char path[512];
      snprintf(path, sizeof path, "%s/%s", dirs[di], ent->d_name);
      for (int h = 0; h < 2; h++) {
        FeOptions fo = {.dtype = h ? DT_F16 : DT_INVALID};
        Graph *g = NULL;
        st = fe_load_yaml(path, &fo, &g);
        PassCtx ctx = {.target = "cuda"}; /* the CUDA pipeline: merged matmuls, [N, K] weights, prologues */
        if (!st) st = pass_run_pipeline(g, &ctx, NULL, NULL, NULL);
        pass_ctx_free(&ctx);
        char what[600];
        snprintf(what, sizeof what, "%s%s", path, h ? " --dtype f16" : "");
        if (st) {
          fprintf(stderr, "%s: %s\n", what, st_message(st));
          st_free(st);
          check_failures++;
          ir_graph_destroy(g);
          continue;
        }
        int before = stats.failures;
        CgCudaOptions opt = {0};
        CHECK(h_check_graph(&e, g, NULL, &opt, 0, true, what, &stats) == 0);
        printf("%-48s %d groups  %s\n", what, g->ngroups, stats.failures == before ? "ok" : "FAILED");
        models++;
        ir_graph_destroy(g);
      }
    }
    if (d) closedir(d);
  }
  CHECK(models >= 10);
  printf("%d model runs, %d values compared: %d failures, %d guard failures\n", models, stats.values, stats.failures,
         stats.guard_failures);
  h_exec_close(&e);
  return check_done("test_cuda_examples");
}
