/* Every operator on the GPU against the reference interpreter.
 *
 * The op suites of op_cases.h (every op of ops.def, f32 with the integer
 * and bool cases, f16, bf16 and f64) and the hand-formed fused groups are
 * generated, compiled with NVRTC for the GPU present, run with guard
 * regions around every buffer, and compared element by element with the
 * interpreter (harness.h gives the tolerances).  Each suite runs twice:
 * with 256-byte-aligned buffers (the 16-byte vector paths) and with every
 * buffer 8 bytes off (the run-time alignment test must pick the scalar
 * fallback), and once more with the alignment guarantee the runtime gives
 * (args_aligned: no fallback code at all).
 *
 * Without a GPU it prints "SKIP: no CUDA device" and exits 77 (skipped, for ctest).
 */
#define _GNU_SOURCE /* RTLD_NODELETE in harness.h */
#include "tests/gpu/harness.h"
#include "tests/unit/check.h"

int main(void) {
  Exec e;
  int rc = h_cuda_test_start(&e, "test_cuda_ops");
  if (rc >= 0) return rc;
  HStats stats = {0};
  DType dts[] = {DT_F32, DT_F16, DT_BF16, DT_F64};
  for (size_t i = 0; i < sizeof dts / sizeof *dts; i++)
    for (int fused = 0; fused < 2; fused++) {
      OpSuite s;
      Graph *g = fused ? oc_fused_suite(dts[i], &s) : oc_suite(dts[i], &s);
      if (!g) {
        fprintf(stderr, "suite %s: %s\n", dt_name(dts[i]), s.msg);
        check_failures++;
        continue;
      }
      struct {
        bool aligned_opt;
        size_t offset;
        const char *label;
      } runs[] = {{false, 0, "aligned buffers"}, {false, 8, "buffers 8 bytes off"}, {true, 0, "args_aligned"}};
      for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        CgCudaOptions opt = {.args_aligned = runs[r].aligned_opt};
        char what[128];
        snprintf(what, sizeof what, "%s suite %s, %s", fused ? "fused" : "op", dt_name(dts[i]), runs[r].label);
        Graph *c = ir_graph_clone(g);
        int before = stats.failures;
        CHECK(h_check_graph(&e, c, &s, &opt, runs[r].offset, false, what, &stats) == 0);
        printf("%-48s %s\n", what, stats.failures == before ? "ok" : "FAILED");
        ir_graph_destroy(c);
      }
      ir_graph_destroy(g);
    }
  printf("%d values (%d elements) compared with the interpreter: %d failures, %d guard failures, worst %.2f of tolerance\n",
         stats.values, stats.elements, stats.failures, stats.guard_failures, stats.worst);
  h_exec_close(&e);
  return check_done("test_cuda_ops");
}
